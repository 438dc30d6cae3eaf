"""The system messages at the start of a thread, kept in every context (docs/HISTORY.md, "The
system prompt").

A model's instructions are not history: `context()` keeps the thread's leading system messages
(its first messages, while they are system messages) in front of the summary and the messages
after it, and counts them against `max_tokens` first, as the summary is counted. A compaction
that covers them, or a budget that cuts them away, leaves them in all the same.
"""

from __future__ import annotations

from itertools import takewhile
from typing import Any

from ..messages import Message, SummaryMessage
from .layout.formats import manifest_tokens, split_chunk
from .layout.reader import Decoder, decode
from .operation import Batch, Operation, ThreadRef, riding
from .reads import read_range
from .record import decode_records
from .record_dicts import decode_dicts
from .system_start import (
    HINT,
    LEADING_SYSTEM_LIMIT,
    PLAIN,
    Learn,
    Records,
    Run,
    container_read,
    hint_of,
    learn,
    settle,
    start_reads,
)
from .tokens import TokenCounter, counted
from .views import context as history

__all__ = ["LEADING_SYSTEM_LIMIT", "context", "context_dicts"]


def context(
    thread: ThreadRef,
    max_tokens: int | None = None,
    count_tokens: TokenCounter | None = None,
    decoder: Decoder = decode_records,
) -> Operation[list[Any]]:
    """The model input: the thread's leading system messages, then views.context's (the summary
    and the messages after it, with `max_tokens` the newest that fit what the system messages
    leave). A budget they fill or exceed alone leaves them and the summary, as a summary over
    the budget is kept alone.

    The kept prompt (once retention passed the thread's start) and the thread's start
    (kvstore/_engine/system_start.py) are read in views.context's first round trip; the stored
    start, when that read did not reach it and what was read does not settle it, in one more.
    A handle that keeps the run of system messages (a Run hint) plans the history with what
    they leave of `max_tokens` at once; when the run changed, the history is read again.
    `decoder`: views.context's (the system messages and the summary are models)."""
    hint = hint_of(thread)
    budget = max_tokens
    if max_tokens is not None and count_tokens is None and isinstance(hint, Run):
        budget = max(max_tokens - hint.tokens, 1)
    found, kept = yield from riding(
        history(thread, budget, count_tokens, decoder),
        [*_kept_reads(thread), *start_reads(thread, hint)],
    )
    if any(_sequence(m) == 1 for m in found):
        # The thread's first message is in, so is every message after it: nothing is left out
        # (and every message fit the smaller budget too: the same messages).
        return found
    leading = yield from _leading_system(thread, hint, kept)
    if max_tokens is not None:
        left = max_tokens - _tokens(leading, count_tokens) if leading else max_tokens
        if max(left, 1) != budget:
            found = yield from history(thread, max(left, 1), count_tokens, decoder)
        if left < 1:
            found = found[:1] if found and isinstance(found[0], SummaryMessage) else []
    if not leading:
        return found
    system = [m for m, _ in leading]
    seen = {m.seq_id for m in system}
    return system + [m for m in found if _sequence(m) not in seen]


def _sequence(message: Any) -> Any:
    """A message's seq_id, of its model or of its stored dict."""
    return message["seq_id"] if type(message) is dict else message.seq_id


def context_dicts(thread: ThreadRef, max_tokens: int | None = None) -> Operation[list[Any]]:
    """context() with the messages after the summary as their stored dicts where
    record_dicts.decode_dicts vouches for them (the adapters' reads: kvstore/integrations)."""
    return (yield from context(thread, max_tokens, None, decode_dicts))


def _kept_reads(thread: ThreadRef) -> list[tuple[Any, ...]]:
    """The kept prompt (lua/includes/prompt.lua) and where retention stands."""
    keys = thread.keys
    return [
        ("MGET", keys.prompt_manifest, keys.prompt_data),
        ("HMGET", keys.meta, "prompt", "deleted_before"),
    ]


def _leading_system(
    thread: ThreadRef, hint: Any, kept: list[Any]
) -> Operation[list[tuple[Message, int]]]:
    """The system messages the thread starts with and their stored counts. `kept` is what
    _kept_reads and start_reads(thread, `hint`) read: once retention passed the thread's start
    and the run of them ended, they are the kept prompt; else they are (also) stored: settled
    by the first bytes of the start, or by the run the handle keeps, read fresh; or read whole
    from the chunk holding a system message first (learnt for the handle's next read); or read
    in one read-only step (lua/read_range.lua), and the kept prompt again after it when
    retention had begun."""
    (manifest, data), (state, deleted_before), *starts = kept
    verdict = settle(thread, hint, deleted_before, starts)
    if verdict is PLAIN:
        return []
    if isinstance(verdict, list):
        leading = _system_of(thread, verdict)
        if len(leading) != len(verdict):
            thread.hints.pop(HINT, None)  # a message of the run is no system message now
        return leading
    if deleted_before is not None and state != b"open":
        return _system_of(thread, _prompt_records(manifest, data))
    if isinstance(verdict, Learn):
        ((chunk_manifest, chunk_data),) = yield Batch([container_read(thread, verdict.closed)])
        learnt = learn(
            thread, verdict.closed, chunk_manifest, chunk_data, lambda r: _system_of(thread, r)
        )
        if learnt is not None:
            return learnt
    read = yield from read_range(
        thread, ("", ""), ("seq", str(LEADING_SYSTEM_LIMIT + 1)), "up", LEADING_SYSTEM_LIMIT
    )
    records = [r for r in read.records if r[0] <= LEADING_SYSTEM_LIMIT]
    if read.deleted_before:
        # Read after the range: retention only moves messages from it into the prompt, so
        # none is missed; one in both is the same message.
        (manifest, data), (state, _) = yield Batch(_kept_reads(thread))
        if state != b"open":
            records = []  # the run ended in what was deleted: a later message is not in it
        stored = {r[0] for r in records}
        records += [r for r in _prompt_records(manifest, data) if r[0] not in stored]
    return _system_of(thread, records)


def _prompt_records(manifest: bytes | None, data: bytes | None) -> list[tuple[int, bytes, int]]:
    """The kept prompt's (sequence, record, stored count)s."""
    tokens = manifest_tokens(manifest)
    return [(s, r, tokens.get(s, 0)) for s, r in split_chunk(manifest, data).items()]


def _system_of(thread: ThreadRef, records: Records) -> list[tuple[Message, int]]:
    """The leading system messages among (sequence, record, count)s, with their counts."""
    records = sorted(records)
    messages = decode(thread, [r[:2] for r in records], [])
    tokens = {r[0]: r[2] for r in records}
    leading = takewhile(lambda m: m.message_type == "system_message", messages)
    return [(m, tokens[m.seq_id]) for m in leading if m.seq_id is not None]


def _tokens(system: list[tuple[Message, int]], count_tokens: TokenCounter | None) -> int:
    """The system messages' tokens: the caller's counter's, else the counts stored with them."""
    if count_tokens is not None:
        return sum(counted(count_tokens, m, f"message {m.id}") for m, _ in system)
    return sum(stored for _, stored in system)
