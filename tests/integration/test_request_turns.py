"""thread.hold_turn_for(request): one turn per client otid, however often the request is sent —
stored once, finished once, a retry of a finished turn answers its result, a retry of an open one
takes it over and fences the earlier producer. Sync and async, on every server."""

from __future__ import annotations

import pytest

from kvstore import AssistantMessage, UserMessage, errors
from kvstore.request_turns import request_turn_id


def answer(thread, turn, text="hello"):
    thread.append(AssistantMessage(content=text, otid=f"{turn.turn_id}:answer"), turn_id=turn.lease)
    return thread.finish_turn(turn.lease)


def test_a_request_sent_twice_is_one_turn_answered_once(make_thread):
    thread = make_thread()
    first = thread.hold_turn_for(UserMessage(content="hi", otid="send-1"))
    assert first.turn_id == "turn-send-1" and first.lease.lease == 1 and not first.taken_over
    assert first.result is None and first.request.seq_id == 1
    done = answer(thread, first)
    again = thread.hold_turn_for(UserMessage(content="hi", otid="send-1"))
    assert again.lease is None and not again.taken_over
    assert again.result == done and done.reply_count == 1
    assert again.request.id == first.request.id and again.request.seq_id == 1
    assert [m.message_type for m in thread.list().messages] == ["user_message", "assistant_message"]
    assert thread.snapshot().turn.outcome == "completed"


def test_a_retry_of_an_open_turn_takes_it_over_and_fences_the_first(make_thread):
    thread = make_thread()
    first = thread.hold_turn_for({"message_type": "user_message", "content": "hi", "otid": "s-2"})
    thread.publish(first.lease, "hal")
    retry = thread.hold_turn_for(UserMessage(content="hi", otid="s-2"))
    assert retry.taken_over and retry.lease.lease == 2 and retry.turn_id == first.turn_id
    with pytest.raises(errors.TurnFenced):
        thread.publish(first.lease, "f")
    with pytest.raises(errors.TurnFenced):
        thread.append(AssistantMessage(content="stale"), turn_id=first.lease)
    with pytest.raises(errors.TurnFenced):
        thread.finish_turn(first.lease)
    assert answer(thread, retry).reply_count == 1
    assert [m.content for m in thread.list().messages][1:] == ["hello"]
    assert thread.stats().stored_messages == 2


def test_two_requests_are_two_turns(make_thread):
    thread = make_thread()
    one = thread.hold_turn_for(UserMessage(content="a", otid="x-1"))
    answer(thread, one)
    two = thread.hold_turn_for(UserMessage(content="b", otid="x-2"))
    assert two.turn_id == "turn-x-2" and two.lease.lease == 1 and two.request.seq_id == 3
    assert answer(thread, two).first_sequence == 4


def test_a_request_without_an_otid_is_refused_and_writes_nothing(make_thread):
    thread = make_thread()
    with pytest.raises(errors.InvalidMessage, match="otid"):
        thread.hold_turn_for(UserMessage(content="hi"))
    assert thread.stats().stored_messages == 0 and thread.snapshot().turn is None


def test_a_long_otid_names_a_turn_id_that_fits(make_thread):
    otid = "o" * 256
    assert request_turn_id(otid) == request_turn_id(otid) != request_turn_id("o" * 255 + "p")
    assert len(request_turn_id(otid)) <= 256
    thread = make_thread()
    turn = thread.hold_turn_for(UserMessage(content="hi", otid=otid))
    assert answer(thread, turn).reply_count == 1
    assert thread.hold_turn_for(UserMessage(content="hi", otid=otid)).result.reply_count == 1
