"""Repository-wide pytest setup: e2e/ on sys.path and the session-scoped `cluster` fixture (the local
Kubernetes cluster; its API is documented in e2e/localcluster/__init__.py)."""

from __future__ import annotations

import atexit
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "e2e"))

if TYPE_CHECKING:
    from localcluster import Cluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The local cluster: another test session's is joined; one `make cluster` or `make demo` left running
    is stopped first (KUBEINFER_TEST_REUSE_CLUSTER=1 joins it and leaves it up). Started here, it is taken
    down at the end of the session, on SIGTERM/SIGHUP, or by its watchdog if this process is killed
    outright."""
    from localcluster.cluster import REUSE_ENV, Cluster, release, up
    from localcluster.config import load_config

    cfg, pid = load_config(), os.getpid()
    state = up(cfg, started_by="fixture", owner_pid=pid, reuse_cli=os.environ.get(REUSE_ENV) == "1")
    finished = False

    def finish() -> None:
        nonlocal finished
        if not finished:
            finished = True
            release(cfg, pid)

    def on_signal(signum: int, _frame: object) -> None:
        finish()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(pid, signum)

    atexit.register(finish)
    handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    previous = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = state["kubeconfig"]
    try:
        yield Cluster.from_state(cfg, state)
    finally:
        if previous is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = previous
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        finish()
