"""The system messages at the start of a thread, kept in every context (docs/HISTORY.md, "The
system prompt").

A model's instructions are not history: `context()` keeps the thread's leading system messages
(its first messages, while they are system messages) in front of the summary and the messages
after it, and counts them against `max_tokens` first, as the summary is counted. A compaction
that covers them, or a budget that cuts them away, leaves them in all the same.
"""

from __future__ import annotations

from itertools import takewhile

from ..messages import Message, SummaryMessage
from .layout.formats import manifest_tokens, split_chunk
from .layout.reader import decode
from .operation import Batch, Operation, ThreadRef
from .reads import read_range
from .tokens import TokenCounter, counted
from .views import context as history

# The leading system messages context() keeps at most: a prompt in a few parts, not a log.
LEADING_SYSTEM_LIMIT = 16


def context(
    thread: ThreadRef, max_tokens: int | None = None, count_tokens: TokenCounter | None = None
) -> Operation[list[Message]]:
    """The model input: the thread's leading system messages, then views.context's (the summary
    and the messages after it, with `max_tokens` the newest that fit what the system messages
    leave). A budget they fill or exceed alone leaves them and the summary, as a summary over
    the budget is kept alone."""
    found = yield from history(thread, max_tokens, count_tokens)
    if any(m.seq_id == 1 for m in found):
        # The thread's first message is in, so is every message after it: nothing is left out.
        return found
    leading = yield from _leading_system(thread)
    if not leading:
        return found
    if max_tokens is not None:
        left = max_tokens - _tokens(leading, count_tokens)
        found = yield from history(thread, max(left, 1), count_tokens)
        if left < 1:
            found = found[:1] if found and isinstance(found[0], SummaryMessage) else []
    system = [m for m, _ in leading]
    kept = {m.seq_id for m in system}
    return system + [m for m in found if m.seq_id not in kept]


def _leading_system(thread: ThreadRef) -> Operation[list[tuple[Message, int]]]:
    """The system messages the thread starts with and their stored counts: one read-only step
    (lua/read_range.lua), and one more once retention deleted the thread's start, for the
    prompt it kept aside (lua/includes/prompt.lua)."""
    read = yield from read_range(
        thread, ("", ""), ("seq", str(LEADING_SYSTEM_LIMIT + 1)), "up", LEADING_SYSTEM_LIMIT
    )
    records = [r for r in read.records if r[0] <= LEADING_SYSTEM_LIMIT]
    if read.deleted_before:
        # Read after the range: retention only moves messages from it into the prompt, so
        # none is missed; one in both is the same message.
        (manifest, data), state = yield Batch(
            [
                ("MGET", thread.keys.prompt_manifest, thread.keys.prompt_data),
                ("HGET", thread.keys.meta, "prompt"),
            ]
        )
        if state != b"open":
            records = []  # the run ended in what was deleted: a later message is not in it
        tokens_of = manifest_tokens(manifest)
        kept = split_chunk(manifest, data)
        stored = {r[0] for r in records}
        records += [(s, r, tokens_of.get(s, 0)) for s, r in kept.items() if s not in stored]
    records.sort()
    messages = decode(thread, [r[:2] for r in records], [])
    tokens = {r[0]: r[2] for r in records}
    leading = takewhile(lambda m: m.message_type == "system_message", messages)
    return [(m, tokens[m.seq_id]) for m in leading if m.seq_id is not None]


def _tokens(system: list[tuple[Message, int]], count_tokens: TokenCounter | None) -> int:
    """The system messages' tokens: the caller's counter's, else the counts stored with them."""
    if count_tokens is not None:
        return sum(counted(count_tokens, m, f"message {m.id}") for m, _ in system)
    return sum(stored for _, stored in system)
