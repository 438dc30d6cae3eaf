"""The driver itself: it answers what is scripted, and fails readably on anything else."""

from __future__ import annotations

import socket

import pytest

from kvstore import errors
from kvstore._engine.core import Batch, Eval
from kvstore._engine.scripts import SCRIPTS

from .driver import batch, call, collect, drive, repeat

Failed = pytest.fail.Exception


def two_requests():
    """Sends a locate call and a Batch; returns both replies."""
    located = yield Eval(SCRIPTS["locate"], ("k",), ("seq", "1"))
    read = yield Batch([("HGET", "meta", "gen")])
    return located, read


def test_replies_go_back_in_order_and_the_result_comes_out():
    first, second = (
        call("locate", ("seq", "1"), reply=[1, 0]),
        batch([("HGET", "meta", "gen")], reply=[b"1"]),
    )
    assert drive(two_requests(), first, second) == ([1, 0], [b"1"])
    assert first.request.args == ("seq", "1") and second.request.commands == [
        ("HGET", "meta", "gen")
    ]


def test_a_reply_can_be_computed_from_the_request():
    result = drive(
        two_requests(),
        call("locate", reply=lambda r: list(r.args)),
        batch(reply=lambda r: len(r.commands)),
    )
    assert result == (["seq", "1"], 1)


def test_an_unscripted_request_fails_naming_it():
    with pytest.raises(Failed, match=r"request 2 was not scripted(.|\n)*HGET"):
        drive(two_requests(), call("locate", reply=[1]))


def test_a_request_other_than_the_next_step_fails_naming_both():
    with pytest.raises(
        Failed, match=r"call of append\.lua(.|\n)*expected: Eval append(.|\n)*sent: +Eval locate"
    ):
        drive(two_requests(), call("append"))
    with pytest.raises(Failed, match=r"targets is \[\('1',\)\], not \[\('2',\)\]"):
        drive(two_requests(), call("locate", {"targets": [("2",)]}))
    with pytest.raises(Failed, match=r"locate\.lua takes no argument target"):
        drive(two_requests(), call("locate", {"target": "1"}))
    with pytest.raises(Failed, match="commands differ"):
        drive(two_requests(), call("locate"), batch([("HGET", "meta", "last_seq")]))
    with pytest.raises(Failed, match="expected a Batch"):
        drive(two_requests(), batch())


def test_keys_other_than_the_threads_fail():
    with pytest.raises(Failed, match="not the thread's"):
        drive(two_requests(), call("locate"), batch(), keys=("other",))


def test_steps_left_over_fail_whether_the_operation_returns_or_raises():
    with pytest.raises(
        Failed, match=r"returned after 2 requests; 1 scripted steps never came(.|\n)*a Batch"
    ):
        drive(two_requests(), call("locate"), batch(), batch())
    with pytest.raises(Failed, match=r"raised MessageNotFound: gone after 1 requests"):
        drive(two_requests(), call("locate", error=errors.MessageNotFound("gone")), batch())


def test_a_thrown_error_reaches_the_operation():
    def catching():
        try:
            yield Eval(SCRIPTS["append"], (), ())
        except errors.InlineMediaBudget as over:
            return over.available

    assert drive(catching(), call("append", error=errors.InlineMediaBudget(5))) == 5


def test_repeat_answers_as_often_as_asked_and_counts():
    def polling():
        count = 0
        while (yield Batch([("GET", "x")])) != b"done":
            count += 1
        return count

    replies = iter([b"no", b"no", b"done"])
    step = batch(reply=lambda _: next(replies))
    assert drive(polling(), repeat(step)) == 2
    assert len(step.requests) == 3
    with pytest.raises(Failed, match="1 scripted steps never came"):
        drive(polling(), repeat(batch(reply=b"done"), times=2))


def test_collect_hands_out_the_outputs():
    def with_outputs():
        yield "first output"
        reply = yield Batch([("GET", "x")])
        yield reply
        return "done"

    assert collect(with_outputs(), batch(reply=b"v")) == ("done", ["first output", b"v"])


def test_the_layer_guard_refuses_a_connection():
    with socket.socket() as sock, pytest.raises(AssertionError, match="a unit test connected to"):
        sock.connect(("127.0.0.1", 9))
