"""A str with no UTF-8 form (a lone surrogate, which Python strs may hold) in any argument a call
sends: a typed error before the socket, nothing written, sync and async. A key of a message's
metadata is among them: the JSON-mode dump would have written it as U+FFFD without a word."""

from __future__ import annotations

import pytest

from kvstore import AssistantMessage, UserMessage, errors

from ..support.owners import keyspace

BAD = "m\ud800"

CALLS = {
    "an append's turn id": lambda t: t.append(UserMessage(content="x"), turn_id=BAD),
    "a message's otid": lambda t: t.append(UserMessage(content="x", otid=BAD)),
    "a message's id": lambda t: t.append(UserMessage(id=BAD, content="x")),
    "a metadata key": lambda t: t.append(UserMessage(content="x", metadata={BAD: "v"})),
    "a metadata value": lambda t: t.append(UserMessage(content="x", metadata={"k": BAD})),
    "a message's content": lambda t: t.append(AssistantMessage(content=BAD)),
    "a page's after": lambda t: t.list(after=BAD),
    "a page's before": lambda t: t.list(before=BAD),
    "a page's turn": lambda t: t.list(turn_id=BAD),
    "get": lambda t: t.get(BAD),
    "get_by_otid": lambda t: t.get_by_otid(BAD),
    "replace's id": lambda t: t.replace(BAD, AssistantMessage(content="y")),
    "a fork's point": lambda t: t.fork("forked", at=BAD),
    "start_turn": lambda t: t.start_turn(BAD),
    "hold_turn": lambda t: t.hold_turn(BAD),
    "finish_turn": lambda t: t.finish_turn(BAD),
    "remove_turn": lambda t: t.remove_turn(BAD),
    "a published delta": lambda t: t.publish("held", "delta " + BAD),
    "a compaction's summary": lambda t: t.compact("summary " + BAD, 1),
    "a compaction's stats": lambda t: t.compact("summary", 1, stats={"note": BAD}),
    "a reply's text in a turn": lambda t: t.append(AssistantMessage(content=BAD), turn_id="held"),
    "a finished turn's outcome": lambda t: t.finish_turn("held", BAD),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_lone_surrogate_is_a_typed_error_and_writes_nothing(
    make_thread, raw_client, namespace, call
):
    thread = make_thread("unicode")
    thread.append(UserMessage(content="hello"))
    thread.start_turn("held")
    before = keyspace(raw_client, namespace)
    with pytest.raises((errors.InvalidMessage, errors.InvalidCursor)):
        CALLS[call](thread)
    assert keyspace(raw_client, namespace) == before
    # U+FFFD itself is a character like any other: stored and read back as given.
    (stored,) = thread.append(UserMessage(content="\ufffd", metadata={"k\ufffd": "\ufffd"}))
    assert thread.get(stored.id).metadata == {"k\ufffd": "\ufffd"}
