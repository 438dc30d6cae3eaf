"""The system messages at the start of a thread, kept in every context (docs/HISTORY.md, "The
system prompt").

A model's instructions are not history: `context()` keeps the thread's leading system messages
(its first messages, while they are system messages) in front of the summary and the messages
after it, and counts them against `max_tokens` first, as the summary is counted. A compaction
that covers them, or a budget that cuts them away, leaves them in all the same.
"""

from __future__ import annotations

import re
from itertools import takewhile
from typing import Any

from ..messages import Message, SummaryMessage
from .layout.formats import manifest_tokens, split_chunk
from .layout.reader import Decoder, decode
from .operation import Batch, Operation, ThreadRef, riding
from .reads import read_range
from .record import decode_records
from .record_dicts import decode_dicts
from .tokens import TokenCounter, counted
from .views import context as history

# The leading system messages context() keeps at most: a prompt in a few parts, not a log.
LEADING_SYSTEM_LIMIT = 16

# A record's first bytes as the client packs a version-2 record: [2, {message_type: <fixstr>,
# ...}] (lua/includes/prompt.lua: is_system_record reads the same form); the group is the
# fixstr's header byte. What no record of this form starts with reads as "not known".
_RECORD_TYPE = re.compile(
    rb"[\x92\x93]\x02(?:[\x80-\x8f]|\xde..)\xacmessage_type([\xa0-\xbf])", re.S
)
# Bytes enough for that form and the longest type name a fixstr holds.
_TYPE_PREFIX = 64


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

    The kept prompt (once retention passed the thread's start) and the first bytes of the
    thread's first record are read in views.context's first round trip; the stored start, when
    that read did not reach it and those bytes do not settle it (_starts_plain), in one more.
    `decoder`:
    views.context's (the system messages and the summary are models)."""
    found, kept = yield from riding(
        history(thread, max_tokens, count_tokens, decoder), _prompt_reads(thread)
    )
    if any(_sequence(m) == 1 for m in found):
        # The thread's first message is in, so is every message after it: nothing is left out.
        return found
    leading = yield from _leading_system(thread, kept)
    if not leading:
        return found
    if max_tokens is not None:
        left = max_tokens - _tokens(leading, count_tokens)
        found = yield from history(thread, max(left, 1), count_tokens, decoder)
        if left < 1:
            found = found[:1] if found and isinstance(found[0], SummaryMessage) else []
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


def _prompt_reads(thread: ThreadRef) -> list[tuple[Any, ...]]:
    """The kept prompt (lua/includes/prompt.lua), where retention stands, and the first bytes
    of the containers that may hold sequence 1 (:func:`_start_reads`)."""
    return [*_kept_reads(thread), *_start_reads(thread)]


def _kept_reads(thread: ThreadRef) -> list[tuple[Any, ...]]:
    """The kept prompt and where retention stands."""
    keys = thread.keys
    return [
        ("MGET", keys.prompt_manifest, keys.prompt_data),
        ("HMGET", keys.meta, "prompt", "deleted_before"),
    ]


# The handle's hint of where its thread's start was at its last context(): "retained" (retention
# had begun: the kept prompt answers, no start is read), "closed" (sequence 1 was the first
# closed chunk's: it stays there, and the open chunk need not be read), else none.
_START_HINT = "context_start"


def _start_reads(thread: ThreadRef) -> list[tuple[Any, ...]]:
    """The first bytes of the first closed chunk's record and manifest, then the open chunk's
    (while none closed, it holds sequence 1), each record before its manifest; fewer where the
    handle's hint says they cannot be needed. A hint gone stale costs the read of the start."""
    hint = thread.hints.get(_START_HINT)
    if hint == "retained":
        return []
    keys = thread.keys
    reads: list[tuple[Any, ...]] = [
        ("GETRANGE", keys.chunk_data(1), 0, _TYPE_PREFIX - 1),
        ("GETRANGE", keys.chunk_manifest(1), 0, 1),
    ]
    if hint != "closed":
        reads += [
            ("GETRANGE", keys.open_data, 0, _TYPE_PREFIX - 1),
            ("GETRANGE", keys.open_manifest, 0, 1),
        ]
    return reads


def _starts_plain(thread: ThreadRef, deleted_before: Any, starts: list[Any]) -> bool:
    """Whether the first bytes _start_reads read show that the thread's first message (sequence
    1: no message is older) is stored and is no system message, so no message leads the thread
    as its prompt; and the handle's hint for its next read. A chunk's manifest lists its
    sequences in order, one line each, so one that starts ``1\t`` holds sequence 1 first; its
    record was read just before it: a chunk that closed or was rewritten in between shows
    another first line, and the answer is then "not known" (False), as it is for any other form
    (an oversized first message, a layout-2 thread, a version-1 record), which the read of the
    thread's start settles."""
    if deleted_before is not None:
        thread.hints[_START_HINT] = "retained"
        return False
    for at in range(0, len(starts), 2):
        record, manifest = starts[at : at + 2]
        if manifest == b"1\t":
            if at == 0:
                thread.hints[_START_HINT] = "closed"
            return _not_system(record)
    thread.hints.pop(_START_HINT, None)
    return False


def _not_system(prefix: bytes) -> bool:
    """Whether a record's first bytes name a message type other than system_message."""
    match = _RECORD_TYPE.match(prefix)
    if match is None:
        return False
    start, size = match.end(), match.group(1)[0] & 0x1F
    kind = prefix[start : start + size]
    return len(kind) == size and kind != b"system_message"


def _leading_system(thread: ThreadRef, kept: list[Any]) -> Operation[list[tuple[Message, int]]]:
    """The system messages the thread starts with and their stored counts. `kept` is what
    _prompt_reads read: once retention passed the thread's start and the run of them ended,
    they are the kept prompt; else they are (also) stored, read in one read-only step
    (lua/read_range.lua), and the kept prompt again after it when retention had begun."""
    (manifest, data), (state, deleted_before), *starts = kept
    if _starts_plain(thread, deleted_before, starts):
        return []
    if deleted_before is not None and state != b"open":
        return _system_of(thread, _prompt_records(manifest, data))
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


def _system_of(
    thread: ThreadRef, records: list[tuple[int, bytes, int]]
) -> list[tuple[Message, int]]:
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
