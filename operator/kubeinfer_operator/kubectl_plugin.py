"""`kubectl-infsvc`: kubectl runs it for `kubectl infsvc ...` (any executable named kubectl-* on PATH is a
plugin). Sub-commands: status."""

from __future__ import annotations

import sys

USAGE = "usage: kubectl infsvc status NAME [-n NAMESPACE] [--prometheus URL]"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    if args[0] != "status":
        print(f"kubectl infsvc: unknown command {args[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    from kubeinfer_operator.status_command import main as status_main

    return status_main(args[1:], prog="kubectl infsvc status")


if __name__ == "__main__":
    sys.exit(main())
