"""The command line that puts a container's process into its pod: the pod's network namespace (entered
with nsenter), then a fresh mount and UTS namespace (unshare) where a short bash script sets the
hostname, bind-mounts the volumes at their mountPaths and execs the container's command.  No process is
forked on the way, so the pid the kubelet gets is the container's own."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from .volumes import Mount

# What stands for the container image here: the project checkout with its venv (the console scripts pods
# run, and the sources an editable install points at).  A volume mounted over one of its parents (an
# emptyDir at /tmp, with the checkout under /tmp) would hide the "image"; in a real container the image's
# files never sit under a volume, so these paths are bound back on top of such a volume.
IMAGE_PATHS: tuple[str, ...] = (str(Path(__file__).resolve().parents[3]),)

HOSTS_HEADER = """# Kubernetes-managed hosts file (process kubelet).
127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
"""


def ordered(mounts: list[Mount]) -> list[Mount]:
    """Parents before children, as container runtimes mount them."""
    return sorted(mounts, key=lambda m: len(Path(m.target).parts))


def launch_argv(
    netns_path: str | None,
    hostname: str,
    mounts: list[Mount],
    workdir: str,
    command: list[str],
    image_paths: tuple[str, ...] = IMAGE_PATHS,
) -> list[str]:
    """Every source is opened before anything is mounted and mounted from /proc/self/fd/N: a mount at
    /work must not hide a later source under /work (the harness's own state dir, say)."""
    mounts = ordered(mounts)
    lines = ["set -e"]
    if netns_path:
        lines.append(f"echo {shlex.quote(hostname)} > /proc/sys/kernel/hostname")
    lines += [f"exec {10 + i}<{shlex.quote(m.source)}" for i, m in enumerate(mounts)]
    shadowed = [p for p in image_paths if any(_within(p, m.target) for m in mounts)]
    first_kept = 10 + len(mounts)
    lines += [f"exec {first_kept + i}<{shlex.quote(p)}" for i, p in enumerate(shadowed)]
    for i, m in enumerate(mounts):
        target = shlex.quote(m.target)
        make = f"mkdir -p {target}" if os.path.isdir(m.source) else f"[ -e {target} ] || touch {target}"
        lines += [make, f"mount --no-canonicalize --bind /proc/self/fd/{10 + i} {target}"]
        if m.read_only:
            lines.append(f"mount -o remount,bind,ro {target}")
    for i, p in enumerate(shadowed):
        path = shlex.quote(p)
        lines += [f"mkdir -p {path}", f"mount --no-canonicalize --bind /proc/self/fd/{first_kept + i} {path}"]
    lines += [f"exec {10 + i}<&-" for i in range(len(mounts) + len(shadowed))]
    lines += [f"mkdir -p {shlex.quote(workdir)}", f"cd {shlex.quote(workdir)}", 'exec "$@"']
    script = "\n".join(lines)
    unshare = ["unshare", "--mount", "--propagation", "private", *(["--uts"] if netns_path else []), "--"]
    enter = ["nsenter", f"--net={netns_path}", "--"] if netns_path else []
    return [*enter, *unshare, "bash", "-c", script, "bash", *command]


def _within(path: str, parent: str) -> bool:
    return Path(path) == Path(parent) or Path(parent) in Path(path).parents


def ensure_mountpoints(mounts: list[Mount], record: Path) -> None:
    """A bind mount needs something at its target.  Targets on the host's own filesystem (not inside
    another of the container's mounts) are created here, empty, and listed in `record` so `down` removes
    them again; the others are made inside the namespace by the launch script."""
    created = []
    targets = [Path(m.target) for m in mounts]
    for m in mounts:
        target = Path(m.target)
        if target.exists() or any(t in target.parents for t in targets):
            continue
        missing = [p for p in [target, *target.parents] if not p.exists()]
        if os.path.isdir(m.source):
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
        created += [str(p) for p in reversed(missing)]
    if created:
        with record.open("a") as out:
            out.writelines(f"{p}\n" for p in created)


def remove_mountpoints(record: Path) -> None:
    """Undo ensure_mountpoints, deepest first, leaving anything that is no longer empty."""
    if not record.exists():
        return
    for line in sorted(set(record.read_text().splitlines()), key=len, reverse=True):
        p = Path(line)
        try:
            if p.is_dir():
                p.rmdir()
            elif p.is_file() and p.stat().st_size == 0:
                p.unlink()
        except OSError:
            pass
    record.unlink()


def hosts_file(
    pod_ip: str, hostname: str, aliases: list[dict[str, object]], services: list[tuple[str, str]]
) -> str:
    """/etc/hosts for a pod: itself, its spec.hostAliases, then every Service's names -> ClusterIP.  This
    stands in for cluster DNS, which the harness does not run."""
    lines = [HOSTS_HEADER.rstrip("\n"), f"{pod_ip}\t{hostname}"]
    lines += [f"{a['ip']}\t{' '.join(a.get('hostnames', []))}" for a in aliases]  # type: ignore[arg-type]
    lines += [f"{ip}\t{names}" for ip, names in services]
    return "\n".join(lines) + "\n"


def service_names(name: str, namespace: str, pod_namespace: str) -> str:
    names = [f"{name}.{namespace}.svc.cluster.local", f"{name}.{namespace}.svc", f"{name}.{namespace}"]
    return " ".join(names + ([name] if namespace == pod_namespace else []))
