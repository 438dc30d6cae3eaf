"""``python -m benchmarks [name] [options]``: runs one benchmark, or all of them in turn.

Options after the name (or without one) go to each benchmark's own ``main``.
"""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = ("append",)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    names = [args.pop(0)] if args and args[0] in BENCHMARKS else list(BENCHMARKS)
    status = 0
    for name in names:
        status = importlib.import_module(f"benchmarks.{name}").main(args) or status
    return status


if __name__ == "__main__":
    sys.exit(main())
