"""Reads a thread's keys with raw commands and checks the layout's invariants (docs/LAYOUT.md)."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from kvstore._engine.layout.formats import ChunkEntry, LargeEntry, TurnHeader, side_tokens
from kvstore._engine.layout.keys import ThreadKeys
from kvstore.config import StoreConfig


@dataclass
class Layout:
    window: dict[int, bytes]
    chunks: dict[int, dict[int, bytes]]  # first sequence -> {sequence: record}
    large: dict[int, bytes]
    meta: dict[str, str]

    def all_sequences(self) -> list[int]:
        sequences = list(self.window) + list(self.large)
        for fields in self.chunks.values():
            sequences += list(fields)
        return sorted(sequences)


def manifest_lines(manifest: bytes) -> list[str]:
    """A manifest's lines: each ends with "\\n", the one byte its framing splits lines on."""
    text = manifest.decode()
    assert text.endswith("\n"), f"manifest {text[-40:]!r} does not end its last line"
    return text[:-1].split("\n")


def legacy_sequences(client, keys: ThreadKeys) -> list[int]:
    """The sequences a migrating layout-1 thread still holds in its legacy hash."""
    return sorted(
        int(f) for f in client.hkeys(keys.legacy) if f.isdigit() and not f.startswith(b"0")
    )


def chunk_records(client, key: str) -> dict[int, bytes]:
    """A chunk's records by sequence, cut from its data by its manifest (docs/LAYOUT.md)."""
    fields = client.hgetall(key)
    assert set(fields) == {b"_m", b"d"}, f"{key} holds {sorted(fields)}"
    records, offset = {}, 0
    for line in manifest_lines(fields[b"_m"]):
        sequence, side = line.split("\t", 1)
        # id, otid, media, bytes, turn, tokens (none in a side info written before counts
        # existed); and "%" after them when the three texts are escaped.
        tabs = side.count("\t") - side.endswith("\t%")
        assert tabs == 5 or tabs == 4, f"{key}: {line!r}"
        size = int(side.split("\t")[3])
        records[int(sequence)] = fields[b"d"][offset : offset + size]
        offset += size
    assert offset == len(fields[b"d"]), (
        f"{key}: the manifest lists {offset} bytes, the data holds {len(fields[b'd'])}"
    )
    assert list(records) == sorted(records), f"{key}: records out of order"
    return records


def read_layout(client, keys: ThreadKeys) -> Layout:
    meta = {k.decode(): v.decode() for k, v in client.hgetall(keys.meta).items()}
    window = {
        int(score): member for member, score in client.zrange(keys.window, 0, -1, withscores=True)
    }
    chunks, large = {}, {}
    for _member, score in client.zrange(keys.chunk_index, 0, -1, withscores=True):
        first = int(score)
        chunks[first] = chunk_records(client, keys.chunk(first))
    for _member, score in client.zrange(keys.large_index, 0, -1, withscores=True):
        records = chunk_records(client, keys.chunk(int(score)))
        assert list(records) == [int(score)]
        large[int(score)] = records[int(score)]
    return Layout(window, chunks, large, meta)


def check_layout(client, keys: ThreadKeys, config: StoreConfig) -> Layout:
    """Asserts every invariant of docs/LAYOUT.md that holds after any completed call."""
    layout = read_layout(client, keys)
    index = {}
    for member, score in client.zrange(keys.chunk_index, 0, -1, withscores=True):
        entry = ChunkEntry.parse(member)
        assert entry.first == int(score)
        index[entry.first] = (entry.last, entry.count, entry.bytes, entry.media)
        if member.count(b":") == 5:
            # A member written with counts sums its messages' counts (docs/LAYOUT.md).
            lines = manifest_lines(client.hget(keys.chunk(entry.first), "_m"))
            assert entry.tokens == sum(
                side_tokens(line.split("\t", 1)[1].encode()) for line in lines
            ), (member, lines)
    # The index matches the chunks exactly.
    for first, fields in layout.chunks.items():
        last, count, nbytes, media = index[first]
        assert fields, f"chunk {first} is listed but empty or missing"
        manifest = manifest_lines(client.hget(keys.chunk(first), "_m"))
        assert sum(int(line.split("\t")[3]) for line in manifest) == media, (first, media)
        # Removed turns may leave holes, even at the edges; the key keeps its first sequence.
        assert first <= min(fields) and max(fields) <= last, (first, last, sorted(fields))
        assert len(fields) == count
        assert sum(len(r) for r in fields.values()) == nbytes
        assert count <= config.chunk_size
        # A message alone in its chunk may exceed the cap: a replace may grow it (docs/LAYOUT.md).
        assert count == 1 or nbytes <= config.chunk_max_bytes, (first, nbytes)
    # Normal chunks hold disjoint, ordered ranges, all older than the window.
    ranges = sorted((first, index[first][0]) for first in layout.chunks)
    for (_, last), (next_first, _) in itertools.pairwise(ranges):
        assert last < next_first
    if ranges and layout.window:
        assert ranges[-1][1] < min(layout.window)
    # No chunk key exists that the index does not list.
    listed = {keys.chunk(f).encode() for f in (*layout.chunks, *layout.large)}
    present = set(client.scan_iter(match=keys.chunk_prefix + "*", count=1000))
    assert present == listed, present ^ listed
    # Window side info covers exactly the window.
    assert {int(f) for f in client.hkeys(keys.window_side)} == set(layout.window)
    # Counters agree with what is stored. A migrating layout-1 thread's legacy hash holds the
    # messages not yet moved: they count in `stored` once the scan found its range
    # (`legacy_last`), every field of it, and the range ends at or before `last_seq`.
    sequences = layout.all_sequences()
    kept = len(sequences)
    legacy = legacy_sequences(client, keys) if layout.meta.get("layout") != "2" else []
    assert not set(legacy) & set(sequences), sorted(set(legacy) & set(sequences))
    scanned = "legacy_last" in layout.meta
    if scanned:
        assert int(layout.meta["legacy_last"]) <= int(layout.meta["last_seq"])
        assert not legacy or legacy[-1] <= int(layout.meta["legacy_last"])
        assert not legacy or legacy[0] > int(layout.meta["migrated"])
    sequences = sorted(sequences + legacy)
    assert len(sequences) == len(set(sequences))
    assert int(layout.meta.get("stored", 0)) == kept + (client.hlen(keys.legacy) if scanned else 0)
    if sequences and (scanned or not legacy):
        assert int(layout.meta["last_seq"]) >= sequences[-1]
    assert client.hlen(keys.ids) == len(sequences)
    # Every stored message is named in a manifest or the window side info, with its true size.
    for first, fields in (*layout.chunks.items(), *((s, {s: r}) for s, r in layout.large.items())):
        lines = dict(
            line.split("\t", 1) for line in manifest_lines(client.hget(keys.chunk(first), "_m"))
        )
        assert {int(k) for k in lines} == set(fields)
        for sequence, side in lines.items():
            assert int(side.split("\t")[3]) == len(fields[int(sequence)])
    media = sum(int(v.decode().split("\t")[2]) for v in client.hvals(keys.window_side))
    for first in (*layout.chunks, *layout.large):
        media += sum(
            int(line.split("\t")[3])
            for line in manifest_lines(client.hget(keys.chunk(first), "_m"))
        )
    assert int(layout.meta.get("media", 0)) == media
    stored_bytes = sum(len(r) for r in layout.window.values()) + sum(
        len(r) for r in layout.large.values()
    )
    stored_bytes += sum(len(r) for fields in layout.chunks.values() for r in fields.values())
    assert int(layout.meta.get("bytes", 0)) == stored_bytes
    assert int(layout.meta.get("window_bytes", 0)) == sum(len(r) for r in layout.window.values())
    # The token total is the index members' and the window side infos' (a thread written before
    # counts existed has none until its next write).
    if "tokens" in layout.meta:
        tokens = sum(ChunkEntry.parse(m).tokens for m in client.zrange(keys.chunk_index, 0, -1))
        tokens += sum(LargeEntry.parse(m).tokens for m in client.zrange(keys.large_index, 0, -1))
        tokens += sum(side_tokens(v) for v in client.hvals(keys.window_side))
        assert int(layout.meta["tokens"]) == tokens, (layout.meta["tokens"], tokens)
    check_turns(client, keys)
    return layout


def check_turns(client, keys: ThreadKeys) -> None:
    """Each turn record's header agrees with its ranges (docs/LAYOUT.md, Turns)."""
    fields = {k.decode(): v.decode() for k, v in client.hgetall(keys.turns).items()}
    # `\tidle` -> "k0:k1" and `\tidle\t<k>` -> "<last_seq>\t<turn id>": the finished turns without
    # messages, for retention.
    k0, _, k1 = fields.pop("\tidle", "1:1").partition(":")
    idle = {k for k in fields if k.startswith("\tidle\t")}
    assert idle == {f"\tidle\t{k}" for k in range(int(k0), int(k1))}, (k0, k1, sorted(idle))
    for k in idle:
        last, _, turn_id = fields.pop(k).partition("\t")
        assert last.isdigit() and turn_id, ("idle turn", k)
    # A range field is `<turn id>\t<k>` beside its header (a layout-1 turn id may hold a tab).
    ranges = {
        k: v
        for k, v in fields.items()
        if re.fullmatch(r"(?s)(.*)\t\d+", k) and k.rpartition("\t")[0] in fields
    }
    # A turn's lease and the calls it remembers (`<turn id>\tlease`, `\tholds`, `\tdeltas`) live
    # and go with its header.
    extras = {
        k for k in fields if k not in ranges and re.fullmatch(r"(?s).*\t(lease|holds|deltas)", k)
    }
    for field in extras:
        assert field.rpartition("\t")[0] in fields, ("a turn's field outlives its record", field)
    headers = {k: v for k, v in fields.items() if k not in ranges and k not in extras}
    named = set()
    for turn_id, header in headers.items():
        if "|" in header:
            continue  # the earlier format, converted by the turn's next write
        turn = TurnHeader.parse(header)
        spans = []
        if turn.kept:
            for k in range(turn.k0, turn.k1):
                field = f"{turn_id}\t{k}"
                assert field in ranges, (turn_id, header, field)
                named.add(field)
                low, _, high = ranges[field].partition("-")
                spans.append((int(low), int(high)))
            spans.append((turn.a, turn.b))
        for (low, high), (next_low, _) in itertools.pairwise(spans):
            assert low <= high < next_low - 1, (turn_id, spans)
        sequences = [s for low, high in spans for s in range(low, high + 1)]
        assert turn.kept == len(sequences), (turn_id, header)
        after_start = [s for s in sequences if turn.start and s >= turn.start]
        assert turn.replies == len(after_start), (turn_id, header)
        assert turn.first == (after_start[0] if after_start else 0), (turn_id, header)
        assert turn.outcome != "open" or (turn.count, turn.first_seq, turn.last_seq) == (0, 0, 0), (
            turn_id,
            header,
        )
    assert set(ranges) == named, set(ranges) - named
