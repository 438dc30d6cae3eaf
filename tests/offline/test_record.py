"""Unit tests of kvstore._engine.record: the stored record's layout, versions, and hostile bytes."""

from __future__ import annotations

import contextlib
import json

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore._engine.record import (
    RECORD_VERSION,
    Salvaged,
    decode_records,
    encode_message,
    encode_record,
    record_turn_id,
    salvage,
)
from kvstore.errors import InvalidMessage, RecordError
from kvstore.messages import (
    AssistantMessage,
    CompactionStats,
    EventMessage,
    SummaryMessage,
    SystemMessage,
    TextContent,
    ToolReturnMessage,
    UserMessage,
    parse_message,
)

USER = UserMessage(id="message-1", date="2024-05-01T12:00:00Z", content="hello", seq_id=9)


def _packed(*fields: object) -> bytes:
    return msgpack.packb(list(fields), use_bin_type=True)


def test_record_is_a_compact_msgpack_array_without_seq_id() -> None:
    record = encode_record(USER)
    assert msgpack.unpackb(record, raw=False) == [
        RECORD_VERSION,
        {
            "message_type": "user_message",
            "id": "message-1",
            "date": "2024-05-01T12:00:00Z",
            "content": "hello",
        },
    ]
    assert record[0] == 0x92  # fixarray of two


def test_record_carries_the_turn_id() -> None:
    record = encode_record(USER, turn_id="turn-7")
    assert record[0] == 0x93
    assert msgpack.unpackb(record, raw=False)[2] == "turn-7"
    assert record_turn_id(record) == "turn-7"
    assert record_turn_id(encode_record(USER)) is None


def test_strings_are_stored_as_msgpack_str_never_bin() -> None:
    record = encode_record(UserMessage(content="héllo ✓"))
    # raw=True would return bytes for str; bin would come back as bytes even with raw=False
    assert isinstance(msgpack.unpackb(record, raw=False)[1]["content"], str)
    with pytest.raises(ValueError):
        msgpack.unpackb(record, raw=False, max_bin_len=0, max_str_len=0)


def test_decoder_sets_seq_id_from_the_entry_not_the_record() -> None:
    records = [(5, encode_record(USER)), (6, encode_record(SystemMessage(content="s"), "turn-1"))]
    decoded = decode_records(records)
    assert [message.seq_id for message in decoded] == [5, 6]
    assert decoded[0] == USER.model_copy(update={"seq_id": 5})
    assert isinstance(decoded[1], SystemMessage)


def test_decode_of_no_entries_is_empty() -> None:
    assert decode_records([]) == []


def test_version_2_string_content_stays_a_string() -> None:
    [decoded] = decode_records([(1, encode_record(AssistantMessage(content="plain")))])
    assert decoded.content == "plain"


def test_encoded_size_is_len_of_the_record() -> None:
    big = UserMessage(content="x" * 100_000)
    assert 100_000 < len(encode_record(big)) < 100_100  # no size limit is applied here


def test_message_that_cannot_be_encoded_is_an_invalid_message_naming_the_field() -> None:
    with pytest.raises(InvalidMessage, match=r"cannot be encoded: content: .*surrogates"):
        encode_record(UserMessage(content="lone \ud800 surrogate"))
    parts = UserMessage(content=[TextContent(text="fine"), TextContent(text="lone \ud800")])
    with pytest.raises(InvalidMessage, match=r"cannot be encoded: content\[1\]\.text: "):
        encode_record(parts)
    stats = CompactionStats(
        context_window=2**4096, messages_count_after=1, messages_count_before=2, trigger="t"
    )
    with pytest.raises(
        InvalidMessage,
        match=r"compaction_stats\.context_window: an integer of 4097 bits; at most 4096",
    ):
        encode_record(SummaryMessage(summary="s", compaction_stats=stats))
    with pytest.raises(InvalidMessage, match="cannot be encoded: turn_id: "):
        encode_record(USER, turn_id="lone \ud800")


# --- what is encoded is validated ---------------------------------------------------------------


def test_encode_message_returns_the_validated_copy_that_the_record_holds() -> None:
    message = UserMessage(content=[TextContent(text="hi")], metadata={"k": "v"}, seq_id=4)
    stored, record = encode_message(message, "turn-1")
    assert stored == message.model_copy(update={"seq_id": None})
    assert stored.metadata is not message.metadata and stored.content is not message.content
    [decoded] = decode_records([(4, record)])
    assert decoded == stored.model_copy(update={"seq_id": 4})
    assert encode_message(message.to_dict(), "turn-1") == (stored, record)


def test_encode_message_validates_the_dump_not_the_object() -> None:
    message = UserMessage(content="x", metadata={})
    message.metadata.update({f"k{i}": "v" for i in range(17)})  # validate_assignment cannot see it
    with pytest.raises(InvalidMessage, match=r"metadata: .*17 pairs"):
        encode_message(message)
    message = UserMessage(content=[TextContent(text="x")])
    message.content[0].text = 5
    with pytest.raises(InvalidMessage, match=r"content\[0\]\.text: "):
        encode_message(message)
    message = UserMessage(content="x")
    message.__dict__["date"] = object()
    with pytest.raises(InvalidMessage, match="cannot be encoded: date: "):
        encode_message(message)


def test_encode_message_edits_the_dump_before_it_is_validated() -> None:
    def stamp(body: dict) -> None:
        body["id"] = "message-7"
        body.setdefault("date", "2024-05-01T12:00:00Z")

    stored, record = encode_message({"message_type": "user_message", "content": "x"}, None, stamp)
    assert (stored.id, stored.date.isoformat()) == ("message-7", "2024-05-01T12:00:00+00:00")
    assert decode_records([(1, record)])[0].id == "message-7"
    with pytest.raises(InvalidMessage, match="id: "):
        encode_message(USER, None, lambda body: body.update(id=7))


# --- version 1 ----------------------------------------------------------------------------------


def test_version_1_json_record_reads_string_content_as_one_text_part() -> None:
    v1 = json.dumps(
        {
            "message_type": "user_message",
            "id": "message-old",
            "date": "2023-01-01T00:00:00",
            "content": "hi there",
        }
    ).encode()
    [decoded] = decode_records([(3, v1)])
    assert isinstance(decoded, UserMessage)
    assert decoded.content == [TextContent(text="hi there")]
    assert decoded.seq_id == 3
    assert decoded.to_dict()["content"] == [{"type": "text", "text": "hi there"}]
    assert record_turn_id(v1) is None


def test_version_1_assistant_content_becomes_a_text_part_and_tool_returns_stay() -> None:
    assistant = json.dumps(
        {"message_type": "assistant_message", "content": "answer", "name": None}
    ).encode()
    tool = json.dumps(
        {
            "message_type": "tool_return_message",
            "status": "success",
            "tool_call_id": "c",
            "tool_return": "out",
            "tool_returns": [{"status": "success", "tool_call_id": "c", "tool_return": "out"}],
        }
    ).encode()
    system = json.dumps({"message_type": "system_message", "content": "rules"}).encode()
    decoded = decode_records([(1, assistant), (2, tool), (3, system)])
    assert decoded[0].content == [TextContent(text="answer")]
    assert isinstance(decoded[1], ToolReturnMessage)
    assert decoded[1].tool_return == "out"
    assert decoded[1].tool_returns[0].tool_return == "out"
    assert decoded[2].content == "rules"


def test_version_1_and_2_records_mix_in_one_page() -> None:
    v1 = b'{"message_type": "user_message", "content": "old"}'
    decoded = decode_records([(1, v1), (2, encode_record(UserMessage(content="new")))])
    assert [message.content for message in decoded] == [[TextContent(text="old")], "new"]


# --- hostile and broken records -----------------------------------------------------------------

GOOD = encode_record(UserMessage(content="fine"))


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (b"\x91" * 100_000 + b"\xc0", r"sequence 7 is not valid msgpack: nested too deep"),
        (GOOD[:-3], r"sequence 7 is not valid msgpack"),
        (GOOD + b"\x00", r"sequence 7 is not valid msgpack"),
        (b"", r"sequence 7 is not valid msgpack"),
        (_packed(3, {"message_type": "user_message", "content": "x"}), r"sequence 7 has version 3"),
        (
            _packed(True, {"message_type": "user_message", "content": "x"}),
            r"sequence 7 has version True",
        ),
        (_packed(2), r"sequence 7 is not a \[version, message, turn_id\?\] array"),
        (_packed(2, {}, "t", "extra"), r"sequence 7 is not a \[version"),
        (_packed({"message_type": "user_message"}), r"sequence 7 is not a \[version"),
        (_packed(2, ["not", "a", "dict"]), r"sequence 7 holds a list, not a message"),
        (
            _packed(2, {"message_type": "user_message", "content": "x"}, 5),
            r"sequence 7 has a int turn id",
        ),
        (
            _packed(2, {"message_type": "user_message"}),
            r"sequence 7 does not hold a valid message: content: Field required",
        ),
        (
            _packed(2, {"message_type": "user_message", "content": [{"type": "text"}]}),
            r"content\[0\]\.text: Field required",
        ),
        (
            _packed(2, {"message_type": "nope"}),
            r"sequence 7 does not hold a valid message: message_type: Input tag 'nope'",
        ),
        (
            msgpack.packb(
                [2, {"message_type": "user_message", "content": b"raw"}], use_bin_type=True
            ),
            r"not valid msgpack",
        ),
        (msgpack.packb([2, msgpack.ExtType(5, b"x")]), r"not valid msgpack"),
        (b"{not json", r"version-1 record at sequence 7 is not valid JSON"),
        (
            b'{"content": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            r"version-1 record at sequence 7 is not valid JSON: recursion limit",
        ),
        (
            b'{"message_type": "user_message", "content": 5, "seq": 1}',
            r"sequence 7 does not hold a valid message: content: ",
        ),
        (msgpack.packb([2, msgpack.ExtType(1, b"")]), r"sequence 7 holds a int, not a message"),
    ],
)
def test_bad_record_is_a_record_error_naming_its_sequence(record: bytes, expected: str) -> None:
    with pytest.raises(RecordError, match=expected):
        decode_records([(1, GOOD), (7, record), (8, GOOD)])


def test_bad_record_error_carries_its_sequence() -> None:
    for record in (b"\xc1", _packed(2, {"message_type": "user_message"})):
        with pytest.raises(RecordError) as raised:
            decode_records([(1, GOOD), (7, record), (8, GOOD)])
        assert raised.value.sequence == 7


BAD_ONES = [
    b"\xc1",
    _packed(
        2,
        {
            "message_type": "user_message",
            "content": "x",
            "metadata": {str(i): "v" for i in range(17)},
        },
    ),
    b'{"message_type": "user_message"}',
    _packed(3, {}),
]


def test_given_a_list_bad_records_are_skipped_and_named_in_order() -> None:
    entries = [(1, GOOD)]
    for offset, record in enumerate(BAD_ONES):
        entries += [(10 + 2 * offset, record), (11 + 2 * offset, GOOD)]
    unreadable: list[RecordError] = []
    decoded = decode_records(entries, unreadable)
    assert [m.seq_id for m in decoded] == [1, 11, 13, 15, 17]
    assert [e.sequence for e in unreadable] == [10, 12, 14, 16]
    assert all(f"sequence {e.sequence}" in str(e) for e in unreadable)
    assert "metadata" in str(unreadable[1])
    # Read alone, each good record is the same message.
    assert decoded == [decode_records([e])[0] for e in entries if e[1] == GOOD]


def test_given_a_list_a_page_of_bad_records_only_reads_as_empty() -> None:
    unreadable: list[RecordError] = []
    assert decode_records(list(enumerate(BAD_ONES, start=3)), unreadable) == []
    assert [e.sequence for e in unreadable] == [3, 4, 5, 6]


def test_salvage_reads_what_it_can_and_never_raises() -> None:
    record = encode_record(USER.model_copy(update={"otid": "o-1"}), "turn-1")
    assert salvage(record) == Salvaged("o-1", "2024-05-01T12:00:00Z", "turn-1")
    invalid = _packed(
        2, {"message_type": "user_message", "otid": "o-2", "date": 1714564800, "metadata": 5}, "t"
    )
    assert salvage(invalid) == Salvaged("o-2", "2024-05-01T12:00:00Z", "t")
    assert salvage(b'{"otid": "o-3", "date": "yesterday"}') == Salvaged("o-3", None, None)
    assert salvage(_packed(2, {"otid": 5, "date": [1]}, 7)) == Salvaged(None, None, None)
    for junk in (b"", b"\xc1", b"\x91" * 100_000 + b"\xc0", _packed("abc"), b"{", _packed(2, [1])):
        assert salvage(junk) == Salvaged(None, None, None)


@settings(max_examples=300, deadline=None)
@given(record=st.binary(max_size=200))
def test_random_bytes_never_escape_as_anything_but_record_error(record: bytes) -> None:
    with contextlib.suppress(RecordError):
        decode_records([(1, record)])
    with contextlib.suppress(RecordError):
        record_turn_id(record)
    unreadable: list[RecordError] = []
    assert len(decode_records([(1, record), (2, GOOD)], unreadable)) + len(unreadable) == 2
    assert isinstance(salvage(record), Salvaged)


@settings(max_examples=200, deadline=None)
@given(cut=st.integers(0, len(GOOD) - 1))
def test_every_truncation_of_a_record_is_a_record_error(cut: int) -> None:
    with pytest.raises(RecordError):
        decode_records([(1, GOOD[:cut])])


def test_record_turn_id_rejects_a_bad_record() -> None:
    for record in (b"\x91" * 100_000 + b"\xc0", _packed(3, {}, "t"), b"\xc1", _packed(2, {}, 5)):
        with pytest.raises(RecordError):
            record_turn_id(record)


def test_event_data_round_trips_exactly() -> None:
    message = parse_message(
        {
            "message_type": "event_message",
            "event_type": "compaction",
            "event_data": {
                "null": None,
                "big": 2**64 - 1,
                "small": -(2**63),
                "float": 1.5,
                "list": [{"a": [None]}],
            },
        }
    )
    [decoded] = decode_records([(1, encode_record(message))])
    assert isinstance(decoded, EventMessage)
    assert decoded.event_data == message.event_data


# --- integers beyond 64 bits and unknown fields -------------------------------------------------

BIG_VALUES = [2**64, -(2**63) - 1, 2**70, -(2**100), 2**4096 - 1, 1 - 2**4096, 2**127, -(2**127)]


@pytest.mark.parametrize("value", BIG_VALUES)
def test_an_integer_beyond_64_bits_is_a_big_int_extension(value: int) -> None:
    message = parse_message(
        {"message_type": "event_message", "event_type": "compaction", "event_data": {"n": value}}
    )
    record = encode_record(message, "turn-1")
    extension = msgpack.unpackb(record, raw=False)[1]["event_data"]["n"]
    assert extension.code == 1
    assert int.from_bytes(extension.data, "big", signed=True) == value
    assert len(extension.data) == value.bit_length() // 8 + 1  # the fewest whole bytes and a sign
    [decoded] = decode_records([(3, record)])
    assert decoded.event_data == {"n": value}
    assert record_turn_id(record) == "turn-1"
    assert salvage(record).turn_id == "turn-1"


def test_integers_inside_64_bits_stay_native_msgpack() -> None:
    message = parse_message(
        {
            "message_type": "event_message",
            "event_type": "compaction",
            "event_data": {"n": [2**64 - 1, -(2**63)]},
        }
    )
    assert msgpack.unpackb(encode_record(message), raw=False, max_ext_len=0)[1]["event_data"] == {
        "n": [2**64 - 1, -(2**63)]
    }


@pytest.mark.parametrize(
    "record",
    [
        _packed(
            2, {"message_type": "user_message", "content": "x", "n": msgpack.ExtType(2, b"\x01")}
        ),
        _packed(
            2,
            {"message_type": "user_message", "content": "x", "n": msgpack.ExtType(1, b"\0" * 514)},
        ),
    ],
    ids=["another extension", "a longer integer than 4096 bits"],
)
def test_a_record_with_another_extension_is_unreadable(record: bytes) -> None:
    with pytest.raises(RecordError, match=r"sequence 7 is not valid msgpack"):
        decode_records([(7, record)])
    assert salvage(record) == Salvaged(None, None, None)


def test_unknown_fields_are_in_the_record_where_they_were_given() -> None:
    given = {
        "message_type": "user_message",
        "content": [{"type": "text", "text": "hi", "colour": "red"}],
        "mood": {"calm": [1, None]},
    }
    message = parse_message(given)
    record = encode_record(message)
    assert msgpack.unpackb(record, raw=False)[1] == given
    assert len(record) > len(encode_record(UserMessage(content=[TextContent(text="hi")])))
    [decoded] = decode_records([(1, record)])
    assert decoded.to_dict() == {**given, "seq_id": 1}


def test_a_version_1_record_keeps_its_unknown_fields() -> None:
    [decoded] = decode_records([(7, b'{"message_type": "user_message", "content": "x", "seq": 1}')])
    assert decoded.to_dict() == {
        "message_type": "user_message",
        "content": [{"type": "text", "text": "x"}],
        "seq": 1,
        "seq_id": 7,
    }
