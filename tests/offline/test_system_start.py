"""context()'s look at a thread's start (kvstore/_engine/system_start.py): the first bytes of a
record as the client packs it tell a system message from any other, anything else is "not
known" (the thread's start is read then), and a handle reads only what its last read left
possible."""

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
from kvstore._engine.system_start import (
    HINT,
    PLAIN,
    TYPE_PREFIX,
    UNKNOWN,
    Learn,
    not_system,
    settle,
    start_reads,
)

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

USER = encode_record(UserMessage(content="hi"))[:TYPE_PREFIX]
SYSTEM = encode_record(SystemMessage(content="rules"))[:TYPE_PREFIX]


def handle(hint=None) -> ThreadRef:
    thread = ThreadRef.of(StoreConfig(namespace="n"), "t")
    if hint is not None:
        thread.hints[HINT] = hint
    return thread


def verdict(starts, deleted_before=None):
    """settle's verdict on what a new handle's start_reads read."""
    return settle(handle(), None, deleted_before, starts)


@given(st.sampled_from(range(len(KINDS))), extras, st.sampled_from([None, "turn-1"]))
def test_a_packed_record_tells_its_kind_by_its_first_bytes(kind, extra, turn_id):
    message = KINDS[kind](extra)
    prefix = encode_record(message, turn_id)[:TYPE_PREFIX]
    assert not_system(prefix) is (message.message_type != "system_message")


@given(st.binary(max_size=TYPE_PREFIX))
def test_other_bytes_are_not_taken_for_a_plain_start(prefix):
    """Bytes that are not a record's start in the client's form are "not known", never a
    verdict; and a verdict needs the manifest's first line to be sequence 1."""
    if not_system(prefix):
        assert prefix[1:2] == b"\x02" and b"\xacmessage_type" in prefix
    assert verdict([prefix, b"2\t", prefix, b""]) is UNKNOWN
    assert verdict([prefix, b"", prefix, b"12"]) is UNKNOWN


def test_the_forms_no_verdict_is_made_on():
    assert verdict([USER, b"1\t", b"", b""]) is PLAIN
    assert verdict([b"", b"", USER, b"1\t"]) is PLAIN
    assert verdict([USER, b"1\t", b"", b""], deleted_before=b"5") is UNKNOWN
    learnt = verdict([SYSTEM, b"1\t", b"", b""])
    assert isinstance(learnt, Learn) and learnt.closed
    assert not verdict([b"", b"", SYSTEM, b"1\t"]).closed
    for prefix in (
        json.dumps({"message_type": "user_message", "content": "hi"}).encode(),  # version 1
        USER[:20],  # cut before its type
        b"",  # no such chunk
    ):
        assert not not_system(prefix)
        assert verdict([prefix, b"1\t", prefix, b"1\t"]) is not PLAIN


def test_a_handle_reads_only_the_start_its_last_read_left_possible():
    """Retention begun: no start is read again; sequence 1 in the first closed chunk: only that
    chunk's bytes; anything else (a hint gone stale included): both containers."""
    thread = handle()

    def reads():
        return start_reads(thread, thread.hints.get(HINT))

    def read(starts, deleted_before=None):
        return settle(thread, thread.hints.get(HINT), deleted_before, starts)

    assert len(reads()) == 4
    assert read([b"", b"", USER, b"1\t"]) is PLAIN
    assert len(reads()) == 4  # the open chunk's: it may close
    assert read([USER, b"1\t", b"", b""]) is PLAIN
    assert [c[1] for c in reads()] == [thread.keys.chunk_data(1), thread.keys.chunk_manifest(1)]
    assert read([b"", b""]) is UNKNOWN  # gone (a thread deleted, written again)
    assert len(reads()) == 4
    assert read([USER, b"1\t", b"", b""], b"7") is UNKNOWN
    assert reads() == []
    assert read([]) is UNKNOWN  # deleted and written again
    assert len(reads()) == 4
