"""Starting daemons that outlive the command that started them, and stopping exactly those again.

A daemon is started through `sh -c 'setsid CMD & echo $!'`: it leads its own session and process group
(so it and any children are stopped together), its parent is init (so nothing here has to reap it), and
its pid is known.  A recorded pid is only signalled while /proc still shows the same program started at
the same time, so a recycled pid is never hit."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Daemon:
    name: str
    pid: int
    start_ticks: int  # /proc/<pid>/stat field 22: tells this process from a later one with the same pid

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now; the kernel picks it, so parallel clusters never collide on it."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def spawn(
    name: str, argv: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Daemon:
    log.parent.mkdir(parents=True, exist_ok=True)
    script = 'setsid "$@" </dev/null >>"$DAEMON_LOG" 2>&1 & echo $!'
    full_env = {**(env if env is not None else os.environ), "DAEMON_LOG": str(log)}
    out = subprocess.run(
        ["sh", "-c", script, "sh", *argv], env=full_env, cwd=cwd, capture_output=True, text=True, check=True
    )
    pid = int(out.stdout.strip())
    ticks = start_ticks(pid)
    if ticks is None:
        raise RuntimeError(f"{name} exited at once; see {log}:\n{tail(log)}")
    return Daemon(name=name, pid=pid, start_ticks=ticks)


def alive(daemon: Daemon) -> bool:
    return start_ticks(daemon.pid) == daemon.start_ticks and not _zombie(daemon.pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def stop(daemons: list[Daemon], grace: float = 10.0) -> None:
    """SIGTERM each daemon's process group, then SIGKILL whatever is still there after `grace` seconds."""
    live = [d for d in daemons if alive(d)]
    for d in live:
        _signal_group(d.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(d) for d in live):
        time.sleep(0.05)
    for d in live:
        _signal_group(d.pid, signal.SIGKILL)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def wait_until(what: str, check: Callable[[], bool], timeout: float, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:  # a component that is still starting refuses connections; that is the wait
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
