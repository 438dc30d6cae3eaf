"""Replacing the thread's current summary (the message compact() stored, named by meta's
summary_seq): by another summary it stays the summary; by a message of another type the thread
has no summary from then on, and context() shows every message still stored instead of hiding
the range the summary covered (docs/HISTORY.md, "Replacing the summary")."""

from __future__ import annotations

import pytest

from kvstore import AssistantMessage, SummaryMessage, UserMessage, errors
from kvstore.messages import HiddenReasoningMessage


def chat(thread, count: int) -> list:
    stored = []
    for i in range(count):
        kind = UserMessage if i % 2 == 0 else AssistantMessage
        stored += thread.append(kind(content=f"message {i + 1}"))
    return stored


def contents(messages) -> list[str]:
    return [getattr(m, "content", None) or getattr(m, "summary", None) for m in messages]


def test_a_summary_replaced_by_another_message_type_no_longer_hides_what_it_covered(
    make_thread,
):
    thread = make_thread()
    stored = chat(thread, 10)
    summary = thread.compact("the first six", last_sequence=6)
    later = chat(thread, 2)
    assert contents(thread.context()) == ["the first six", *contents(stored[6:]), *contents(later)]
    thread.replace(summary.id, UserMessage(content="not a summary any more"))
    # No summary now: every stored message is the context, the replaced one in its place.
    expected = [*contents(stored), "not a summary any more", *contents(later)]
    assert contents(thread.context()) == expected
    assert contents(thread.context(max_tokens=10**6)) == expected
    stats = thread.stats()
    assert stats.summary_last_sequence is None
    # A compaction again starts a new summary from anywhere.
    again = thread.compact("the first four", last_sequence=4)
    assert again.seq_id == later[-1].seq_id + 1
    assert contents(thread.context())[:2] == ["the first four", "message 5"]


def test_a_summary_replaced_by_a_summary_stays_the_summary(make_thread):
    thread = make_thread()
    stored = chat(thread, 8)
    summary = thread.compact("the first five", last_sequence=5)
    thread.replace(summary.id, SummaryMessage(summary="the first five, edited"))
    assert contents(thread.context()) == ["the first five, edited", *contents(stored[5:])]
    assert thread.stats().summary_last_sequence == 5


def test_an_adapter_tombstone_over_the_summary_keeps_the_history_readable(make_thread):
    # What an adapter's delete does to the message it deletes (a hidden reasoning message).
    thread = make_thread()
    stored = chat(thread, 6)
    summary = thread.compact("the first three", last_sequence=3)
    thread.replace(summary.id, HiddenReasoningMessage(state="omitted"))
    shown = [m for m in thread.context() if m.message_type != "hidden_reasoning_message"]
    assert contents(shown) == contents(stored)


def test_the_same_compaction_again_after_its_summary_was_replaced(make_thread):
    """The summary's id is made from the thread, the range and the text: the same compact()
    again finds that id taken by the replacement. It is not a replay of a summary any more;
    it stores nothing and says so (DuplicateMessageId), and a new text or range compacts."""
    thread = make_thread()
    stored = chat(thread, 8)
    summary = thread.compact("the first four", last_sequence=4)
    thread.replace(summary.id, UserMessage(content="no summary"))
    with pytest.raises(errors.DuplicateMessageId):
        thread.compact("the first four", last_sequence=4)
    assert thread.stats().summary_last_sequence is None
    assert contents(thread.context()) == [*contents(stored), "no summary"]
    again = thread.compact("the first four, again", last_sequence=4)
    assert contents(thread.context())[0] == "the first four, again"
    assert again.seq_id == summary.seq_id + 1


def test_a_withdrawn_summary_made_a_summary_again_is_no_replay_of_the_compaction(make_thread):
    """Withdrawn (replaced by a user message), then replaced by a summary again: that message
    is one more message of the history, not the thread's summary, so the same compact() again
    is no replay of it (nothing in the thread is summarized by it): DuplicateMessageId."""
    thread = make_thread()
    stored = chat(thread, 8)
    summary = thread.compact("the first four", last_sequence=4)
    thread.replace(summary.id, UserMessage(content="withdrawn"))
    thread.replace(summary.id, SummaryMessage(summary="the first four, edited"))
    with pytest.raises(errors.DuplicateMessageId):
        thread.compact("the first four", last_sequence=4)
    assert thread.stats().summary_last_sequence is None
    assert contents(thread.context()) == [*contents(stored), "the first four, edited"]


def test_a_compaction_replayed_after_another_went_further_still_returns_its_summary(make_thread):
    thread = make_thread()
    chat(thread, 8)
    first = thread.compact("the first four", last_sequence=4)
    thread.compact("the first six", last_sequence=6)
    again = thread.compact("the first four", last_sequence=4)
    assert (again.id, again.seq_id, again.summary) == (first.id, first.seq_id, first.summary)
