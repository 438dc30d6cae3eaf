"""kvstore/_engine/replies.py: the scripts' replies and stored text values, read as typed values."""

from __future__ import annotations

import pytest

from kvstore import AssistantMessage, UserMessage, errors
from kvstore._engine.layout.formats import (
    ChunkEntry,
    LargeEntry,
    TurnHeader,
    manifest_tokens,
    side_tokens,
    split_chunk,
)
from kvstore._engine.replies import (
    AppendReply,
    CompactReply,
    DeleteReply,
    FinishTurnReply,
    MigrateReply,
    RemoveTurnReply,
    Replayed,
)
from kvstore._engine.tokens import estimated_tokens

from ..support.layout_check import read_layout

SMALL = dict(window_size=4, chunk_size=2, chunk_max_bytes=2048)


def test_what_the_scripts_store_parses(make_thread, raw_client):
    """Turn headers and index members as the real scripts write them."""
    thread = make_thread(**SMALL)
    thread.append(UserMessage(content="before"))
    start = thread.start_turn("t")
    first = thread.append([AssistantMessage(content=f"a{i}") for i in range(3)], turn_id="t")
    thread.append(UserMessage(content="between"))
    big = thread.append(AssistantMessage(content="B" * 3000), turn_id="t")  # its own chunk
    second = thread.append([AssistantMessage(content=f"b{i}") for i in range(2)], turn_id="t")
    ranges = (first[0].seq_id, first[-1].seq_id), (big[0].seq_id, second[-1].seq_id)

    open_turn = TurnHeader.parse(raw_client.hget(thread.keys.turns, "t"))
    assert open_turn == TurnHeader(
        start=start,
        outcome="open",
        kept=6,
        replies=6,
        first=first[0].seq_id,
        k0=1,
        k1=2,
        a=ranges[1][0],
        b=ranges[1][1],
        count=0,
        first_seq=0,
        last_seq=0,
    )
    assert raw_client.hget(thread.keys.turns, "t\t1") == f"{ranges[0][0]}-{ranges[0][1]}".encode()
    thread.finish_turn("t", "steered")
    finished = TurnHeader.parse(raw_client.hget(thread.keys.turns, "t"))
    assert (finished.outcome, finished.count, finished.first_seq, finished.last_seq) == (
        "steered",
        6,
        first[0].seq_id,
        second[-1].seq_id,
    )

    layout = read_layout(raw_client, thread.keys)
    chunks = [ChunkEntry.parse(m) for m in raw_client.zrange(thread.keys.chunk_index, 0, -1)]
    assert chunks and [c.first for c in chunks] == sorted(layout.chunks)
    for chunk in chunks:
        records = layout.chunks[chunk.first]
        assert (chunk.last, chunk.count, chunk.bytes, chunk.media) == (
            max(records),
            len(records),
            sum(map(len, records.values())),
            0,
        )
        manifest = raw_client.get(thread.keys.chunk_manifest(chunk.first))
        assert chunk.tokens == sum(manifest_tokens(manifest).values()) > 0
    (large,) = [LargeEntry.parse(m) for m in raw_client.zrange(thread.keys.large_index, 0, -1)]
    assert (large.sequence, large.bytes, large.media) == (
        big[0].seq_id,
        len(layout.large[big[0].seq_id]),
        0,
    )
    assert large.tokens == estimated_tokens(big[0])


@pytest.mark.parametrize(
    ("member", "tokens"),
    [
        (b"1:4:4:401:0:77", 77),  # a member written with counts
        (b"1:4:4:401:0", 101),  # written before counts existed: ceil(bytes / 4)
    ],
)
def test_a_chunk_member_with_or_without_tokens_parses(member, tokens):
    entry = ChunkEntry.parse(member)
    assert (entry.first, entry.last, entry.count, entry.bytes, entry.tokens) == (
        1,
        4,
        4,
        401,
        tokens,
    )


@pytest.mark.parametrize(
    ("side", "tokens"),
    [
        (b"m-1\t\t0\t120\t\t9", 9),
        (b"m-1\tot\t0\t121\tturn-1", 31),  # no count: ceil(121 / 4)
        (b"a%09b\t\t0\t40\t\t5\t%", 5),  # escaped, with a count
        (b"a%09b\t\t0\t40\t7\t%", 10),  # escaped, without: the turn may be all digits
    ],
)
def test_a_side_info_with_or_without_tokens_parses(side, tokens):
    assert side_tokens(side) == tokens
    assert split_chunk(b"3\t" + side + b"\n", b"x" * int(side.split(b"\t")[3])) == {
        3: b"x" * int(side.split(b"\t")[3])
    }


@pytest.mark.parametrize(
    "value",
    [
        b"1:2:3:4",
        b"1:2:3:4:5:6:7",
        b"1:2:x:4:5",
        b"1:2:3:4:-5",
        b"",
        b"1::3:4:5",
        "1:2:3:4:5 ",
        b"1:2:3:4:5:",
    ],
)
def test_a_malformed_chunk_member_is_a_layout_error(value):
    with pytest.raises(errors.LayoutError, match="chunk index member"):
        ChunkEntry.parse(value)


@pytest.mark.parametrize(
    "value",
    [
        b"3|1-2,4-5",  # the earlier format: read by the scripts, converted by the turn's next write
        b"3:open:1:1:3:1:1:3:3:0:0",  # one field short
        b"3:op3n:1:1:3:1:1:3:3:0:0:0",
        b"3:open:1:1:3:1:1:3:3:0:0:0:9",
    ],
)
def test_a_malformed_turn_header_is_a_layout_error(value):
    with pytest.raises(errors.LayoutError, match="turn header"):
        TurnHeader.parse(value)


def test_replies_decode_by_name():
    assert AppendReply.decode([1, 7]) == AppendReply(True, 7, ())
    assert AppendReply.decode([0, 3, b"message-a", 4, b""]) == AppendReply(
        False, None, (Replayed(3, "message-a"), Replayed(4, None))
    )
    assert CompactReply.decode([0, 12, 0]) == CompactReply(False, 12, 0)
    assert FinishTurnReply.decode([0, 0, 0, 5, b"failed"]) == FinishTurnReply(
        0, None, None, 5, "failed"
    )
    assert RemoveTurnReply.decode([3, 0]) == RemoveTurnReply(3, 0)
    assert DeleteReply.decode(0) == DeleteReply(False)
    assert MigrateReply.decode([1, 3, 0, 0, 0]) == MigrateReply(1, 3, False, 0, 0)


@pytest.mark.parametrize(
    "decoder, reply",
    [
        (AppendReply, [1]),
        (AppendReply, [1, 2, 3]),
        (AppendReply, [0, 3]),
        (AppendReply, b"OK"),
        (CompactReply, [1, 2]),
        (FinishTurnReply, [1, 2, 3, 4]),
        (MigrateReply, 3),
        (DeleteReply, [1]),
    ],
)
def test_a_reply_of_another_shape_is_a_server_error_naming_the_script(decoder, reply):
    with pytest.raises(errors.ServerError, match=r"replied .*not the reply its header states"):
        decoder.decode(reply)


def test_a_chunk_written_by_the_scripts_splits_into_the_records_it_was_given(
    make_thread, raw_client
):
    """The manifest's writer (lua/includes/layout2_format.lua) and its reader (kvstore._engine.replies.split_chunk)
    agree on a chunk the real scripts wrote: every record, at its sequence, byte for byte."""
    from kvstore._engine.layout.formats import split_chunk
    from kvstore._engine.record import decode_records

    thread = make_thread("split", window_size=4, chunk_size=5)
    sent = [f"message {i} " + "x" * (i * 37) for i in range(20)]
    for text in sent:
        thread.append(UserMessage(content=text))
    firsts = [
        int(score)
        for _, score in raw_client.zrange(thread.keys.chunk_index, 0, -1, withscores=True)
    ]
    assert len(firsts) >= 2
    for first in firsts:
        manifest, data = raw_client.mget(
            thread.keys.chunk_manifest(first), thread.keys.chunk_data(first)
        )
        records = split_chunk(manifest, data)
        assert sorted(records) == list(range(first, first + len(records)))
        decoded = decode_records(sorted(records.items()))
        assert [m.content for m in decoded] == sent[first - 1 : first - 1 + len(records)]
    with pytest.raises(errors.RecordError):
        split_chunk(manifest, data + b"extra")
