"""A plain-Python model of a thread's paging, written from the contract (SPEC §3), not the code.

`after=X` returns the `limit` messages that follow X in the chosen order; `before=X` the `limit`
messages immediately preceding X, still listed in that order; both bound a range; `has_more`
says whether messages exist beyond the page in the direction the cursor moved. A turn page lists
the turn's messages with the same cursors.
"""

from __future__ import annotations


def page(
    sequences: list[int], after: int | None, before: int | None, limit: int, order: str
) -> tuple[list[int], bool]:
    """The sequences of one page of `sequences` (the kept ones, any order) and its has_more."""
    ascending = sorted(sequences)
    in_order = ascending if order == "asc" else ascending[::-1]

    def follows(s: int, cursor: int) -> bool:
        return s > cursor if order == "asc" else s < cursor

    candidates = [
        s
        for s in in_order
        if (after is None or follows(s, after)) and (before is None or follows(before, s))
    ]
    if before is not None and after is None:
        # The page next to `before`: the last `limit` of the range in this order.
        return candidates[-limit:], len(candidates) > limit
    return candidates[:limit], len(candidates) > limit


def context(kept: list, summary_last: int | None, summary_seq: int | None) -> list:
    """The model input: the summary, then every kept message after what it covers."""
    if summary_seq is None:
        return sorted(kept, key=lambda m: m.seq_id)
    by_seq = {m.seq_id: m for m in kept}
    head = (
        [by_seq[summary_seq]]
        if summary_seq in by_seq and by_seq[summary_seq].message_type == "summary_message"
        else []
    )
    return head + [
        m
        for m in sorted(kept, key=lambda m: m.seq_id)
        if m.seq_id > summary_last and m.seq_id != summary_seq
    ]
