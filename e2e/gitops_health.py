"""What GitOps tools make of an InferenceService object: the chart's Argo CD health script run by Lua 5.1
(Argo CD's gopher-lua dialect) through lupa, and kstatus (sigs.k8s.io/cli-utils, Flux's health checks)
through e2e/kstatus/main.go built by e2e/build_kstatus.sh. Shared by the unit tests on recorded objects and
the cluster test that records them."""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path
from typing import Any

from lupa import lua51

ROOT = Path(__file__).resolve().parents[1]
HEALTH_LUA = ROOT / "charts" / "kubeinfer" / "docs" / "argocd-health.lua"
FIXTURES = ROOT / "tests" / "operator" / "fixtures" / "inferenceservice"


def argocd_health(obj: dict[str, Any]) -> dict[str, str]:
    """Run the health script as Argo CD does: `obj` a global table, the script's return value the verdict."""
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(HEALTH_LUA.read_text())
    return {"status": result["status"], "message": result["message"]}


@functools.cache
def kstatus_binary() -> Path:
    built = subprocess.run(
        ["bash", str(ROOT / "e2e" / "build_kstatus.sh")], capture_output=True, text=True, check=False
    )
    if built.returncode != 0:
        raise RuntimeError(f"e2e/build_kstatus.sh failed:\n{built.stderr}")
    return Path(built.stdout.strip().splitlines()[-1])


def kstatus(obj: dict[str, Any]) -> str:
    """kstatus' verdict: Current, InProgress, Failed, Terminating, ..."""
    ran = subprocess.run(
        [str(kstatus_binary())], input=json.dumps(obj), capture_output=True, text=True, check=True
    )
    return json.loads(ran.stdout)["status"]


def as_recorded(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as the fixtures keep it: what `kubectl get -o json` returns, less managedFields."""
    meta = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
    return {**obj, "metadata": meta}
