"""context()'s look at a thread's first record (kvstore/_engine/system_prompt.py): the first
bytes of a record as the client packs it tell a system message from any other, and anything
else is "not known" (the thread's start is read then)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from kvstore import (
    AssistantMessage,
    StoreConfig,
    SummaryMessage,
    SystemMessage,
    ToolReturnMessage,
    UserMessage,
)
from kvstore._engine.core import ThreadRef
from kvstore._engine.record import encode_record
from kvstore._engine.system_prompt import (
    _START_HINT,
    _TYPE_PREFIX,
    _not_system,
    _start_reads,
    _starts_plain,
)


def plain(starts, deleted_before=None, hint=None):
    """_starts_plain's verdict on a new handle (with `hint` left by an earlier read)."""
    thread = ThreadRef.of(StoreConfig(namespace="n"), "t")
    if hint is not None:
        thread.hints[_START_HINT] = hint
    return _starts_plain(thread, deleted_before, starts)


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
    assert plain([prefix, b"2\t", prefix, b""]) is False
    assert plain([prefix, b"", prefix, b"12"]) is False


def test_the_forms_no_verdict_is_made_on():
    user = encode_record(UserMessage(content="hi"))
    assert plain([user[:_TYPE_PREFIX], b"1\t", b"", b""])
    assert plain([b"", b"", user[:_TYPE_PREFIX], b"1\t"])
    assert not plain([user[:_TYPE_PREFIX], b"1\t", b"", b""], deleted_before=b"5")
    for prefix in (
        json.dumps({"message_type": "user_message", "content": "hi"}).encode(),  # version 1
        user[:20],  # cut before its type
        b"",  # no such chunk
    ):
        assert not _not_system(prefix)
        assert not plain([prefix, b"1\t", prefix, b"1\t"])


def test_a_handle_reads_only_the_start_its_last_read_left_possible():
    """Retention begun: no start is read again; sequence 1 in the first closed chunk: only that
    chunk's bytes; anything else (a hint gone stale included): both containers."""
    thread = ThreadRef.of(StoreConfig(namespace="n"), "t")
    user = encode_record(UserMessage(content="hi"))[:_TYPE_PREFIX]
    assert len(_start_reads(thread)) == 4
    assert _starts_plain(thread, None, [b"", b"", user, b"1\t"])
    assert len(_start_reads(thread)) == 4  # the open chunk's: it may close
    assert _starts_plain(thread, None, [user, b"1\t", b"", b""])
    assert [c[1] for c in _start_reads(thread)] == [
        thread.keys.chunk_data(1),
        thread.keys.chunk_manifest(1),
    ]
    assert not _starts_plain(thread, None, [b"", b""])  # gone (a thread deleted, written again)
    assert len(_start_reads(thread)) == 4
    assert not _starts_plain(thread, b"7", [user, b"1\t", b"", b""])
    assert _start_reads(thread) == []
    assert not _starts_plain(thread, None, [])  # deleted and written again
    assert len(_start_reads(thread)) == 4
