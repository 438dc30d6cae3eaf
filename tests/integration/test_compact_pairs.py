"""A compaction whose pair rule meets the current summary (docs/HISTORY.md, rule 2): the caller's
summary is stored covering what it can, or refused with InvalidSummaryRange and nothing written;
it never vanishes behind the old summary while the call reports success."""

from __future__ import annotations

import pytest

from kvstore import AssistantMessage, ToolCallMessage, ToolReturnMessage, UserMessage, errors


def call(call_id: str) -> ToolCallMessage:
    return ToolCallMessage(tool_call={"name": "book", "arguments": "{}", "tool_call_id": call_id})


def answer(call_id: str) -> ToolReturnMessage:
    return ToolReturnMessage(status="success", tool_call_id=call_id, tool_return="booked")


def user(text: str) -> UserMessage:
    return UserMessage(content=text)


def assistant(text: str) -> AssistantMessage:
    return AssistantMessage(content=text)


def kinds(messages) -> list[str]:
    return [m.message_type for m in messages]


def dump(raw_client, thread) -> dict:
    prefix = thread.keys.meta.rsplit(":", 1)[0]
    return {k: raw_client.dump(k) for k in raw_client.scan_iter(match=prefix + "*")}


def long_running_call(thread) -> None:
    """[1 user] [2 call c1] [3 assistant] S1 covering 1 at 4, [5 user] [6 assistant]
    [7 return c1] [8 assistant] [9 user]: c1 is the first message after S1's range."""
    thread.append([user("book a flight"), call("c1"), assistant("searching")])
    thread.compact("S1: a flight", 1)
    thread.append([user("also a hotel"), assistant("noted")])
    thread.append(answer("c1"))
    thread.append([assistant("flight booked"), user("thanks")])


def test_a_boundary_moved_onto_the_current_summary_is_refused(make_thread, raw_client):
    thread = make_thread(retained_message_limit=None)
    long_running_call(thread)
    before = dump(raw_client, thread)
    with pytest.raises(errors.InvalidSummaryRange, match=r"sequence 2 is answered at 7") as exc:
        thread.compact("S2: a flight and a hotel", 6)
    assert "not stored" in str(exc.value) and "last_sequence 6" in str(exc.value)
    assert dump(raw_client, thread) == before
    assert thread.stats().summary_last_sequence == 1
    # A replay of the compaction that stored S1 is still one.
    again = thread.compact("S1: a flight", 1)
    assert (again.seq_id, again.summary) == (4, "S1: a flight")
    assert thread.stats().stored_messages == 9
    # Through the answer, the pair is whole inside the summary: stored.
    stored = thread.compact("S2: a flight and a hotel", 7)
    assert stored.summary == "S2: a flight and a hotel" and stored.seq_id == 10
    assert thread.stats().summary_last_sequence == 7


def test_a_call_the_current_summary_covers_does_not_move_the_boundary(make_thread):
    thread = make_thread(retained_message_limit=None)
    thread.append([user("q"), call("c9"), assistant("waiting")])  # 1..3
    thread.compact("S1", 3)  # 4: covers c9 while it is open
    thread.append([user("more"), answer("c9"), assistant("done")])  # 5..7
    # Moving back cannot mend a pair the current summary split already: stored as asked.
    stored = thread.compact("S2 covers up to 5", 5)
    assert stored.summary == "S2 covers up to 5"
    assert thread.stats().summary_last_sequence == 5
    # context() brings the call back before its answer (rule 1).
    assert kinds(thread.context()) == [
        "summary_message",
        "tool_call_message",
        "assistant_message",
        "summary_message",
        "user_message",
        "tool_return_message",
        "assistant_message",
    ]


def test_only_calls_after_the_current_summary_move_the_boundary(make_thread):
    thread = make_thread(retained_message_limit=None)
    thread.append([user("q"), call("a"), assistant("waiting")])  # 1..3
    thread.compact("S1", 3)  # 4
    thread.append([user("more"), call("b"), assistant("x"), user("y")])  # 5..8
    thread.append([answer("a"), answer("b")])  # 9, 10
    stored = thread.compact("S2", 7)
    assert stored.summary == "S2"
    assert thread.stats().summary_last_sequence == 5  # before b, not before a


def test_a_moved_compaction_sent_again_is_a_replay(make_thread):
    thread = make_thread(retained_message_limit=None)
    thread.append([user("q"), assistant("a")])  # 1, 2
    thread.compact("S1", 1)  # 3
    thread.append([user("go"), call("c1"), assistant("working")])  # 4..6
    thread.append([answer("c1"), assistant("done")])  # 7, 8
    first = thread.compact("S2", 6)
    assert thread.stats().summary_last_sequence == 4
    # The same call again, and again with another text (a summary written anew): replays.
    assert thread.compact("S2", 6) == first
    assert thread.compact("S2, written again", 6) == first
    assert thread.stats().stored_messages == 9
