"""A thread laid out as docs/LAYOUT.md describes it, held in plain dicts, answering the native
reads a page sends (ZRANGE, ZCOUNT, ZCARD, HMGET, HGET, HGETALL, HLEN, EXISTS, MGET, GET) and
lua/locate.lua
as a server would: replies in the shapes redis-py returns with decode_responses=False (bytes
values, RESP2 scores as bytes, flat WITHSCORES lists).

The messages are made here (``message(seq)``: id ``m<seq>``, content ``message <seq>``), so a
test compares what a read returns with what it put in, never with what the core computes. A
test moves messages the way the scripts do (``roll`` into a chunk, ``remove``) and moves
``gen`` with them; a reply function can do so between two reads to stage a race.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from kvstore import SummaryMessage, UserMessage
from kvstore._engine.core import Batch, Eval
from kvstore._engine.layout.keys import ThreadKeys
from kvstore._engine.record import encode_record

from .driver import Step, batch, call

DATE = "2024-05-01T12:00:00Z"


def message(seq: int, **fields: Any) -> UserMessage:
    return UserMessage(id=f"m{seq}", content=f"message {seq}", date=DATE, **fields)


def v1_record(seq: int) -> bytes:
    """A layout-1 (version 1) record: the message's JSON, string content."""
    return f'{{"message_type": "user_message", "id": "m{seq}", "content": "legacy {seq}", "date": "{DATE}"}}'.encode()


def side_line(
    seq: int, record: bytes, message_id: str, otid: str = "", media: int = 0, turn: str = ""
) -> bytes:
    """One manifest line: sequence, id, otid, media, bytes, turn (lua/includes/layout2_format.lua)."""
    return f"{seq}\t{message_id}\t{otid}\t{media}\t{len(record)}\t{turn}\n".encode()


def chunk_hash(records: dict[int, bytes], ids: dict[int, str] | None = None) -> dict[bytes, bytes]:
    """A chunk's hash: `_m`, its manifest, and `d`, its records concatenated in sequence order."""
    ordered = sorted(records)
    manifest = b"".join(side_line(s, records[s], (ids or {}).get(s, f"m{s}")) for s in ordered)
    return {b"_m": manifest, b"d": b"".join(records[s] for s in ordered)}


def seqs(messages: Iterable[Any]) -> list[int | None]:
    return [m.seq_id for m in messages]


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _bound(value: Any) -> tuple[float, bool]:
    """A ZRANGE BYSCORE bound: (score, exclusive)."""
    text = value.decode() if isinstance(value, bytes) else str(value)
    exclusive = text.startswith("(")
    text = text.lstrip("(")
    if text in ("-inf", "+inf", "inf"):
        return (-math.inf if text == "-inf" else math.inf), exclusive
    return float(text), exclusive


def _above(score: float, bound: tuple[float, bool]) -> bool:
    return score > bound[0] if bound[1] else score >= bound[0]


def _below(score: float, bound: tuple[float, bool]) -> bool:
    return score < bound[0] if bound[1] else score <= bound[0]


class FakeThread:
    """One thread's keys as dicts. Sequences are assigned by ``append`` from ``last_seq``."""

    def __init__(self, keys: ThreadKeys, layout: int | None = 2) -> None:
        self.keys = keys
        self.meta: dict[str, str] = {"gen": "1", "last_seq": "0"}
        if layout is not None:
            self.meta["layout"] = str(layout)
        self.window: dict[int, bytes] = {}
        self.chunks: dict[int, dict[int, bytes]] = {}  # first sequence -> {sequence: record}
        self.large: dict[int, bytes] = {}
        self.legacy: dict[int, bytes] = {}
        self.ids: dict[str, int] = {}
        self.otids: dict[str, int] = {}
        self.id_of: dict[int, str] = {}
        # Layout 3: the open chunk's records; its closed chunks are strings, not hashes.
        self.open: dict[int, bytes] = {}

    # ------------------------------------------------------------------ building the state

    @property
    def last_seq(self) -> int:
        return int(self.meta.get("last_seq", 0))

    def append(
        self, count: int = 1, make: Callable[[int], Any] = message, large: bool = False
    ) -> list[int]:
        """Stores `count` messages after last_seq, in the window (or each in its own chunk)."""
        added = []
        for _ in range(count):
            seq = self.last_seq + 1
            body = make(seq)
            record = encode_record(body)
            (self.large if large else self.window)[seq] = record
            self.ids[body.id] = seq
            self.id_of[seq] = body.id
            if body.otid:
                self.otids[body.otid] = seq
            self.meta["last_seq"] = str(seq)
            added.append(seq)
        return added

    def move_gen(self) -> None:
        self.meta["gen"] = str(int(self.meta["gen"]) + 1)

    def roll(self, first: int, last: int) -> None:
        """Moves window messages first..last into chunk:<first> (a rollover); gen moves."""
        moved = {s: self.window.pop(s) for s in range(first, last + 1) if s in self.window}
        self.chunks[first] = moved
        self.move_gen()

    def remove(self, *sequences: int) -> None:
        """Removes messages wherever they are (remove_turn, retention); gen moves."""
        for seq in sequences:
            self.window.pop(seq, None)
            self.large.pop(seq, None)
            self.legacy.pop(seq, None)
            for records in self.chunks.values():
                records.pop(seq, None)
            self.ids.pop(self.id_of.get(seq, ""), None)
        self.chunks = {first: records for first, records in self.chunks.items() if records}
        self.move_gen()

    # ------------------------------------------------------------------ the keys as Redis types

    def _zset(self, key: str) -> list[tuple[bytes, float]]:
        """(member, score) pairs, by score."""
        if key == self.keys.window:
            pairs = [(record, float(s)) for s, record in self.window.items()]
        elif key == self.keys.chunk_index:
            pairs = []
            for first, records in self.chunks.items():
                size = sum(len(r) for r in records.values())
                member = f"{first}:{max(records)}:{len(records)}:{size}:0".encode()
                pairs.append((member, float(first)))
        elif key == self.keys.large_index:
            pairs = [(f"{s}:{len(r)}:0".encode(), float(s)) for s, r in self.large.items()]
        else:
            raise AssertionError(f"the fake holds no sorted set {key}")
        return sorted(pairs, key=lambda pair: (pair[1], pair[0]))

    @property
    def strings(self) -> bool:
        return self.meta.get("layout") == "3"

    def _meta(self) -> dict[str, str]:
        meta = dict(self.meta)
        if self.open:
            meta.update(
                open_first=str(min(self.open)),
                open_last=str(max(self.open)),
                open_count=str(len(self.open)),
            )
        if self.strings:
            stored = len(self.window) + len(self.large) + len(self.open)
            meta["stored"] = str(stored + sum(len(r) for r in self.chunks.values()))
        return meta

    def _chunk(self, first: int) -> dict[bytes, bytes] | None:
        if first in self.chunks:
            return chunk_hash(self.chunks[first], self.id_of)
        if first in self.large:
            return chunk_hash({first: self.large[first]}, self.id_of)
        return None

    def _string(self, key: str) -> bytes | None:
        keys = self.keys
        if key in (keys.open_manifest, keys.open_data):
            if not self.open:
                return None
            field = b"_m" if key == keys.open_manifest else b"d"
            return chunk_hash(self.open, self.id_of)[field]
        if key.startswith(keys.chunk_prefix) and key[-2:] in (":m", ":d") and self.strings:
            chunk = self._chunk(int(key[len(keys.chunk_prefix) : -2]))
            return None if chunk is None else chunk[b"_m" if key.endswith(":m") else b"d"]
        return None

    def _hash(self, key: str) -> dict[bytes, bytes] | None:
        if key == self.keys.meta:
            return {k.encode(): v.encode() for k, v in self._meta().items()} or None
        if key == self.keys.legacy:
            return {str(s).encode(): r for s, r in self.legacy.items()} or None
        if key.startswith(self.keys.chunk_prefix):
            return None if self.strings else self._chunk(int(key[len(self.keys.chunk_prefix) :]))
        raise AssertionError(f"the fake holds no hash {key}")

    # ------------------------------------------------------------------ commands

    def command(self, name: str, key: str, *args: Any) -> Any:
        name = name.upper()
        if name == "HMGET":
            fields = self._hash(key) or {}
            return [fields.get(_bytes(f)) for f in args]
        if name == "HGET":
            return (self._hash(key) or {}).get(_bytes(args[0]))
        if name == "HGETALL":
            return dict(self._hash(key) or {})
        if name == "MGET":
            return [self._string(k) for k in (key, *args)]
        if name == "GET":
            return self._string(key)
        if name == "GETRANGE":
            start, end = int(args[0]), int(args[1])
            return (self._string(key) or b"")[start : end + 1]
        if name == "HLEN":
            return len(self._hash(key) or {})
        if name == "EXISTS":
            return int(bool(self._hash(key) if key != self.keys.window else self.window))
        if name == "ZCARD":
            return len(self._zset(key))
        if name == "ZCOUNT":
            low, high = _bound(args[0]), _bound(args[1])
            return sum(
                1 for _, score in self._zset(key) if _above(score, low) and _below(score, high)
            )
        if name == "ZRANGE":
            return self._zrange(key, *args)
        raise AssertionError(f"the fake does not know {name}")

    def _zrange(self, key: str, start: Any, stop: Any, *options: Any) -> list[bytes]:
        words = [str(o).upper() for o in options]
        pairs = self._zset(key)
        rev = "REV" in words
        if "BYSCORE" in words:
            high, low = (_bound(start), _bound(stop)) if rev else (_bound(stop), _bound(start))
            chosen = [p for p in pairs if _above(p[1], low) and _below(p[1], high)]
            if rev:
                chosen.reverse()
        else:
            ordered = list(reversed(pairs)) if rev else pairs
            first, last = int(start), int(stop)
            first += len(ordered) if first < 0 else 0
            last += len(ordered) if last < 0 else 0
            chosen = ordered[first : last + 1]
        if "LIMIT" in words:
            at = words.index("LIMIT")
            offset, count = int(options[at + 1]), int(options[at + 2])
            chosen = chosen[offset:] if count < 0 else chosen[offset : offset + count]
        if "WITHSCORES" in words:
            flat: list[bytes] = []
            for member, score in chosen:
                flat += [member, _bytes(int(score))]
            return flat
        return [member for member, _ in chosen]

    def answer(self, request: Batch, before: Callable[[int], None] | None = None) -> list[Any]:
        """The replies of a Batch; `before(position)` runs before each command, if given."""
        replies = []
        for position, command in enumerate(request.commands):
            if before is not None:
                before(position)
            replies.append(self.command(*command))
        return replies

    def where(self, seq: int) -> int:
        """Where lua/locate.lua says a sequence lives: -1 window, -2 legacy, -3 the open chunk, a
        chunk's first, 0."""
        if seq in self.window:
            return -1
        if seq in self.open:
            return -3
        if seq in self.legacy:
            return -2
        if seq in self.large:
            return seq
        for first, records in self.chunks.items():
            if seq in records:
                return first
        return 0

    def locate(self, request: Eval) -> list[Any]:
        """lua/locate.lua's reply: {gen, deleted_before, seq_1, where_1, ...}."""
        kind, *targets = request.args
        places: list[int] = []
        for target in targets:
            if kind == "seq":
                seq = int(target)
            else:
                seq = (self.ids if kind == "id" else self.otids).get(target, 0)
            places += [seq, self.where(seq) if seq else 0]
        return [int(self.meta["gen"]), int(self.meta.get("deleted_before", 0)), *places]

    def reply(self, request: Eval | Batch) -> Any:
        """Answers a Batch, or a call of lua/locate.lua."""
        if isinstance(request, Batch):
            return self.answer(request)
        assert request.script.name == "locate", f"the fake answers no {request.script.name}.lua"
        return self.locate(request)

    # ------------------------------------------------------------------ the steps of a read
    # Each expects one kind of round trip (docs/LAYOUT.md, "How a page is read") and answers it
    # from this thread unless given another reply.

    def newest(self, reply: Any = None, window: bool = True) -> Step:
        """The newest page's one Batch: meta, the open chunk, the newest oversized and closed
        chunk members, window members by rank, one with its score (not once the store has seen
        the thread at layout 3: `window` False), then meta again."""
        keys = self.keys

        def check(commands: list[tuple]) -> bool:
            reads = commands[4:-1]
            return (
                commands[0][:3] == ("HMGET", keys.meta, "deleted_before")
                and commands[1][:3] == ("MGET", keys.open_manifest, keys.open_data)
                and commands[-1] == ("HMGET", keys.meta, "gen", "last_seq")
                and (
                    len(reads) == 2
                    and reads[0][:2] == reads[1][:2] == ("ZRANGE", keys.window)
                    and reads[0][-1] == "REV"
                    and reads[1][-1] == "WITHSCORES"
                    if window
                    else reads == []
                )
            )

        return batch(check, reply=reply or self.reply)

    def plan(self, reply: Any = None) -> Step:
        """A plan's native reads: meta's gen first, gen and last_seq again last."""
        keys = self.keys

        def check(commands: list[tuple]) -> bool:
            first, last = commands[0], commands[-1]
            return first[:3] == ("HMGET", keys.meta, "gen") and last == (
                "HMGET",
                keys.meta,
                "gen",
                "last_seq",
            )

        return batch(check, reply=reply or self.reply)

    def fetch(self, reply: Any = None, commands: Any = None) -> Step:
        """A fetch of planned or located containers: ends with meta's gen."""
        keys = self.keys

        def check(sent: list[tuple]) -> bool:
            if sent[-1] != ("HGET", keys.meta, "gen"):
                return False
            return commands(sent) if callable(commands) else True

        return batch(check, reply=reply or self.reply)

    def stats_read(self, reply: Any = None) -> Step:
        """The one pipeline of stats() (and of snapshot's first and last read): meta and the counts."""
        keys = self.keys
        commands = [
            ("HGETALL", keys.meta),
            ("ZCARD", keys.window),
            ("ZCARD", keys.chunk_index),
            ("ZCARD", keys.large_index),
            ("HLEN", keys.legacy),
        ]
        return batch(commands, reply=self.reply if reply is None else reply)

    def located(self, *targets: str, kind: str = "seq") -> Step:
        """A call of lua/locate.lua for exactly these targets, answered from this thread."""
        return call("locate", (kind, *targets), reply=self.locate)


def summary(seq: int, text: str = "the summary") -> SummaryMessage:
    return SummaryMessage(id=f"m{seq}", summary=text, date=DATE)
