"""`kubeinfer-runtime`: one entry point for everything the runtime image runs.

Sub-commands import their module lazily so that `route` (the router) never imports torch.
"""

from __future__ import annotations

import importlib
import sys

# sub-command -> (module with a `main(argv: list[str]) -> int`, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("kubeinfer_runtime.server.main", "serve a model over an OpenAI-compatible HTTP API"),
    "route": ("kubeinfer_runtime.router.main", "split traffic between stable and canary runtime pods"),
    "make-tiny-model": ("kubeinfer_runtime.tiny_model", "write a tiny random-weight Llama model directory"),
}


def usage() -> str:
    lines = ["usage: kubeinfer-runtime COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<16} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"kubeinfer-runtime: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
