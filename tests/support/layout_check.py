"""Reads a thread's keys with raw commands and checks the layout's invariants (docs/LAYOUT.md):
layouts 2 and 3, a layout-1 thread's migration."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from dataclasses import field as dataclass_field

from kvstore._engine.layout.formats import ChunkEntry, LargeEntry, TurnHeader, side_tokens
from kvstore._engine.layout.keys import ThreadKeys
from kvstore.config import StoreConfig


@dataclass
class Layout:
    window: dict[int, bytes]
    chunks: dict[int, dict[int, bytes]]  # first sequence -> {sequence: record}
    large: dict[int, bytes]
    meta: dict[str, str]
    open: dict[int, bytes] = dataclass_field(default_factory=dict)  # the open chunk (layout 3)
    manifests: dict[int, bytes] = dataclass_field(
        default_factory=dict
    )  # first sequence -> its manifest
    hash_chunks: set[int] = dataclass_field(default_factory=set)  # chunks still in layout 2's hash

    def all_sequences(self) -> list[int]:
        sequences = list(self.window) + list(self.large) + list(self.open)
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


def split_records(name: str, manifest: bytes, data: bytes) -> dict[int, bytes]:
    """A chunk's records by sequence, cut from its data by its manifest (docs/LAYOUT.md)."""
    records, offset = {}, 0
    for line in manifest_lines(manifest):
        sequence, side = line.split("\t", 1)
        # id, otid, media, bytes, turn, tokens (none in a side info written before counts
        # existed); and "%" after them when the three texts are escaped.
        tabs = side.count("\t") - side.endswith("\t%")
        assert tabs == 5 or tabs == 4, f"{name}: {line!r}"
        size = int(side.split("\t")[3])
        records[int(sequence)] = data[offset : offset + size]
        offset += size
    assert offset == len(data), (
        f"{name}: the manifest lists {offset} bytes, the data holds {len(data)}"
    )
    assert list(records) == sorted(records), f"{name}: records out of order"
    return records


def read_chunk(client, keys: ThreadKeys, first: int) -> tuple[bytes, bytes, bool]:
    """A closed chunk's manifest, data and whether it is a layout-2 hash: exactly one of its two
    kinds exists (layout-3 strings `chunk:<first>:m`, `:d`; or the hash `chunk:<first>`)."""
    manifest, data = client.mget(keys.chunk_manifest(first), keys.chunk_data(first))
    fields = client.hgetall(keys.chunk(first)) if client.type(keys.chunk(first)) == b"hash" else {}
    if manifest is not None or data is not None:
        assert manifest is not None and data is not None, f"chunk {first}: one string of two"
        assert not fields, f"chunk {first} is both strings and a hash"
        return manifest, data, False
    assert set(fields) == {b"_m", b"d"}, f"chunk {first} holds {sorted(fields)}"
    return fields[b"_m"], fields[b"d"], True


def chunk_records(client, keys: ThreadKeys, first: int) -> dict[int, bytes]:
    """A closed chunk's records by sequence, of either kind."""
    manifest, data, _ = read_chunk(client, keys, first)
    return split_records(keys.chunk(first), manifest, data)


def read_layout(client, keys: ThreadKeys) -> Layout:
    meta = {k.decode(): v.decode() for k, v in client.hgetall(keys.meta).items()}
    window = {
        int(score): member for member, score in client.zrange(keys.window, 0, -1, withscores=True)
    }
    layout = Layout(window, {}, {}, meta)
    for index in (keys.chunk_index, keys.large_index):
        for _member, score in client.zrange(index, 0, -1, withscores=True):
            first = int(score)
            manifest, data, is_hash = read_chunk(client, keys, first)
            records = split_records(keys.chunk(first), manifest, data)
            layout.manifests[first] = manifest
            if is_hash:
                layout.hash_chunks.add(first)
            if index == keys.chunk_index:
                layout.chunks[first] = records
            else:
                assert list(records) == [first]
                layout.large[first] = records[first]
    manifest, data = client.mget(keys.open_manifest, keys.open_data)
    assert (manifest is None) == (data is None), "the open chunk has one string of two"
    if manifest is not None:
        assert manifest, "an empty open chunk is stored"
        layout.open = split_records(keys.open_manifest, manifest, data)
        layout.manifests[0] = manifest
    return layout


def manifest_sums(manifest: bytes) -> tuple[int, int, int]:
    """A manifest's media, bytes and tokens, summed over its lines."""
    media = nbytes = tokens = 0
    for line in manifest_lines(manifest):
        side = line.split("\t", 1)[1]
        media += int(side.split("\t")[2])
        nbytes += int(side.split("\t")[3])
        tokens += side_tokens(side.encode())
    return media, nbytes, tokens


def check_index(client, keys: ThreadKeys, config: StoreConfig, layout: Layout) -> None:
    """The chunk index matches the chunks exactly, each within its bounds."""
    for member in client.zrange(keys.chunk_index, 0, -1):
        entry = ChunkEntry.parse(member)
        fields = layout.chunks[entry.first]
        assert fields, f"chunk {entry.first} is listed but empty or missing"
        media, nbytes, tokens = manifest_sums(layout.manifests[entry.first])
        assert (entry.media, entry.bytes) == (media, nbytes), (member, media, nbytes)
        if member.count(b":") == 5:
            # A member written with counts sums its messages' counts (docs/LAYOUT.md).
            assert entry.tokens == tokens, (member, tokens)
        # Removed turns may leave holes, even at the edges; the key keeps its first sequence.
        assert entry.first <= min(fields) and max(fields) <= entry.last, (member, sorted(fields))
        assert len(fields) == entry.count and sum(map(len, fields.values())) == entry.bytes
        assert entry.count <= config.chunk_size
        # A message alone in its chunk may exceed the cap: a replace may grow it (docs/LAYOUT.md).
        assert entry.count == 1 or entry.bytes <= config.chunk_max_bytes, member
    for member in client.zrange(keys.large_index, 0, -1):
        entry = LargeEntry.parse(member)
        media, nbytes, tokens = manifest_sums(layout.manifests[entry.sequence])
        assert (entry.media, entry.bytes) == (media, nbytes), (member, media, nbytes)


def check_open(config: StoreConfig, layout: Layout) -> None:
    """The open chunk's meta frames it: first, last, count and sums (none when it is empty);
    it is newer than every closed chunk and every window message."""
    fields = ("open_first", "open_last", "open_count", "open_bytes", "open_media", "open_tokens")
    framed = tuple(int(layout.meta.get(name, 0)) for name in fields)
    manifest_bytes = int(layout.meta.get("open_manifest_bytes", 0))
    if not layout.open:
        assert framed == (0,) * 6 and manifest_bytes == 0, (framed, manifest_bytes)
        return
    media, nbytes, tokens = manifest_sums(layout.manifests[0])
    sequences = sorted(layout.open)
    assert framed == (sequences[0], sequences[-1], len(sequences), nbytes, media, tokens), framed
    assert manifest_bytes == len(layout.manifests[0]), (manifest_bytes, len(layout.manifests[0]))
    assert nbytes == sum(map(len, layout.open.values()))
    assert len(sequences) <= config.chunk_size
    assert len(sequences) == 1 or nbytes <= config.chunk_max_bytes, framed
    older = [*layout.window, *(max(records) for records in layout.chunks.values())]
    assert not older or max(older) < sequences[0], (max(older), sequences[0])


def check_containers(client, keys: ThreadKeys, config: StoreConfig, layout: Layout) -> None:
    """The containers agree with their indexes and with each other."""
    check_index(client, keys, config, layout)
    check_open(config, layout)
    # Normal chunks hold disjoint, ordered ranges; no window message lies in one (layout 2's
    # window is older than its chunks; a layout-3 thread's leftover window is older than the
    # chunks closed from the open chunk, newer than those made before).
    members = client.zrange(keys.chunk_index, 0, -1)
    ranges = sorted((entry.first, entry.last) for entry in map(ChunkEntry.parse, members))
    for (_, last), (next_first, _) in itertools.pairwise(ranges):
        assert last < next_first
    for first, last in ranges:
        assert not [s for s in layout.window if first <= s <= last], (first, last)
    if layout.meta.get("layout") != "3" and ranges and layout.window:
        assert ranges[-1][1] < min(layout.window)
    # No chunk key exists that the index does not list: each chunk is its two strings or its hash.
    listed = set()
    for first in (*layout.chunks, *layout.large):
        kind = (keys.chunk(first),) if first in layout.hash_chunks else keys.chunk_keys(first)[1:]
        listed |= {key.encode() for key in kind}
    present = set(client.scan_iter(match=keys.chunk_prefix + "*", count=1000))
    prompt = {keys.prompt_manifest.encode(), keys.prompt_data.encode()}
    if present & prompt:
        check_prompt(client, keys, layout)
        listed |= prompt
    assert present == listed, present ^ listed
    # Window side info covers exactly the window.
    assert {int(f) for f in client.hkeys(keys.window_side)} == set(layout.window)


def check_prompt(client, keys: ThreadKeys, layout: Layout) -> None:
    """The kept system prompt (lua/includes/prompt.lua): both strings, the manifest framing the
    records, at most 16 system messages in order below deleted_before, its run's state in meta."""
    manifest, data = client.get(keys.prompt_manifest), client.get(keys.prompt_data)
    assert manifest and data is not None, "the kept prompt has one string of two"
    records = split_records(keys.prompt_manifest, manifest, data)
    assert layout.meta.get("prompt") in ("open", "closed"), layout.meta.get("prompt")
    sequences = list(records)
    assert sequences == sorted(sequences) and len(sequences) <= 16, sequences
    assert sequences[-1] < int(layout.meta["deleted_before"]), sequences
    assert not set(sequences) & set(layout.all_sequences()), sequences
    for record in records.values():
        assert b"\xacmessage_type\xaesystem_message" in record[:40], record[:40]


def check_counters(client, keys: ThreadKeys, layout: Layout) -> None:
    """Counters agree with what is stored. A migrating layout-1 thread's legacy hash holds the
    messages not yet moved: they count in `stored` once the scan found its range
    (`legacy_last`), every field of it, and the range ends at or before `last_seq`."""
    sequences = layout.all_sequences()
    kept = len(sequences)
    legacy = legacy_sequences(client, keys) if layout.meta.get("layout") not in ("2", "3") else []
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
    media = sum(int(v.decode().split("\t")[2]) for v in client.hvals(keys.window_side))
    media += sum(manifest_sums(manifest)[0] for manifest in layout.manifests.values())
    assert int(layout.meta.get("media", 0)) == media
    records = [*layout.window.values(), *layout.large.values(), *layout.open.values()]
    records += [r for fields in layout.chunks.values() for r in fields.values()]
    assert int(layout.meta.get("bytes", 0)) == sum(map(len, records))
    assert int(layout.meta.get("window_bytes", 0)) == sum(len(r) for r in layout.window.values())
    # The token total is the messages' (a thread written before counts existed has none until
    # its next write; an index member without counts sums bytes_tokens of its bytes, as a side
    # info without counts does).
    if "tokens" in layout.meta:
        assert int(layout.meta["tokens"]) == index_tokens(client, keys, layout), layout.meta


def index_tokens(client, keys: ThreadKeys, layout: Layout) -> int:
    """The thread's tokens as the scripts sum them: the index members', the open chunk's and the
    window side infos'."""
    tokens = sum(ChunkEntry.parse(m).tokens for m in client.zrange(keys.chunk_index, 0, -1))
    tokens += sum(LargeEntry.parse(m).tokens for m in client.zrange(keys.large_index, 0, -1))
    tokens += sum(side_tokens(v) for v in client.hvals(keys.window_side))
    if 0 in layout.manifests:
        tokens += manifest_sums(layout.manifests[0])[2]
    return tokens


def check_layout(client, keys: ThreadKeys, config: StoreConfig) -> Layout:
    """Asserts every invariant of docs/LAYOUT.md that holds after any completed call."""
    layout = read_layout(client, keys)
    check_containers(client, keys, config, layout)
    check_counters(client, keys, layout)
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
    # A turn's lease, when it ends and the calls it remembers (`<turn id>\tlease`, `\texpires`,
    # `\tholds`, `\tdeltas`) live and go with its header.
    extras = {
        k
        for k in fields
        if k not in ranges and re.fullmatch(r"(?s).*\t(lease|expires|holds|deltas)", k)
    }
    for field in extras:
        assert field.rpartition("\t")[0] in fields, ("a turn's field outlives its record", field)
        if field.endswith("\texpires"):
            assert fields[field].isdigit(), ("a lease's end is the server's ms", field)
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


def to_hash_chunk(client, keys: ThreadKeys, first: int) -> None:
    """Turns a closed layout-3 chunk into the layout-2 hash it would be on a thread migrated from
    layout 2 (such chunks are kept and read forever), with the same deadline."""
    manifest, data = client.mget(keys.chunk_manifest(first), keys.chunk_data(first))
    assert manifest is not None and data is not None, f"chunk {first} is not in strings"
    deadline = client.pexpiretime(keys.chunk_data(first))
    client.delete(keys.chunk_manifest(first), keys.chunk_data(first))
    client.hset(keys.chunk(first), mapping={"_m": manifest, "d": data})
    if deadline > 0:
        client.pexpireat(keys.chunk(first), deadline)
