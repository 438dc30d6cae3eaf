"""context()'s look at a thread's first record (kvstore/_engine/system_prompt.py): the first
bytes of a record as the client packs it tell a system message from any other, and anything
else is "not known" (the thread's start is read then)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from kvstore import AssistantMessage, SummaryMessage, SystemMessage, ToolReturnMessage, UserMessage
from kvstore._engine.record import encode_record
from kvstore._engine.system_prompt import _TYPE_PREFIX, _not_system, _starts_plain

KINDS = [
    lambda extra: SystemMessage(content="rules", **extra),
    lambda extra: UserMessage(content="hi", **extra),
    lambda extra: AssistantMessage(content="hello", **extra),
    lambda extra: ToolReturnMessage(tool_call_id="c1", tool_return="ok", status="success", **extra),
    lambda extra: SummaryMessage(summary="so far", **extra),
]

# Unknown fields, enough of them for a map of more than 15 fields (msgpack's map16 header).
extras = st.dictionaries(
    st.text(alphabet="abcdefgh", min_size=3, max_size=8).map(lambda k: "x_" + k),
    st.text(max_size=20),
    max_size=24,
)


@given(st.sampled_from(range(len(KINDS))), extras, st.sampled_from([None, "turn-1"]))
def test_a_packed_record_tells_its_kind_by_its_first_bytes(kind, extra, turn_id):
    message = KINDS[kind](extra)
    prefix = encode_record(message, turn_id)[:_TYPE_PREFIX]
    assert _not_system(prefix) is (message.message_type != "system_message")


@given(st.binary(max_size=_TYPE_PREFIX))
def test_other_bytes_are_not_taken_for_a_plain_start(prefix):
    """Bytes that are not a record's start in the client's form are "not known", never a
    verdict; and a verdict needs the manifest's first line to be sequence 1."""
    if _not_system(prefix):
        assert prefix[1:2] == b"\x02" and b"\xacmessage_type" in prefix
    assert _starts_plain([prefix, b"2\t", prefix, b""]) is False
    assert _starts_plain([prefix, b"", prefix, b"12"]) is False


def test_the_forms_no_verdict_is_made_on():
    user = encode_record(UserMessage(content="hi"))
    assert _starts_plain([user[:_TYPE_PREFIX], b"1\t", b"", b""])
    assert _starts_plain([b"", b"", user[:_TYPE_PREFIX], b"1\t"])
    for prefix in (
        json.dumps({"message_type": "user_message", "content": "hi"}).encode(),  # version 1
        user[:20],  # cut before its type
        b"",  # no such chunk
    ):
        assert not _not_system(prefix)
        assert not _starts_plain([prefix, b"1\t", prefix, b"1\t"])
