"""`kvstore threads OWNER` and `kvstore erase-owner OWNER`: an owner's threads listed, and the
owner erased (docs/OWNERS.md)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any


def add_owner_commands(commands: Any, with_store: Any) -> None:
    """The parsers of the two commands (`with_store` adds the store options)."""
    threads = with_store(commands, "threads", "list an owner's threads, most recent activity first")
    threads.add_argument("owner")
    # Taken as text: a bad order or limit is refused by `check` in one line, as a bad cursor is.
    threads.add_argument("--order", default="recent", help="recent (default) or created")
    threads.add_argument("--limit", default="50", help="threads a page, 1-1000 (default: 50)")
    threads.add_argument("--after", help="the next_cursor a previous page printed")
    threads.add_argument("--json", action="store_true", help="print the page as JSON")
    erase = with_store(
        commands,
        "erase-owner",
        "delete every thread, message and index entry of an owner (resumable: run again to"
        " finish an interrupted erasure); prints the receipt",
    )
    erase.add_argument("owner")


def check(args: argparse.Namespace) -> None:
    """An owner command's owner id (and a listing's cursor and limit), or a thread command's
    --owner, checked before a store is opened or an embedded server started: InvalidOwnerId,
    InvalidCursor. Other commands: nothing to check."""
    from .._engine.layout.keys import check_owner_id
    from .._engine.owners import listing

    if args.command == "threads":
        text = args.limit
        args.limit = int(text) if re.fullmatch(r"[0-9]{1,7}", text) else text
        listing(args.owner, args.order, args.after, args.limit)
    elif getattr(args, "owner", None) is not None:  # erase-owner's, or a thread command's
        check_owner_id(args.owner)


def _one_line(text: str) -> str:
    """A title as one field of a line: each character that is not printable (a newline, a tab,
    a terminal escape's ESC, a line separator) as its Python escape. A title is what a thread's
    user typed: it must not forge a line of the listing, or reach the terminal as a control."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def list_threads(store: Any, args: argparse.Namespace) -> int:
    """Prints a page of the owner's threads, and the cursor of the next."""
    page = store.threads(args.owner, order=args.order, after=args.after, limit=args.limit)
    if args.json:
        print(page.model_dump_json())
        return 0
    for info in page.threads:
        title = _one_line(info.title) if info.title is not None else "-"
        print(f"{info.thread_id}\t{info.messages} messages\t{info.last_activity_at}\t{title}")
    if page.next_cursor:
        print(f"next: --after {page.next_cursor}", file=sys.stderr)
    return 0


def erase_owner(store: Any, args: argparse.Namespace) -> int:
    """Erases the owner; prints the receipt as JSON."""
    receipt = store.erase_owner(args.owner)
    print(json.dumps(receipt.model_dump()))
    return 0


COMMANDS = {"threads": list_threads, "erase-owner": erase_owner}
