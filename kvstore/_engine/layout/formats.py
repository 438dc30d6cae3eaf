"""The stored formats of a thread's containers, as Python reads them (docs/LAYOUT.md).

A chunk index member and a large index member (the containers' ranges, sizes and token counts),
a side info (one message's id, otid, media, bytes, turn and tokens: the window's side hash and
every chunk manifest line), a chunk manifest and the data it frames, and a turn's header. The
scripts write these (lua/includes/layout2_format.lua, lua/includes/turns.lua); this module alone reads
them on the Python side.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ... import errors
from ..replies import stored_int
from ..text import text as _text


@dataclass(frozen=True, slots=True)
class ChunkEntry:
    """A chunk index member, "first:last:count:bytes:media:tokens" (lua/includes/layout2_format.lua).

    A member written before token counts existed has no tokens field: its tokens are
    record_tokens(bytes), a lower bound of what its messages count by the same rule."""

    first: int
    last: int
    count: int
    bytes: int
    media: int
    tokens: int

    @classmethod
    def parse(cls, member: builtins.bytes | str) -> ChunkEntry:
        entry = _PARSED_CHUNKS.get(member) if type(member) is bytes else None
        if entry is None:
            fields = _fields(member, (6, 5), "chunk index member")
            if len(fields) == 5:
                fields.append(record_tokens(fields[3]))
            entry = _parsed(_PARSED_CHUNKS, member, cls(*fields))
        return entry


@dataclass(frozen=True, slots=True)
class LargeEntry:
    """A large index member, "sequence:bytes:media:tokens": one oversized message's own chunk
    (without tokens, written before counts existed: record_tokens(bytes))."""

    sequence: int
    bytes: int
    media: int
    tokens: int

    @classmethod
    def parse(cls, member: builtins.bytes | str) -> LargeEntry:
        entry = _PARSED_LARGE.get(member) if type(member) is bytes else None
        if entry is None:
            fields = _fields(member, (4, 3), "large index member")
            if len(fields) == 3:
                fields.append(record_tokens(fields[1]))
            entry = _parsed(_PARSED_LARGE, member, cls(*fields))
        return entry


# Index members parsed, by their bytes (a member names an immutable range, and every plan
# parses the newest few again); bounded: cleared when full.
_PARSED_CHUNKS: dict[bytes, ChunkEntry] = {}
_PARSED_LARGE: dict[bytes, LargeEntry] = {}
_MAX_PARSED = 4096


def _parsed(memo: dict[bytes, Any], member: bytes | str, entry: Any) -> Any:
    """`entry`, kept in `memo` under `member` when it came as bytes (the usual reply)."""
    if type(member) is bytes:
        if len(memo) >= _MAX_PARSED:
            memo.clear()
        memo[member] = entry
    return entry


def _fields(member: bytes | str, counts: tuple[int, ...], what: str) -> list[int]:
    if type(member) is bytes:
        # The usual reply, checked without a regex: ASCII digits only (bytes.isdigit), none empty.
        parts = member.split(b":")
        if len(parts) in counts and b"".join(parts).isdigit() and all(parts):
            return [int(part) for part in parts]
    text = _text(member)
    if not re.fullmatch(r"[0-9]+(?::[0-9]+)*", text) or text.count(":") + 1 not in counts:
        raise errors.LayoutError(f"a {what} is malformed: {text[:80]!r}")
    return [int(f) for f in text.split(":")]


def record_tokens(record_bytes: int) -> int:
    """The documented count of a message stored without one: a token per 4 record bytes,
    rounded up (lua/includes/numbers.lua: bytes_tokens; tokens.py: estimated_tokens, the same
    rule)."""
    return -(-record_bytes // 4)


def side_tokens(side: bytes) -> int:
    """A side info's token count: "id\totid\tmedia\tbytes\tturn\ttokens", "%"-ended when
    escaped; one written before counts existed (no tokens field) counts record_tokens(bytes).
    Ids, otids and turns hold no tab, so the number of fields tells the forms apart."""
    fields = side.split(b"\t")
    try:
        if fields[-1] == b"%":
            fields.pop()
        if len(fields) == 6:
            return int(fields[5])
        if len(fields) == 5:
            return record_tokens(int(fields[3]))
    except ValueError:
        pass
    raise errors.RecordError(f"a side info is malformed: {side[:80]!r}")


def manifest_tokens(manifest: bytes | None) -> dict[int, int]:
    """A chunk manifest's token count of each sequence (side_tokens of each line)."""
    if not manifest:
        return {}
    tokens = {}
    for line in manifest.split(b"\n")[:-1]:
        sequence, _, side = line.partition(b"\t")
        try:
            tokens[int(sequence)] = side_tokens(side)
        except ValueError:
            raise errors.RecordError(f"a chunk manifest line is malformed: {line[:80]!r}") from None
    return tokens


# lua/includes/turns.lua: TURN_HEADER (Lua's %a is an ASCII letter there).
_TURN_HEADER = re.compile(r"([0-9]+):([A-Za-z]+)" + r":([0-9]+)" * 10)


@dataclass(frozen=True, slots=True)
class TurnHeader:
    """A turn's header in the turns hash (lua/includes/turns.lua):
    "start:outcome:kept:replies:first:k0:k1:a:b:count:first_seq:last_seq".

    start is where start_turn put the replies (0: not started); outcome `open` or the first
    finish's; kept the turn's stored sequences, replies those from start on, first the first of
    them; the ranges are k0..k1, the newest (k1) a-b here, each older one the field
    "<turn id>\\t<k>"; count, first_seq, last_seq the result the first finish recorded."""

    start: int
    outcome: str
    kept: int
    replies: int
    first: int
    k0: int
    k1: int
    a: int
    b: int
    count: int
    first_seq: int
    last_seq: int

    @classmethod
    def parse(cls, value: bytes | str) -> TurnHeader:
        match = _TURN_HEADER.fullmatch(_text(value))
        if not match:
            raise errors.LayoutError(f"a turn header is malformed: {_text(value)[:80]!r}")
        start, outcome, *rest = match.groups()
        return cls(int(start), outcome, *(int(f) for f in rest))


def split_chunk(
    manifest: bytes | None, data: bytes | None, tokens: dict[int, int] | None = None
) -> dict[int, bytes]:
    """A chunk's records by sequence: its data cut by the lengths its manifest lists, in order
    (lua/includes/layout2_format.lua); with `tokens`, each record's count goes there too (what
    manifest_tokens reads, from the same pass). A chunk deleted meanwhile reads as empty; a
    manifest that does not frame its data exactly is a MalformedChunk."""
    if manifest is None or data is None:
        return {}
    records, offset = {}, 0
    lines = manifest.split(b"\n")
    try:
        if lines.pop() != b"":
            raise ValueError("the last line is not ended")
        for line in lines:
            # sequence, id, otid, media, bytes, turn, tokens (none before counts existed), and
            # "%" when the texts are escaped
            fields = line.split(b"\t")
            counted = len(fields) - (fields[-1] == b"%")
            if counted not in (6, 7) or (counted == 7 and not fields[6].isdigit()):
                raise ValueError(f"line {line[:80]!r} has {len(fields)} fields")
            size = int(fields[4])
            sequence = int(fields[0])
            records[sequence] = data[offset : offset + size]
            offset += size
            if tokens is not None:
                tokens[sequence] = int(fields[6]) if counted == 7 else record_tokens(size)
        if offset != len(data):
            raise ValueError(f"it lists {offset} bytes, the chunk holds {len(data)}")
    except ValueError as exc:
        raise errors.MalformedChunk(f"a chunk manifest is malformed: {exc}") from None
    return records


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """A turn as a backup keeps it: its reply start and outcome, and what finish_turn recorded."""

    turn_id: str
    start: int
    outcome: str
    replies: int
    first: int
    count: int
    first_seq: int
    last_seq: int


def turn_records(
    records: dict[str, str], turn_id: str, turn_seq: int, turn_outcome: str
) -> Iterator[tuple[TurnRecord, list[tuple[int, int]]]]:
    """Each turn of a turns hash (field -> value, as text) with its ranges of sequences, by turn
    id; `turn_id`, `turn_seq` and `turn_outcome` are meta's turn reply sequence (the outcome of a
    turn recorded in the first layout-2 form is its)."""
    for name, value in sorted(records.items()):
        if "\t" in name:
            continue  # an older range of a turn, read with its header
        yield _turn(name, value, records, (turn_id, turn_seq, turn_outcome))


def _turn(
    turn_id: str, value: str, records: dict[str, str], current: tuple[str, int, str]
) -> tuple[TurnRecord, list[tuple[int, int]]]:
    current_id, current_seq, current_outcome = current
    if "|" in value:
        # The first layout-2 form, "<start>|a-b,c-d,...": its outcome is the turn reply sequence's.
        start, _, spans = value.partition("|")
        ranges = [_range(span) for span in spans.split(",") if span]
        outcome = current_outcome if current_id == turn_id else "open"
        start_seq = stored_int(start or 0, f"turn {turn_id}'s start") or (
            current_seq if current_id == turn_id else 0
        )
        spans_from_start = [
            (max(a, start_seq), b) for a, b in ranges if start_seq and b >= start_seq
        ]
        replies = sum(b - a + 1 for a, b in spans_from_start)
        first = spans_from_start[0][0] if spans_from_start else 0
        outcome = outcome or "open"
        # A finished turn's result is what finish_turn reads from such a record: its replies.
        result = (
            (replies, first, spans_from_start[-1][1] if spans_from_start else 0)
            if outcome != "open"
            else (0, 0, 0)
        )
        return TurnRecord(turn_id, start_seq, outcome, replies, first, *result), ranges
    header = TurnHeader.parse(value)
    ranges = []
    for k in range(header.k0, header.k1):
        older = records.get(f"{turn_id}\t{k}")
        if older:
            ranges.append(_range(older))
    if header.kept:
        ranges.append((header.a, header.b))
    record = TurnRecord(
        turn_id,
        header.start,
        header.outcome,
        header.replies,
        header.first,
        header.count,
        header.first_seq,
        header.last_seq,
    )
    return record, ranges


def _range(text: str) -> tuple[int, int]:
    a, _, b = text.partition("-")
    return stored_int(a, "a turn's range"), stored_int(b, "a turn's range")
