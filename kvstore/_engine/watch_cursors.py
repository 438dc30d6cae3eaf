"""Watch cursors: what `watch(after=...)` takes and each event gives (docs/EVENTS.md, "Cursors"),
and the stream id a watcher reads after."""

from __future__ import annotations

import re

from .. import errors

# "<n>-<s>" (an event), "<s>" (a sequence), either with "@<incarnation>".
_CURSOR = re.compile(r"(?:(\d+)-)?(\d+)(?:@(\d+))?")


def parse_cursor(after: int | str | None) -> tuple[tuple[int, int] | int | None, str | None]:
    """(where, incarnation): where is (n, s) for an event's cursor, s for a sequence, None for
    "from now on"; incarnation is the thread's the cursor names (its ``@<born>``), else None."""
    if after is None:
        return None, None
    if isinstance(after, int) and not isinstance(after, bool) and after >= 0:
        return after, None
    if isinstance(after, str):
        match = _CURSOR.fullmatch(after)
        if match:
            event, sequence, born = match.groups()
            return ((int(event), int(sequence)) if event is not None else int(sequence)), born
    raise errors.InvalidCursor(
        "a watch cursor is an event's cursor ('<n>-<s>', '<n>-<s>@<incarnation>'), a sequence (an int, "
        f"its digits, or '<s>@<incarnation>') or None; got {after!r}"
    )


def event_cursor(text: str, incarnation: str | None) -> str:
    """A position ("<n>-<s>", or a sequence) with the thread's incarnation when it has one."""
    return f"{text}@{incarnation}" if incarnation is not None else text


def after_id(n: int) -> str:
    """The XREAD id after which event n + 1 comes: every id of event n is below (n, max)."""
    return f"{n}-18446744073709551615"
