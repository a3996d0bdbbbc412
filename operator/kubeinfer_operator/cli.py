"""`kubeinfer`: the user's command line.

Each sub-command lives in its own module, imported only when used, so `kubeinfer plan` never
loads httpx and nothing here imports torch or the runtime package.
"""

from __future__ import annotations

import importlib
import sys

# sub-command -> (module with a `main(argv: list[str]) -> int`, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": (
        "kubeinfer_operator.bench.command",
        "load an OpenAI-compatible endpoint; latency, throughput, goodput",
    ),
    "plan": (
        "kubeinfer_operator.bench.plan_command",
        "size a deployment: weights, KV cache, sequences that fit",
    ),
    "status": (
        "kubeinfer_operator.status_command",
        "one screen: SLO measured vs targets, replicas, scaling decisions, rollout",
    ),
    "backtest": (
        "kubeinfer_operator.autoscaling.backtest_command",
        "replay a trace or a service's history through the autoscaler with a chosen config",
    ),
    "alerts": (
        "kubeinfer_operator.alerts_command",
        "the SLO's Prometheus rules: recording rules and burn-rate alerts",
    ),
}


def usage() -> str:
    lines = ["usage: kubeinfer COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "run 'kubeinfer COMMAND --help' for a command's options"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"kubeinfer: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[command][0])
    except ModuleNotFoundError as e:
        if (e.name or "").startswith("kubeinfer"):
            raise
        print(
            f"kubeinfer {command}: needs the Python package {e.name!r}: pip install 'kubeinfer[bench]'",
            file=sys.stderr,
        )
        return 2
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
