"""A library installed by `fused_ops --install` loads where the torch extensions cache cannot be written
(the runtime image's read-only root), and one built from another source is not trusted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = (
    "import logging; logging.basicConfig(level=logging.INFO)\n"
    "from kubeinfer_runtime.models import fused_ops\n"
    "print('kernels on:', fused_ops.use_cpu_kernels(True))"
)


# A read-only bind mount of the cache in a private mount namespace: a mode bit would not stop root.
READ_ONLY = 'd=$1; shift; mount --bind "$d" "$d" && mount -o remount,bind,ro "$d" && exec "$@"'


def _python(
    args: list[str], env: dict[str, str], read_only: Path | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, *args]
    if read_only is not None:
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            READ_ONLY,
            "sh",
            str(read_only),
            *argv,
        ]
    return subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("kernels")
    built = _python(["-m", "kubeinfer_runtime.models.fused_ops", "--install", str(target)], {})
    assert built.returncode == 0, built.stderr
    return target / "kubeinfer_cpu_ops.so"


def test_an_installed_library_loads_with_a_read_only_extensions_cache(
    installed: Path, tmp_path: Path
) -> None:
    env = {"KUBEINFER_CPU_KERNELS_LIB": str(installed), "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    run = _python(["-c", CHECK], env, read_only=tmp_path)
    assert "kernels on: True" in run.stdout, run.stderr
    assert "CPU kernels on (" in run.stderr and str(installed) in run.stderr


def test_a_library_with_a_foreign_build_stamp_is_not_loaded(installed: Path, tmp_path: Path) -> None:
    copy = tmp_path / "kubeinfer_cpu_ops.so"
    copy.write_bytes(installed.read_bytes())
    copy.with_name(copy.name + ".sha256").write_text("0" * 64 + "\n")
    # With the build cache read-only the fallback build fails too: the engine says both and runs eager.
    cache = tmp_path / "torch_extensions"
    cache.mkdir()
    env = {"KUBEINFER_CPU_KERNELS_LIB": str(copy), "TORCH_EXTENSIONS_DIR": str(cache)}
    run = _python(["-c", CHECK], env, read_only=cache)
    assert "built from another source or torch" in run.stderr
    assert "kernels on: False" in run.stdout and "CPU kernels unavailable" in run.stderr
