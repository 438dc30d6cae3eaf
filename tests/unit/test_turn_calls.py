"""hold_turn and publish: each call's id is made before the first send, one per call (or the
caller's), and an OutcomeUnknown names it for the retry."""

from __future__ import annotations

import pytest

from kvstore import errors
from kvstore._engine import core
from kvstore.events import TurnLease

from .driver import call, drive


def test_each_call_has_its_own_id_and_a_callers_id_is_sent_as_it_is(thread):
    sent = []
    for _ in range(2):
        step = call("start_turn", {"turn_id": "turn-1", "mode": "hold"}, reply=[1, 1])
        drive(core.hold_turn(thread, "turn-1"), step)
        sent.append(step.request.named()["call_id"])
        step = call("publish", {"turn_id": "turn-1"}, reply=b"2-0")
        drive(core.publish(thread, "turn-1", "Hel"), step)
        sent.append(step.request.named()["call_id"])
    assert len(set(sent)) == 4 and all(isinstance(c, str) and c for c in sent)
    step = call("start_turn", {"call_id": "request-7"}, reply=[1, 1])
    assert drive(core.hold_turn(thread, "turn-1", "request-7"), step) == TurnLease("turn-1", 1, 1)
    step = call("publish", {"call_id": "request-7:1"}, reply=b"2-0")
    assert drive(core.publish(thread, "turn-1", "Hel", "request-7:1"), step) == "2-0"


@pytest.mark.parametrize("bad", ["", "a\tb", "a\nb", "x" * 257, 7])
def test_a_bad_call_id_is_refused_before_the_socket(thread, bad):
    with pytest.raises(errors.InvalidMessage):
        drive(core.hold_turn(thread, "turn-1", bad))
    with pytest.raises(errors.InvalidMessage):
        drive(core.publish(thread, "turn-1", "Hel", bad))


def test_an_outcome_unknown_names_the_call_id_to_send_again(thread):
    step = call("start_turn", error=errors.OutcomeUnknown("lost"))
    with pytest.raises(errors.OutcomeUnknown) as raised:
        drive(core.hold_turn(thread, "turn-1"), step)
    assert raised.value.call_id == step.request.named()["call_id"]
    step = call("publish", error=errors.OutcomeUnknown("lost"))
    with pytest.raises(errors.OutcomeUnknown) as raised:
        drive(core.publish(thread, "turn-1", "Hel", "mine"), step)
    assert raised.value.call_id == "mine"
