"""Counts of zero taken away: Lua 5.1 writes the negation of 0 as "-0", which Redis refuses as an
integer (Valkey takes it), so a script subtracting a zero count failed after its first writes.
Messages of 0 tokens are allowed (docs/HISTORY.md, "Counting tokens"); removing them, by
remove_turn or by retention, keeps every count right on each server."""

from __future__ import annotations

import pytest

from kvstore import AssistantMessage, StoreConfig, UserMessage

from ..support.layout_check import check_layout


def test_remove_turn_of_replies_counted_zero_tokens(make_thread, raw_client):
    thread = make_thread()
    thread.append(UserMessage(content="question", otid="q1"), tokens=[7])
    thread.start_turn("turn-1")
    replies = [AssistantMessage(content="a", otid="r1"), AssistantMessage(content="b", otid="r2")]
    thread.append(replies, tokens=[0, 0], turn_id="turn-1")
    assert thread.remove_turn("turn-1") == 2
    stats = thread.stats()
    assert (stats.stored_messages, stats.tokens) == (1, 7)
    assert [m.otid for m in thread.iter()] == ["q1"]
    # The removal happened whole: the event says so, and a retry removes nothing more.
    kinds = [fields[b"k"] for _, fields in raw_client.xrange(thread.keys.events)]
    assert kinds[-1] == b"turn_removed"
    assert thread.remove_turn("turn-1") == 0
    check_layout(raw_client, thread.keys, StoreConfig())


@pytest.mark.parametrize("tokens", [0, 3])
def test_retention_of_a_chunk_counted_zero_tokens(make_thread, raw_client, tokens):
    thread = make_thread(chunk_size=4, window_size=4, retained_message_limit=0)
    messages = [AssistantMessage(content=f"m{i}", otid=f"o{i}") for i in range(12)]
    thread.append(messages, tokens=[tokens] * 12)
    thread.append(UserMessage(content="latest", otid="last"), tokens=[5])
    thread.compact("summary of 1..12", 12, tokens=3)
    stats = thread.stats()
    assert stats.deleted_before_sequence == 13
    assert (stats.stored_messages, stats.tokens) == (2, 5 + 3)
    assert [(m.message_type, m.seq_id) for m in thread.iter()] == [
        ("user_message", 13),
        ("summary_message", 14),
    ]
    thread.append(UserMessage(content="more", otid="more"))
    check_layout(raw_client, thread.keys, StoreConfig(chunk_size=4, window_size=4))
