"""`python -m localcluster up|down|status` (with PYTHONPATH=e2e)."""

from __future__ import annotations

import argparse
import json
import sys

from .cluster import down, is_up, read_state, up, watchdog
from .config import load_config


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="localcluster", description="The local Kubernetes cluster for tests."
    )
    parser.add_argument("command", choices=["up", "down", "status", "watchdog"])
    args = parser.parse_args(argv)
    cfg = load_config()
    if args.command == "up":
        state = up(cfg)
        if state.get("up_seconds") is not None:
            print(
                f"cluster up in {state['up_seconds']} s; Prometheus at {state['prometheus_url']}",
                file=sys.stderr,
            )
        print(state["kubeconfig"])
    elif args.command == "down":
        down(cfg)
    elif args.command == "status":
        state = read_state(cfg)
        if not state or not is_up(cfg):
            print("down")
            return 1
        print(
            json.dumps(
                {k: state[k] for k in ("kubeconfig", "server", "prometheus_url", "node_names")}, indent=2
            )
        )
    else:
        watchdog(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
