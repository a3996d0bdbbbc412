"""The cgroups a real node uses: one subtree per node under this process's own cgroup, in every
mounted hierarchy, made before its kubelet starts and removed, with whatever still runs in it, at
teardown.  The machine's cgroup mounts are never changed.

On these machines (cgroup v1, hybrid) the process's memory cgroup is /process_api/<id> and the others
are at /; a node's root is the same path in every hierarchy (the kubelet's cgroupfs driver takes one
`cgroupRoot` string), so it lies under the process's own cgroup everywhere."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

CGROUP_MOUNT = Path("/sys/fs/cgroup")


def own_path(proc_cgroup: str) -> str:
    """The deepest of this process's cgroup paths (from /proc/self/cgroup): every node root goes below
    it, so it is below the process's own cgroup in each hierarchy."""
    paths = [line.split(":", 2)[2] for line in proc_cgroup.splitlines() if line.count(":") >= 2]
    return max(paths, key=lambda p: p.count("/") if p != "/" else 0, default="/")


def node_root(node: str, proc_cgroup: str | None = None) -> str:
    text = proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text()
    return f"{own_path(text).rstrip('/')}/kubeinfer-{node}"


def hierarchies() -> list[Path]:
    """The mounted hierarchies (v1 controllers, name=systemd, the v2 unified one)."""
    return sorted(p for p in CGROUP_MOUNT.iterdir() if (p / "cgroup.procs").exists())


def create(root: str) -> list[str]:
    """mkdir -p the node's root in every hierarchy; returns the directories made, parents first.  A new
    cpuset level starts with its parent's cpus and mems (a v1 cpuset with none refuses tasks)."""
    made = []
    for h in hierarchies():
        path = h
        for part in root.strip("/").split("/"):
            path = path / part
            if not path.exists():
                path.mkdir()
                made.append(str(path))
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    if (path / knob).exists():
                        (path / knob).write_text((path.parent / knob).read_text())
    return made


def remove(root: str) -> None:
    """Kill every process in the node's subtree in every hierarchy and remove the subtree bottom-up."""
    for h in hierarchies():
        top = h / root.strip("/")
        if not top.exists():
            continue
        for _ in range(50):  # processes may be forking while they are being killed
            pids = [int(p) for d in _walk(top) for p in _read(d / "cgroup.procs").split()]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if not pids:
                break
            time.sleep(0.1)
        for d in reversed(_walk(top)):
            _rmdir(d)


def remove_made(made: list[str]) -> None:
    """The directories `create` made above the node roots, deepest first; once every node's subtree is
    gone (nodes share them)."""
    for d in sorted(set(made), key=lambda p: p.count("/"), reverse=True):
        _rmdir(Path(d))


def _rmdir(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError, OSError):
        path.rmdir()  # OSError: not empty (still in use) -- left, and reported by the leak check


def _walk(top: Path) -> list[Path]:
    """top and every cgroup below it, parents before children."""
    out = [top]
    for dirpath, dirnames, _ in os.walk(top):
        out.extend(Path(dirpath) / d for d in sorted(dirnames))
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
