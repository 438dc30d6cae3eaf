"""Input errors are raised before any request: each case is driven with no step scripted, so a
request sent first would fail the test as unscripted rather than raise the expected error."""

from __future__ import annotations

import pytest

from kvstore import StoreConfig, UserMessage, errors
from kvstore._engine import core
from kvstore._engine.core import MAX_LIMIT, ThreadRef, prepare_batch

from .driver import drive


@pytest.mark.parametrize("limit", [0, -1, MAX_LIMIT + 1, True, 2.0, "10", None])
def test_a_limit_out_of_range(thread, limit):
    with pytest.raises(errors.InvalidCursor, match="limit"):
        drive(core.list_page(thread, limit=limit))


@pytest.mark.parametrize("order", ["ASC", "newest", None])
def test_an_unknown_order(thread, order):
    with pytest.raises(errors.InvalidCursor, match="order"):
        drive(core.list_page(thread, order=order))


@pytest.mark.parametrize("side", ["after", "before"])
@pytest.mark.parametrize("cursor", [-1, True, 1.5, "", "m" * 257, b"m1", ["m1"]])
def test_a_bad_cursor(thread, side, cursor):
    with pytest.raises(errors.InvalidCursor, match=side):
        drive(core.list_page(thread, **{side: cursor}))


@pytest.mark.parametrize("side", ["after", "before"])
@pytest.mark.parametrize("turn_id", ["turn-1", ""])
def test_a_bad_cursor_is_named_before_the_turn_id(thread, side, turn_id):
    """The checks go in the order the caller reads the arguments: a page's cursors, then its
    turn id, with or without a turn."""
    with pytest.raises(errors.InvalidCursor, match=side):
        drive(core.list_page(thread, turn_id=turn_id, **{side: -1}))


@pytest.mark.parametrize("turn_id", ["", "a\tb", "a\nb", "a\0b", "t" * 257, 7])
def test_a_bad_turn_id(thread, turn_id):
    with pytest.raises(errors.InvalidMessage, match="turn_id"):
        drive(core.list_page(thread, turn_id=turn_id))
    with pytest.raises(errors.InvalidMessage, match="turn_id"):
        drive(core.start_turn(thread, turn_id))
    with pytest.raises(errors.InvalidMessage, match="turn_id"):
        drive(core.append(thread, UserMessage(content="x"), turn_id))
    with pytest.raises(errors.InvalidMessage, match="turn_id"):
        drive(core.remove_turn(thread, turn_id))


def test_an_unknown_outcome(thread):
    with pytest.raises(errors.InvalidMessage, match="outcome"):
        drive(core.finish_turn(thread, "turn-1", "done"))


@pytest.mark.parametrize("value", ["", None, 5])
def test_an_empty_or_non_str_id(thread, value):
    with pytest.raises(errors.InvalidCursor):
        drive(core.get(thread, value))
    with pytest.raises(errors.InvalidCursor):
        drive(core.get_by_otid(thread, value))
    with pytest.raises(errors.InvalidCursor):
        drive(core.replace(thread, value, UserMessage(content="x")))


def test_an_empty_batch(thread):
    with pytest.raises(errors.InvalidMessage, match="at least one"):
        drive(core.append(thread, [], None))


def test_one_message_object_twice_in_a_batch(thread):
    """The store gives the caller's message (a model or a dict) its id, so that sending it again
    is a replay: one object cannot hold the ids of two messages. Refused before anything is
    sent, the objects left as they were."""
    model = UserMessage(content="same")
    body = {"message_type": "user_message", "content": "same"}
    for batch in ([model, model], [body, UserMessage(content="other"), body]):
        with pytest.raises(errors.MessageIdRepeated, match="same object as message 0"):
            drive(core.append(thread, batch, None))
    assert model.id is None and "id" not in body


def test_a_batch_of_too_many_messages():
    thread = ThreadRef.of(StoreConfig(namespace="unit", max_batch_messages=3), "t")
    with pytest.raises(errors.BatchTooLarge, match="4 messages"):
        drive(core.append(thread, [UserMessage(content=str(i)) for i in range(4)], None))


def test_a_batch_of_too_many_bytes():
    thread = ThreadRef.of(StoreConfig(namespace="unit", max_batch_bytes=1000), "t")
    with pytest.raises(errors.BatchTooLarge, match="max_batch_bytes is 1000"):
        drive(core.append(thread, [UserMessage(content="x" * 400) for _ in range(3)], None))


def test_a_message_over_max_message_bytes():
    thread = ThreadRef.of(StoreConfig(namespace="unit", max_message_bytes=500), "t")
    with pytest.raises(errors.MessageTooLarge, match="max_message_bytes is 500"):
        drive(core.append(thread, UserMessage(content="x" * 600), None))
    with pytest.raises(errors.MessageTooLarge):
        drive(core.replace(thread, "m1", UserMessage(content="x" * 600)))


def test_an_inline_part_over_its_limit(config):
    thread = ThreadRef.of(
        StoreConfig(namespace="unit", max_inline_part_bytes=100, max_inline_media_bytes=1000), "t"
    )
    part = {
        "type": "image",
        "source": {"type": "base64", "data": "AAAA" * 50, "media_type": "image/png"},
    }
    with pytest.raises(errors.InlineMediaTooLarge):
        drive(core.append(thread, UserMessage(content=[part]), None))


@pytest.mark.parametrize(
    ("field", "value"),
    [("id", "a\tb"), ("id", ""), ("otid", "x\ny"), ("otid", "o" * 257)],
)
def test_a_bad_id_or_otid(thread, field, value):
    body = {"message_type": "user_message", "content": "x", field: value}
    with pytest.raises(errors.InvalidMessage):
        drive(core.append(thread, body, None))


def test_an_invalid_message(thread):
    with pytest.raises(errors.InvalidMessage, match="content"):
        drive(core.append(thread, {"message_type": "user_message"}, None))


def test_a_refused_batch_leaves_the_callers_messages_without_ids(config):
    given = [UserMessage(content="a"), UserMessage(content="b"), {"message_type": "user_message"}]
    with pytest.raises(errors.InvalidMessage):
        prepare_batch(config, given, None)
    assert given[0].id is None and given[1].id is None


def test_prepare_batch_gives_each_message_an_id_and_a_date(config):
    given = [
        UserMessage(content="a"),
        {"message_type": "user_message", "content": "b"},
        UserMessage(id="mine", content="c"),
    ]
    prepared = prepare_batch(config, given, "turn-1")
    ids = [item.message.id for item in prepared]
    assert ids[2] == "mine" and len(set(ids)) == 3
    assert given[0].id == ids[0] and given[1]["id"] == ids[1]
    assert all(item.message.date is not None for item in prepared)
    assert all(item.media == 0 for item in prepared)


def test_one_message_alone_is_prepared_as_a_batch_of_one(config):
    """A single message model (prepare_batch's shortcut) is checked, stamped and refused exactly
    as the same message in a list."""
    alone, listed = UserMessage(content="a", otid="o-1"), UserMessage(content="a", otid="o-1")
    ((one,), (same,)) = (
        prepare_batch(config, alone, "turn-1"),
        prepare_batch(config, [listed], "turn-1"),
    )
    assert alone.id == one.message.id and listed.id == same.message.id
    assert len(one.record) == len(same.record) and one.media == same.media
    assert one.tokens == same.tokens and one.message.date is not None
    small = StoreConfig(max_message_bytes=64, max_batch_bytes=64)
    for given in (UserMessage(content="x" * 100), [UserMessage(content="x" * 100)]):
        with pytest.raises(errors.MessageTooLarge, match="message 0"):
            prepare_batch(small, given, None)
    for given in (UserMessage(content="a"), [UserMessage(content="a")]):
        with pytest.raises(errors.InvalidMessage, match="turn_id"):
            prepare_batch(config, given, "bad\tturn")
        assert (given if isinstance(given, UserMessage) else given[0]).id is None
    for given in (UserMessage(id="bad\nid", content="a"), [UserMessage(id="bad\nid", content="a")]):
        with pytest.raises(errors.InvalidMessage, match="message id"):
            prepare_batch(config, given, None)


def test_unknown_fields_takes_keep_or_refuse():
    assert StoreConfig().unknown_fields == "keep"
    for value in ("strict", "", None, True):
        with pytest.raises(errors.ConfigError, match="unknown_fields must be 'keep' or 'refuse'"):
            StoreConfig(unknown_fields=value)


def test_unknown_fields_are_refused_before_any_request_in_a_refusing_store():
    thread = ThreadRef.of(StoreConfig(namespace="unit", unknown_fields="refuse"), "t-1")
    given = [
        UserMessage(content="a"),
        {"message_type": "user_message", "content": [{"text": "b", "colour": "red"}]},
    ]
    with pytest.raises(
        errors.UnknownField,
        match=r"message 1 \(user_message\) holds fields kvstore"
        r" does not know: content\[0\]\.colour",
    ) as caught:
        drive(core.append(thread, given, None))
    assert caught.value.fields == ["content[0].colour"]
    assert given[0].id is None  # refused before the ids are the call's token


def test_a_keeping_store_stores_unknown_fields_and_counts_their_bytes(config):
    plain, extra = prepare_batch(
        config,
        [
            {
                "message_type": "user_message",
                "content": "x",
                "id": "m-1",
                "date": "2024-01-01T00:00:00Z",
            },
            {
                "message_type": "user_message",
                "content": "x",
                "id": "m-1",
                "date": "2024-01-01T00:00:00Z",
                "colour": "r" * 100,
            },
        ],
        None,
    )
    assert extra.message.to_dict()["colour"] == "r" * 100
    assert len(extra.record) - len(plain.record) > 100


@pytest.mark.parametrize(
    "text",
    [
        '{"message_type": "user_message", "content": "hi"}',
        b'{"message_type": "user_message", "content": "hi"}',
    ],
)
def test_one_message_given_as_json_text_is_one_message(config, text):
    (prepared,) = prepare_batch(config, text, None)
    assert prepared.message.content == "hi"
