"""One container of a pod: its process (started, watched, stopped gracefully), its restarts with
crash-loop back-off, and its startup/liveness/readiness probes, each on its own thread."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..procs import start_ticks
from .api import now
from .podenv import ConfigError
from .probes import Target, run_handler
from .status import ContainerView, Termination

log = logging.getLogger(__name__)
Obj = dict[str, Any]
BACKOFF_START, BACKOFF_MAX = 10.0, 300.0
BACKOFF_RESET_AFTER = 600.0  # a container that ran this long starts its back-off afresh


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    target: Callable[[int], Target]  # pid -> how probes reach the container


class PodHooks(Protocol):
    """What a container needs from its pod: how to launch it, where to log, whom to tell."""

    log_dir: Path
    procs_dir: Path
    grace: float  # the pod's terminationGracePeriodSeconds

    def launch(self, spec: Obj) -> Launch: ...

    def changed(self) -> None: ...

    def event(self, reason: str, message: str, warning: bool = False) -> None: ...


def backoff_delay(restarts_in_a_row: int) -> float:
    """The kubelet's crash-loop back-off: the first restart is at once, then 10 s doubling up to 5 min."""
    if restarts_in_a_row == 0:
        return 0.0
    return min(BACKOFF_START * 2 ** (restarts_in_a_row - 1), BACKOFF_MAX)


class Container:
    def __init__(self, spec: Obj, hooks: PodHooks) -> None:
        self.spec, self.hooks, self.name = spec, hooks, spec["name"]
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.target: Target | None = None
        self.restart_count = 0
        self.crashes_in_a_row = 0
        self.generation = 0
        self.container_id = ""
        self.state = "waiting"
        self.waiting_reason, self.waiting_message = "ContainerCreating", ""
        self.started_at: str | None = None
        self.started_mono = 0.0
        self.termination: Termination | None = None
        self.last_termination: Termination | None = None
        self.ready = self.started = False
        self.next_start = 0.0  # monotonic time before which a restart waits (back-off)
        self.restart_pending = False
        self.exit_pending = False

    # --- process -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start (or restart) the process; a configuration error leaves the container waiting."""
        try:
            launch = self.hooks.launch(self.spec)
        except ConfigError as exc:
            self._wait("CreateContainerConfigError", str(exc))
            self.hooks.event("Failed", f"Error: {exc}", warning=True)
            return
        log_file = self.hooks.log_dir / self.name / f"{self.restart_count}.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "ab") as out:
            proc = subprocess.Popen(
                launch.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=launch.env,
                start_new_session=True,
                close_fds=True,
            )
        # for `down`, should this kubelet die without ending its pods: pid and start time, as procs.Daemon
        (self.hooks.procs_dir / str(proc.pid)).write_text(str(start_ticks(proc.pid) or 0))
        with self.lock:
            if self.state == "terminated" and self.termination:
                self.last_termination = self.termination
            self.restart_pending = False
            self.proc, self.target = proc, launch.target(proc.pid)
            self.generation += 1
            self.container_id = f"process://{uuid.uuid4().hex}"
            self.state, self.termination = "running", None
            self.started_at, self.started_mono = now(), time.monotonic()
            self.ready = False
            self.started = "startupProbe" not in self.spec
        self.hooks.event("Started", f"Started container {self.name}")
        post_start = self.spec.get("lifecycle", {}).get("postStart")
        if post_start:
            ok, message = run_handler(post_start, self.target, timeout=30)
            if not ok:
                self.hooks.event("FailedPostStartHook", message, warning=True)
                self.stop(grace=2)
                return
        self._start_probes()
        self.hooks.changed()

    def _wait(self, reason: str, message: str) -> None:
        with self.lock:
            if self.state == "terminated" and self.termination:
                self.last_termination, self.termination = self.termination, None
            self.state, self.waiting_reason, self.waiting_message = "waiting", reason, message
            self.next_start = time.monotonic() + BACKOFF_START

    def take_exit(self) -> Termination | None:
        """The container's latest exit, once: whoever stopped it (a probe, its own end), the pod decides
        on the restart."""
        self.poll()
        with self.lock:
            if self.exit_pending:
                self.exit_pending = False
                return self.termination
        return None

    def poll(self) -> bool:
        """Notice the process's exit; True when it has just exited."""
        proc = self.proc
        if proc is None or self.state != "running" or proc.poll() is None:
            return False
        code = proc.returncode
        sig = -code if code < 0 else None
        exit_code = 128 + sig if sig else code
        with self.lock:
            self.termination = Termination(
                exit_code=exit_code,
                reason="Completed" if exit_code == 0 else "Error",
                container_id=self.container_id,
                signal=sig,
                started_at=self.started_at or now(),
                finished_at=now(),
            )
            self.state, self.ready, self.exit_pending = "terminated", False, True
            ran = time.monotonic() - self.started_mono
            self.crashes_in_a_row = 0 if ran > BACKOFF_RESET_AFTER else self.crashes_in_a_row
        (self.hooks.procs_dir / str(proc.pid)).unlink(missing_ok=True)
        return True

    def stop(self, grace: float) -> None:
        """preStop hook, SIGTERM, up to `grace` seconds, SIGKILL: the whole process group."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            self.poll()
            return
        deadline = time.monotonic() + grace
        pre_stop = self.spec.get("lifecycle", {}).get("preStop")
        if pre_stop and self.target:
            run_handler(pre_stop, self.target, timeout=max(grace, 1))
        _signal(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            _signal(proc.pid, signal.SIGKILL)
            proc.wait()
        _signal(proc.pid, signal.SIGKILL)  # whatever the main process left behind in its group
        self.poll()

    def schedule_restart(self) -> None:
        """After an exit that the restart policy restarts: wait out the back-off in CrashLoopBackOff."""
        delay = backoff_delay(self.crashes_in_a_row)
        self.crashes_in_a_row += 1
        self.restart_count += 1
        with self.lock:
            self.next_start = time.monotonic() + delay
            self.restart_pending = True
            if delay:
                self.last_termination, self.termination = self.termination, None
                self.state, self.waiting_reason = "waiting", "CrashLoopBackOff"
                self.waiting_message = f"back-off {delay:.0f}s restarting failed container={self.name}"
                self.hooks.event("BackOff", "Back-off restarting failed container", warning=True)

    def due(self) -> bool:
        """Whether the container should be (re)started now."""
        return (self.state == "waiting" or self.restart_pending) and time.monotonic() >= self.next_start

    def view(self) -> ContainerView:
        with self.lock:
            return ContainerView(
                name=self.name,
                image=self.spec.get("image", ""),
                container_id=self.container_id,
                state=self.state,
                restart_count=self.restart_count,
                ready=self.ready,
                started=self.started,
                waiting_reason=self.waiting_reason,
                waiting_message=self.waiting_message or None,
                started_at=self.started_at,
                termination=self.termination,
                last_termination=self.last_termination,
            )

    # --- probes --------------------------------------------------------------------------------

    def _start_probes(self) -> None:
        generation = self.generation
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            if kind in self.spec:
                threading.Thread(
                    target=self._probe_loop,
                    args=(kind, self.spec[kind], generation),
                    name=f"{kind}-{self.name}",
                    daemon=True,
                ).start()
        if "readinessProbe" not in self.spec:
            threading.Thread(target=self._ready_when_started, args=(generation,), daemon=True).start()

    def _current(self, generation: int) -> bool:
        return self.generation == generation and self.state == "running"

    def _ready_when_started(self, generation: int) -> None:
        while self._current(generation) and not self.started:
            time.sleep(0.2)
        if self._current(generation):
            self.ready = True
            self.hooks.changed()

    def _probe_loop(self, kind: str, probe: Obj, generation: int) -> None:
        if kind != "startupProbe":
            while self._current(generation) and not self.started:
                time.sleep(0.2)
        time.sleep(float(probe.get("initialDelaySeconds", 0)))
        period, timeout = float(probe.get("periodSeconds", 10)), float(probe.get("timeoutSeconds", 1))
        need_ok, need_fail = int(probe.get("successThreshold", 1)), int(probe.get("failureThreshold", 3))
        successes = failures = 0
        while self._current(generation) and self.target:
            began = time.monotonic()
            ok, message = run_handler(probe, self.target, timeout)
            if not self._current(generation):
                return
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            if not ok:
                self.hooks.event(
                    "Unhealthy", f"{kind[:-5].capitalize()} probe failed: {message}", warning=True
                )
            if kind == "readinessProbe":
                if ok != self.ready and (successes >= need_ok if ok else failures >= need_fail):
                    self.ready = ok
                    self.hooks.changed()
            elif kind == "startupProbe" and ok:
                self.started = True
                self.hooks.changed()
                return
            elif kind != "readinessProbe" and failures >= need_fail:
                self.hooks.event(
                    "Killing", f"Container {self.name} failed {kind[:-5].lower()} probe, will be restarted"
                )
                grace = probe.get("terminationGracePeriodSeconds")
                self.stop(float(grace) if grace is not None else self.hooks.grace)
                self.hooks.changed()
                return
            time.sleep(max(period - (time.monotonic() - began), 0))


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
