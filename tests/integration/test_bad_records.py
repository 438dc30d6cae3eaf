"""Bad records, on every backend, sync and async.

A message changed in place after it was built is refused at append (what is encoded is
validated), and free-form fields nest at most MAX_JSON_DEPTH levels. A bad record already stored
(written by an older version, a bug or raw commands) takes down only itself: pages, iter,
context and snapshot skip it and name its sequence; get of it raises RecordError; replace and
remove_turn of it work (docs/RELIABILITY.md, "One bad record").
"""

from __future__ import annotations

import logging

import msgpack
import pytest

from kvstore import CompactionStats, EventMessage, ImageContent, TextContent, UserMessage, errors
from kvstore._engine import append as append_module
from kvstore._engine import core as _core
from kvstore.messages import MAX_JSON_DEPTH, Attachment

SMALL = dict(window_size=4, chunk_size=2)


def nested(depth: int, leaf=None):
    """`depth` lists one inside the other around `leaf`."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


# ------------------------------------------------------------------ mutated messages refused


def _too_many_metadata(m):
    m.metadata.update({f"k{i}": "v" for i in range(17)})


def _long_metadata_value(m):
    m.metadata["k"] = "v" * 513


def _bad_part_appended(m):
    m.content.append({"type": "image"})


def _part_text_not_a_string(m):
    m.content[0].text = 5


def _required_field_cleared(m):
    m.__dict__["content"] = None


def _deep_attachment(m):
    m.attachments[0].extra = nested(MAX_JSON_DEPTH + 1)


def _bomb_attachment(m):
    m.attachments[0].extra = nested(300)


def _inline_part_added(m):
    m.content.append(
        ImageContent(source={"type": "base64", "media_type": "image/png", "data": "QUFB" * 2000})
    )


MUTATIONS = {
    "17 metadata pairs": (_too_many_metadata, "metadata"),
    "a metadata value too long": (_long_metadata_value, "metadata"),
    "a bad part appended": (_bad_part_appended, r"content\[1\]"),
    "a part's text not a string": (_part_text_not_a_string, r"content\[0\]\.text"),
    "a required field cleared": (_required_field_cleared, "content"),
    "an attachment nested too deep": (_deep_attachment, r"attachments\[0\]"),
    "an attachment nested 300 deep": (_bomb_attachment, "attachments"),
}


def fresh_user_message() -> UserMessage:
    return UserMessage(
        content=[TextContent(text="hello")],
        metadata={"k": "v"},
        attachments=[Attachment(file_id="file-1")],
        otid="otid-mutated",
    )


@pytest.mark.parametrize("name", MUTATIONS)
def test_a_message_changed_in_place_is_refused_at_append(make_thread, name):
    mutate, field = MUTATIONS[name]
    thread = make_thread()
    thread.append(UserMessage(content="before"))
    message = fresh_user_message()
    mutate(message)
    for payload in (message, [UserMessage(content="fine"), message]):
        with pytest.raises(errors.InvalidMessage, match=field):
            thread.append(payload)
    assert thread.stats().next_sequence == 2
    assert [m.content for m in thread.list().messages] == ["before"]


@pytest.mark.parametrize("name", MUTATIONS)
def test_a_replacement_changed_in_place_is_refused(make_thread, name):
    mutate, field = MUTATIONS[name]
    thread = make_thread()
    (stored,) = thread.append(UserMessage(content="original"))
    message = fresh_user_message()
    mutate(message)
    with pytest.raises(errors.InvalidMessage, match=field):
        thread.replace(stored.id, message)
    assert thread.get(stored.id) == stored


def test_compaction_stats_changed_in_place_are_refused(make_thread):
    thread = make_thread()
    thread.append(UserMessage(content="one"))
    stats = CompactionStats(
        context_window=8000, messages_count_after=1, messages_count_before=2, trigger="t"
    )
    stats.context_window = "large"
    with pytest.raises(errors.InvalidMessage, match=r"compaction_stats\.context_window"):
        thread.compact("summary", 1, stats)
    assert thread.stats().summary_last_sequence is None


def test_an_inline_part_added_in_place_counts_against_the_part_limit(make_thread):
    thread = make_thread(max_inline_part_bytes=1000)
    message = UserMessage(content=[TextContent(text="small")])
    _inline_part_added(message)
    with pytest.raises(errors.InlineMediaTooLarge, match=r"content\[1\]"):
        thread.append(message)
    assert thread.stats().next_sequence == 1


def test_the_returned_message_is_what_is_stored_not_the_callers_object(make_thread):
    thread = make_thread()
    message = UserMessage(content=[TextContent(text="hello")], metadata={"k": "v"})
    (stored,) = thread.append(message)
    message.metadata["later"] = "changed after the append"
    message.content.append(TextContent(text="also later"))
    assert stored.metadata == {"k": "v"} and len(stored.content) == 1
    assert thread.get(stored.id) == stored


# -------------------------------------------------------------------------- nesting depth


def _attachment_dict(depth: int) -> dict:
    return {
        "message_type": "user_message",
        "content": "x",
        "attachments": [{"file_id": "f", "x": nested(depth)}],
    }


def _event_dict(depth: int) -> dict:
    # event_data itself is the first level.
    return {
        "message_type": "event_message",
        "event_type": "compaction",
        "event_data": {"d": nested(depth - 1)},
    }


@pytest.mark.parametrize("make", [_attachment_dict, _event_dict], ids=["attachment", "event_data"])
@pytest.mark.parametrize("as_model", [False, True], ids=["dict", "model"])
def test_free_form_fields_nest_at_most_max_json_depth(make_thread, make, as_model):
    thread = make_thread()
    payload = make(MAX_JSON_DEPTH)
    if as_model:
        payload = (
            UserMessage(**payload)
            if payload["message_type"] == "user_message"
            else EventMessage(**payload)
        )
    (stored,) = thread.append(payload)
    assert thread.get(stored.id) == stored
    for depth in (MAX_JSON_DEPTH + 1, 255, 300, 5000):
        with pytest.raises(errors.InvalidMessage, match=f"deeper than {MAX_JSON_DEPTH}"):
            thread.append(make(depth))
    assert thread.stats().next_sequence == 2


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 255, 300])
def test_a_model_nested_too_deep_after_it_was_built_is_refused(make_thread, depth):
    thread = make_thread()
    attached = UserMessage(content="x", attachments=[Attachment(file_id="f")])
    attached.attachments[0].x = nested(depth)
    event = EventMessage(event_type="compaction", event_data={"d": 1})
    event.event_data["d"] = nested(depth)
    for message, field in ((attached, "attachments"), (event, "event_data")):
        with pytest.raises(errors.InvalidMessage, match=field):
            thread.append(message)
    assert thread.stats().next_sequence == 1


# ------------------------------------------------------------------ a bad record stored


def _invalid_v2(message_id: str, otid: str, turn_id: str) -> bytes:
    """What the store wrote for a message mutated to 17 metadata pairs before it validated."""
    body = {
        "message_type": "user_message",
        "id": message_id,
        "otid": otid,
        "date": "2024-05-01T10:00:00Z",
        "content": "poisoned",
        "metadata": {f"k{i}": "v" for i in range(17)},
    }
    return msgpack.packb([2, body, turn_id], use_bin_type=True)


BAD_RECORDS = {
    "invalid message": lambda message_id, otid, turn_id: _invalid_v2(message_id, otid, turn_id),
    "not msgpack": lambda *_: b"\xc1\xc1 not a record",
    "version-1 junk": lambda *_: b'{"message_type": "user_message", "content": 5}',
}


def store_unchecked(
    thread, monkeypatch, records: list[bytes], ids: list[str], otids: list[str], turn_id: str
):
    """Stores records as an older version or a bug would have: through the append script,
    with correct side info, but never validated."""
    prepared = [
        _core.PreparedMessage(UserMessage(id=i, otid=o, content="-"), record, 0, 1)
        for i, o, record in zip(ids, otids, records, strict=True)
    ]
    with monkeypatch.context() as patch:
        # Where append looks it up: core only re-exports it.
        patch.setattr(append_module, "prepare_batch", lambda *_: prepared)
        return [m.seq_id for m in thread.append(UserMessage(content="-"), turn_id=turn_id)]


@pytest.fixture(params=["window", "chunk"])
def poisoned(request, make_thread, monkeypatch, raw_client):
    """A thread with one bad record in turn t-2, in the open chunk (layout 3's window) or
    already closed into a chunk."""

    def build(kind: str):
        thread = make_thread(**{**SMALL, "chunk_size": 8})
        good = thread.append([UserMessage(content=f"good {i}") for i in range(3)], turn_id="t-1")
        make_record = BAD_RECORDS[kind]
        (bad_seq,) = store_unchecked(
            thread,
            monkeypatch,
            [make_record("message-bad", "otid-bad", "t-2")],
            ["message-bad"],
            ["otid-bad"],
            "t-2",
        )
        good += thread.append(UserMessage(content="after the bad one"), turn_id="t-2")
        if request.param == "chunk":
            good += thread.append([UserMessage(content=f"later {i}") for i in range(8)])
        manifest = raw_client.get(thread.keys.open_manifest) or b""
        in_open = {int(line.split(b"\t")[0]) for line in manifest.split(b"\n")[:-1]}
        assert (bad_seq in in_open) == (request.param == "window")
        return thread, good, bad_seq

    return build


@pytest.mark.parametrize("kind", BAD_RECORDS)
def test_a_bad_record_is_skipped_and_named_by_page_reads(poisoned, kind, caplog):
    thread, good, bad = poisoned(kind)
    caplog.set_level(logging.WARNING, logger="kvstore")
    page = thread.list(limit=50)
    assert page.messages == good and page.unreadable == [bad] and not page.has_more
    desc = thread.list(limit=50, order="desc")
    assert desc.messages == good[::-1] and desc.unreadable == [bad]
    # A page around the bad record: it counts as one of the page's places.
    around = thread.list(after=bad - 1, limit=2)
    assert [m.seq_id for m in around.messages] == [bad + 1] and around.unreadable == [bad]
    assert around.has_more == (good[-1].seq_id > bad + 1)
    clean = thread.list(after=bad, limit=50)
    assert clean.messages == good[3:] and clean.unreadable == []
    assert thread.list(turn_id="t-2").unreadable == [bad]
    assert [m.seq_id for m in thread.list(turn_id="t-2").messages] == [bad + 1]
    assert list(thread.iter()) == good
    assert list(thread.iter(order="desc")) == good[::-1]
    assert thread.context() == good
    snapshot = thread.snapshot()
    assert snapshot.messages == good and snapshot.unreadable == [bad]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned and all(f"sequence {bad}" in w and "thread-1" in w for w in warned)


@pytest.mark.parametrize("kind", BAD_RECORDS)
def test_get_of_a_bad_record_names_its_sequence(poisoned, kind):
    thread, good, bad = poisoned(kind)
    with pytest.raises(errors.RecordError, match=f"sequence {bad}") as raised:
        thread.get("message-bad")
    assert raised.value.sequence == bad
    assert thread.get(good[-1].id) == good[-1]


@pytest.mark.parametrize("kind", BAD_RECORDS)
def test_a_bad_record_can_be_replaced(poisoned, kind):
    thread, good, bad = poisoned(kind)
    fixed = thread.replace("message-bad", UserMessage(content="fixed", otid="ignored"))
    assert (fixed.id, fixed.seq_id, fixed.content) == ("message-bad", bad, "fixed")
    if kind == "invalid message":
        # What a lenient read of the record still tells is kept.
        assert fixed.otid == "otid-bad"
        assert fixed.date.isoformat() == "2024-05-01T10:00:00+00:00"
    else:
        assert fixed.otid is None and fixed.date is not None
    assert thread.get("message-bad") == fixed
    page = thread.list(limit=50)
    assert page.unreadable == [] and page.messages == sorted([*good, fixed], key=lambda m: m.seq_id)
    assert [m.seq_id for m in thread.list(turn_id="t-2").messages] == [bad, bad + 1]


@pytest.mark.parametrize("kind", BAD_RECORDS)
def test_a_turn_holding_a_bad_record_can_be_removed(poisoned, kind):
    thread, good, bad = poisoned(kind)
    assert thread.remove_turn("t-2") == 2
    page = thread.list(limit=50)
    assert page.unreadable == [] and page.messages == [m for m in good if m.seq_id != bad + 1]
    with pytest.raises(errors.MessageNotFound):
        thread.get("message-bad")


def test_iter_and_context_go_past_a_page_of_bad_records_only(make_thread, monkeypatch):
    thread = make_thread()
    first = thread.append(UserMessage(content="first"))
    count = _core.MAX_LIMIT + 5  # more than a page of iter and of context
    stored_bad: list[int] = []
    for start in range(0, count, 500):
        ids = [f"message-bad-{i}" for i in range(start, min(count, start + 500))]
        # Distinct bytes: window members are records, and a real record holds its unique id.
        records = [b"\xc1" + i.encode() for i in ids]
        stored_bad += store_unchecked(thread, monkeypatch, records, ids, ids, "t")
    last = thread.append(UserMessage(content="last"))
    assert list(thread.iter()) == first + last
    assert list(thread.iter(order="desc")) == last + first
    assert thread.context() == first + last
    page = thread.list(after=first[0].seq_id, limit=_core.MAX_LIMIT)
    assert (
        page.messages == [] and page.unreadable == stored_bad[: _core.MAX_LIMIT] and page.has_more
    )


@pytest.mark.parametrize("kind", BAD_RECORDS)
def test_a_fork_over_a_bad_record_stops_naming_it_and_finishes_once_it_is_replaced(poisoned, kind):
    thread, good, bad = poisoned(kind)
    with pytest.raises(errors.RecordError) as raised:
        thread.fork("thread-fork", at=good[-1].seq_id)
    assert raised.value.sequence == bad
    thread.replace("message-bad", UserMessage(content="repaired"))
    fork = thread.fork("thread-fork", at=good[-1].seq_id)
    assert list(fork.iter()) == [m for m in thread.iter() if m.seq_id <= good[-1].seq_id]
