"""``python -m kvstore``: the command line (kvstore/cli/main.py)."""

from .cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
