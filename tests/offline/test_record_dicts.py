"""Records read as dicts (kvstore/_engine/record_dicts.py) against the typed read
(record.decode_records): for every record, the same messages, the same unreadable records with
the same errors, and each dict handed out exactly what validation makes of it (its model equal to
the typed read's, its dump the dict itself)."""

from __future__ import annotations

import math

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstore import errors
from kvstore._engine.record import _pack_big_int, decode_records, encode_record
from kvstore._engine.record_dicts import _SHAPES, _date, decode_dicts, plain_body
from kvstore.messages import MESSAGE_ADAPTER, BaseMessage

KINDS = sorted(cls.model_fields["message_type"].default for cls in BaseMessage.__subclasses__())
FIELDS = sorted({name for cls in BaseMessage.__subclasses__() for name in cls.model_fields})
DATE = "2026-12-05T03:04:05.123456Z"


def pack(value) -> bytes:
    return msgpack.packb(value, use_bin_type=True, default=_pack_big_int)


def dump(message) -> dict:
    return MESSAGE_ADAPTER.dump_python(message, mode="json", exclude_none=True)


def assert_same_reads(entries) -> None:
    """decode_dicts and decode_records agree on `entries`, both error modes."""
    typed_errors: list[errors.RecordError] = []
    dict_errors: list[errors.RecordError] = []
    typed = decode_records(entries, typed_errors)
    read = decode_dicts(entries, dict_errors)
    assert [(e.sequence, str(e)) for e in dict_errors] == [
        (e.sequence, str(e)) for e in typed_errors
    ]
    assert len(read) == len(typed)
    for message, model in zip(read, typed, strict=True):
        if type(message) is dict:
            assert MESSAGE_ADAPTER.validate_python(message) == model
            # Validation kept every value as it was (a null unknown field is kept, not dumped).
            assert dump(model) == {k: v for k, v in message.items() if v is not None}
        else:
            assert message == model
    if typed_errors:  # without a list to report into, the same error is raised
        with pytest.raises(errors.RecordError) as typed_raised:
            decode_records(entries)
        with pytest.raises(errors.RecordError) as raised:
            decode_dicts(entries)
        assert str(raised.value) == str(typed_raised.value)
        assert raised.value.sequence == typed_raised.value.sequence
    else:
        assert len(decode_dicts(entries)) == len(typed)


# ------------------------------------------------------------------ values, valid and not

text = st.text(max_size=12)  # every plane, no lone surrogate (msgpack cannot pack one)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    text,
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
dates = st.one_of(
    st.just(DATE),
    st.just("2026-12-05T03:04:05Z"),
    st.just("2026-12-05T03:04:05+00:00"),
    st.just("2026-02-30T03:04:05Z"),
    st.just("2026-12-05 03:04:05Z"),
    st.just("2026-12-05T03:04:05.12345Z"),
    st.integers(min_value=0, max_value=2**40),
    text,
)
text_parts = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "text", None, "image"]), "text": text | st.integers()},
    optional={"signature": text, "extra": json_values},
)
sources = st.one_of(
    st.fixed_dictionaries({"type": st.just("url"), "url": text}, optional={"detail": text}),
    st.fixed_dictionaries(
        {"type": st.just("base64"), "data": text, "media_type": text},
        optional={"detail": text | st.none(), "more": text},
    ),
    st.fixed_dictionaries({"type": st.just("letta"), "file_id": text}),
    st.fixed_dictionaries({"url": text}),
)
image_parts = st.fixed_dictionaries({"type": st.just("image"), "source": sources})
contents = st.one_of(text, st.lists(text_parts | image_parts, max_size=3), st.integers())
tool_calls = st.fixed_dictionaries(
    {"arguments": text, "name": text, "tool_call_id": text}, optional={"index": st.integers()}
) | st.fixed_dictionaries({"name": text})
metadata = st.dictionaries(
    st.text(max_size=70), st.text(max_size=3) | st.integers(), max_size=18
) | st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)
literals = st.sampled_from(
    ["success", "error", "redacted", "omitted", "completed", "reasoner_model", "compaction", "x"]
)

FIELD_VALUES = {
    "date": dates,
    "completed_at": dates,
    "content": contents,
    "metadata": metadata,
    "tool_call": tool_calls,
    "tool_calls": st.lists(tool_calls, max_size=2) | tool_calls,
    "seq_id": st.integers(),
    "is_err": st.booleans() | st.integers(0, 1),
    **dict.fromkeys(["status", "state", "source", "event_type"], literals),
}


@st.composite
def bodies(draw) -> dict:
    """A message dict of any type with any of its fields (or none, or a wrong one), unknown
    fields among them: valid or not, as a record could hold it."""
    body = {"message_type": draw(st.sampled_from([*KINDS, "bogus"]) | scalars)}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=7, unique=True)):
        value = FIELD_VALUES.get(name, text | st.none() | json_values)
        body[name] = draw(value | st.none() if draw(st.booleans()) else value)
    for name in draw(st.lists(text, max_size=2, unique=True)):
        body.setdefault(name, draw(json_values))
    return body


good_text_parts = st.fixed_dictionaries({"type": st.just("text"), "text": text})
good_sources = st.fixed_dictionaries({"type": st.just("url"), "url": text}) | st.fixed_dictionaries(
    {"type": st.just("base64"), "data": text, "media_type": text}, optional={"detail": text}
)
good_call = st.fixed_dictionaries({"arguments": text, "name": text, "tool_call_id": text})
GOOD = {
    "system_message": {"content": text},
    "user_message": {
        "content": text
        | st.lists(
            good_text_parts
            | st.fixed_dictionaries({"type": st.just("image"), "source": good_sources}),
            max_size=3,
        )
    },
    "assistant_message": {"content": text | st.lists(good_text_parts, max_size=3)},
    "reasoning_message": {"reasoning": text},
    "hidden_reasoning_message": {"state": st.sampled_from(["redacted", "omitted"])},
    "tool_call_message": {"tool_call": good_call},
    "tool_return_message": {
        "status": st.sampled_from(["success", "error"]),
        "tool_call_id": text,
        "tool_return": text,
    },
    "summary_message": {"summary": text},
}
GOOD_BASE = {
    "id": text,
    "otid": text,
    "name": text,
    "date": st.sampled_from([DATE, "2026-12-05T03:04:05Z"]),
    "metadata": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    "is_err": st.booleans(),
}


@st.composite
def near_valid_bodies(draw) -> dict:
    """A valid message dict of a common type (unknown fields among its fields), then, half the
    time, one field changed: to another value of any kind, null, or removed."""
    kind = draw(st.sampled_from(sorted(GOOD)))
    body = {"message_type": kind, **draw(st.fixed_dictionaries(GOOD[kind], optional=GOOD_BASE))}
    body.update(draw(st.dictionaries(text, json_values, max_size=2)))
    if draw(st.booleans()):
        name = draw(st.sampled_from(sorted(set(body) | set(FIELDS))))
        if draw(st.booleans()):
            body.pop(name, None)
        else:
            body[name] = draw(FIELD_VALUES.get(name, json_values) | st.none() | json_values)
    return body


@st.composite
def records(draw) -> bytes:
    body = draw(bodies() | near_valid_bodies())
    shape = draw(st.sampled_from(["plain", "turn", "bad turn", "version", "junk", "json"]))
    if shape == "plain":
        return pack([2, body])
    if shape == "turn":
        return pack([2, body, draw(text)])
    if shape == "bad turn":
        return pack([2, body, draw(st.integers())])
    if shape == "version":
        return pack([draw(st.sampled_from([1, 3, 2.0, True, "2"])), body])
    if shape == "junk":
        return draw(st.binary(max_size=12))
    return b"{" + draw(st.binary(max_size=12))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(), min_size=1, max_size=8))
def test_any_records_read_the_same_as_dicts_and_as_models(found):
    assert_same_reads([(sequence, record) for sequence, record in enumerate(found, 1)])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies() | near_valid_bodies())
def test_a_body_the_check_vouches_for_validates_unchanged(body):
    body["seq_id"] = 1
    if plain_body(body):
        kept = {k: v for k, v in body.items() if v is not None}
        assert dump(MESSAGE_ADAPTER.validate_python(body)) == kept


# ------------------------------------------------------------------ the common shapes go fast

UNKNOWN = {"openai_item": {"type": "message", "role": "user", "content": "hé ✓ 你好 🎉", "n": 2.5}}
STAMPS = {"id": "message-1", "otid": "o-1", "date": DATE}
FAST = [
    {"message_type": "user_message", "content": "hi ✓ 你好", **UNKNOWN},
    {
        "message_type": "user_message",
        "content": [
            {"type": "text", "text": "look"},
            {"type": "image", "source": {"type": "url", "url": "https://e.x/a.png"}},
            {"type": "image", "source": {"type": "base64", "data": "QUFB", "media_type": "i/p"}},
            {
                "type": "image",
                "source": {"type": "base64", "data": "QQ==", "media_type": "i/p", "detail": "low"},
            },
        ],
        "metadata": {"source": "langchain", "k": "v"},
        "name": "ann",
    },
    {
        "message_type": "assistant_message",
        "content": [{"type": "text", "text": "a", "signature": "s"}],
    },
    {"message_type": "assistant_message", "content": "plain", "step_id": "st", "run_id": "r"},
    {"message_type": "system_message", "content": "be brief", "is_err": False},
    {
        "message_type": "tool_call_message",
        "tool_call": {"name": "w", "arguments": "{}", "tool_call_id": "c1"},
        "tool_calls": [
            {"name": "w", "arguments": "{}", "tool_call_id": "c1"},
            {"name": "v", "arguments": '{"a": 1}', "tool_call_id": "c2"},
        ],
    },
    {
        "message_type": "tool_return_message",
        "status": "error",
        "tool_call_id": "c",
        "tool_return": "x",
    },
    {"message_type": "reasoning_message", "reasoning": "r", "source": "reasoner_model"},
    {"message_type": "hidden_reasoning_message", "state": "omitted", "hidden_reasoning": "web"},
    {"message_type": "summary_message", "summary": "so far"},
]
SLOW = [
    {"message_type": "user_message", "content": [{"type": "image", "source": {"file_id": "f"}}]},
    {"message_type": "user_message", "content": [{"text": "no type"}]},
    {"message_type": "user_message", "content": "x", "status": "completed"},
    {"message_type": "user_message", "content": "x", "attachments": [{"file_id": "f"}]},
    {"message_type": "event_message", "event_type": "compaction", "event_data": {"a": 1}},
    {"message_type": "approval_response_message", "approve": True},
    {"message_type": "tool_call_message", "tool_call": {"name": "w"}},
    {"message_type": "summary_message", "summary": "s", "compaction_stats": None},
    {"message_type": "assistant_message", "content": "x", "metadata": {"k": "v" * 513}},
    {"message_type": "assistant_message", "content": "x", "odd": {1: "an int key"}},
    {"message_type": "assistant_message", "content": "x", "nan": [math.nan]},
]


@pytest.mark.parametrize("body", FAST, ids=lambda b: b["message_type"])
def test_common_shapes_come_back_as_their_stored_dicts(body):
    record = encode_record({**body, **STAMPS}, turn_id="t-1")
    (read,) = decode_dicts([(7, record)])
    assert type(read) is dict and read == {**body, **STAMPS, "seq_id": 7}
    assert_same_reads([(7, record)])


@pytest.mark.parametrize("body", SLOW, ids=lambda b: b["message_type"])
def test_other_shapes_are_validated_as_the_typed_read_does(body):
    record = pack([2, {**body, **STAMPS}])
    (read,) = decode_dicts([(3, record)], []) or [None]
    assert type(read) is not dict
    assert_same_reads([(3, record)])


def test_dates_the_check_reads_as_they_are_validated():
    for value in (DATE, "2026-12-05T03:04:05Z", "2024-02-29T23:59:59.000001Z"):
        assert _date(value) and dump(MESSAGE_ADAPTER.validate_python(_user(value)))["date"] == value
    for value in ("2026-02-30T03:04:05Z", "2026-12-05T24:00:00Z", "2026-12-05T03:04:05+00:00",
                  "2026-12-05T03:04:0５Z", "20261205T030405Z", 5, None):  # fmt: skip
        assert not _date(value)


def _user(date: str) -> dict:
    return {"message_type": "user_message", "content": "x", "date": date}


def test_the_shape_memo_is_bounded():
    for n in range(1500):
        plain_body({"message_type": "user_message", "content": "x", f"k{n}": 1})
    assert 0 < len(_SHAPES) <= 1024
