"""A thread's indexes changed by something else (raw commands, a bug): an `ids` or `otids` entry
naming another message's sequence, a closed chunk the chunk index lists but whose keys are gone.
A read never answers with another message and never drops messages silently; a write through
the bad entry writes nothing (docs/RELIABILITY.md, "One bad record")."""

from __future__ import annotations

import pytest

from kvstore import UserMessage, errors

SMALL = dict(window_size=4, chunk_size=4)


def filled(make_thread, count: int = 20):
    thread = make_thread(**SMALL)
    messages = thread.append(
        [UserMessage(id=f"m{i}", otid=f"o{i}", content=f"message {i}") for i in range(1, count + 1)]
    )
    return thread, messages


def dump(raw_client, thread) -> dict:
    prefix = thread.keys.meta.rpartition(":")[0]
    return {key: raw_client.dump(key) for key in raw_client.scan_iter(match=prefix + ":*")}


# m2 lies in a closed chunk, m19 in the open one: an entry may point from either to the other.
@pytest.mark.parametrize(("asked", "pointed"), [(4, 2), (19, 2), (2, 19), (18, 19)])
def test_an_id_entry_naming_another_message_is_a_record_error(
    make_thread, raw_client, asked, pointed
):
    thread, messages = filled(make_thread)
    raw_client.hset(thread.keys.ids, f"m{asked}", pointed)
    raw_client.hset(thread.keys.otids, f"o{asked}", pointed)
    with pytest.raises(errors.RecordError, match=f"m{asked}"):
        thread.get(f"m{asked}")
    with pytest.raises(errors.RecordError, match=f"o{asked}"):
        thread.get_by_otid(f"o{asked}")
    before = dump(raw_client, thread)
    with pytest.raises(errors.RecordError, match=f"m{asked}"):
        thread.replace(f"m{asked}", UserMessage(content="edited"))
    with pytest.raises(errors.RecordError, match=f"m{asked}"):
        thread.fork("forked", at=f"m{asked}")  # not a fork at the message the entry names
    assert dump(raw_client, thread) == before
    assert list(raw_client.scan_iter(match="*{forked}*")) == []
    assert thread.get(f"m{pointed}") == messages[pointed - 1]
    assert list(thread.iter()) == messages


@pytest.mark.parametrize("part", ["d", "m", "both"])
def test_a_closed_chunk_whose_keys_are_gone_is_named_not_dropped(make_thread, raw_client, part):
    thread, messages = filled(make_thread)
    prefix = thread.keys.meta.rpartition(":")[0]
    gone = [f"{prefix}:chunk:5:{p}" for p in ("d", "m") if part in (p, "both")]
    assert raw_client.delete(*gone) == len(gone)
    lost = [m for m in messages if 5 <= m.seq_id <= 8]
    kept = [m for m in messages if m not in lost]
    page = thread.list(limit=50)
    assert page.messages == kept and page.unreadable == [m.seq_id for m in lost]
    assert not page.has_more
    assert list(thread.iter()) == kept
    assert thread.snapshot().unreadable == [m.seq_id for m in lost]
    with pytest.raises(errors.RecordError, match="missing") as raised:
        thread.get("m6")
    assert raised.value.sequence == 6
    with pytest.raises(errors.RecordError) as raised:
        thread.fork("thread-fork", at=20)
    assert raised.value.sequence == 5


@pytest.mark.parametrize(("field", "value"), [("layout", b"x\xff"), ("open_first", b"q")])
def test_a_meta_number_no_client_writes_is_a_record_error_naming_it(
    make_thread, raw_client, field, value
):
    thread, _ = filled(make_thread)
    raw_client.hset(thread.keys.meta, field, value)
    reads = [lambda: thread.list(limit=50), lambda: list(thread.iter())]
    # A snapshot reads the open chunk whole, by no open_first.
    for read in [*reads, thread.snapshot] if field == "layout" else reads:
        with pytest.raises(errors.RecordError, match=field):
            read()


def test_a_meta_value_that_is_not_utf8_is_a_record_error(make_thread, raw_client):
    thread, _ = filled(make_thread)
    raw_client.hset(thread.keys.meta, "turn_id", b"\xff\xfe")
    with pytest.raises(errors.RecordError, match="not UTF-8"):
        thread.snapshot()


def test_meta_numbers_the_scripts_cannot_read_are_record_errors(make_thread, raw_client):
    """Lua drops a nil from its reply: the client names the meta field, never an IndexError
    or an unpack ValueError, and writes nothing."""
    thread, _ = filled(make_thread)
    raw_client.hset(thread.keys.meta, "layout", b"x\xff")
    with pytest.raises(errors.RecordError, match="meta field"):
        thread.list(after="m3", limit=5)
    raw_client.hset(thread.keys.meta, mapping={"layout": "3", "deleted_before": "x"})
    before = dump(raw_client, thread)
    for call in (
        lambda: thread.get("m3"),
        lambda: thread.get_by_otid("o3"),
        lambda: thread.replace("m3", UserMessage(content="edited")),
    ):
        with pytest.raises(errors.RecordError, match="deleted_before"):
            call()
    assert dump(raw_client, thread) == before
