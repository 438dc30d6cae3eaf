"""A backup keeps a message's unknown fields whatever their names, on real servers: a field named
like the backup's own per-message data (its turn, its token count, the wrapper a line holds the
message in) or like the header's and end line's keys is written, read and restored as the message
held it, and never taken for the backup's data. A backup of the format before (the data beside
the message's fields) is still read as it was."""

from __future__ import annotations

import io
import json

import pytest

from kvstore import (
    AssistantMessage,
    MessageStore,
    StoreConfig,
    SystemMessage,
    UserMessage,
    errors,
)
from kvstore.admin import stored_tokens
from kvstore.cli import backup
from kvstore.cli.main import main

from ..support.backup_files import header, sealed, user

# Every key a backup line of any format has outside a message's own fields.
NAMES = (
    "tokens",
    "turn_id",
    "message",
    "kvstore_backup",
    "kvstore_backup_end",
    "messages",
    "sha256",
    "thread",
    "last_seq",
    "turns",
    "prompt",
    "state",
)


@pytest.fixture
def stores(server, namespace, server_only):
    config = dict(window_size=8, chunk_size=4, retained_message_limit=4)
    source = MessageStore.from_url(server.url, StoreConfig(namespace=namespace, **config))
    target = MessageStore.from_url(server.url, StoreConfig(namespace=namespace + "r", **config))
    yield source, target
    source.close()
    target.close()


def odd(tag: str) -> dict:
    """Unknown fields named like each of the backup's keys, with values a backup's data could
    not be mistaken for."""
    return {name: f"{tag}:{name}" for name in NAMES} | {"nested": {"tokens": 1, "turn_id": "t"}}


def build(store: MessageStore):
    """A thread whose messages (a kept prompt past retention, loose ones, a turn's) hold them."""
    thread = store.thread("odd")
    prompt = SystemMessage.model_validate({"content": "rules"} | odd("prompt"))
    thread.append([prompt, SystemMessage(content="more")], tokens=[3, 4])
    thread.append([UserMessage(content=f"m{i}") for i in range(12)], tokens=[1] * 12)
    thread.compact("so far", last_sequence=10, tokens=2)
    thread.append(UserMessage.model_validate({"content": "loose"} | odd("loose")), tokens=[7])
    thread.append(UserMessage(content="q", otid="q"), turn_id="real", tokens=[5])
    thread.start_turn("real")
    reply = AssistantMessage.model_validate({"content": "a"} | odd("reply") | {"turn_id": "ghost"})
    thread.append(reply, turn_id="real", tokens=[9])
    thread.finish_turn("real")
    assert thread.stats().deleted_before_sequence  # retention kept the prompt aside
    return thread


def seen(store: MessageStore, thread_id: str) -> dict:
    """What a reader sees of the thread, with each message's stored token count."""
    thread = store.thread(thread_id)
    messages = [m.to_dict() for m in thread.iter()]
    sequences = [m["seq_id"] for m in messages]
    return {
        "messages": messages,
        "context": [m.to_dict() for m in thread.context()],
        "budgeted": [m.to_dict() for m in thread.context(max_tokens=20)],
        "tokens": stored_tokens(store, thread_id, sequences),
        "turns": {t: [m.seq_id for m in thread.list(turn_id=t).messages] for t in NAMES_OF_TURNS},
    }


NAMES_OF_TURNS = ("real", "ghost", "reply:turn_id", "loose:turn_id")


def test_unknown_fields_named_like_the_backups_keys_round_trip(stores, tmp_path):
    source, target = stores
    build(source)
    before = seen(source, "odd")
    assert before["messages"][-1]["turn_id"] == "ghost" and before["turns"]["real"]
    out = tmp_path / "odd.jsonl"
    with out.open("w", encoding="utf-8") as file:
        backup.export(source, "odd", file, progress_out=io.StringIO())
    text = out.read_text(encoding="utf-8")
    backup.import_lines(target, "odd", io.StringIO(text), progress_out=io.StringIO())
    assert seen(target, "odd") == before
    assert json.loads(text.splitlines()[0])["kvstore_backup"] == 2
    # Imported again: every message is found stored, nothing changes.
    again = backup.ImportProgress()
    backup.import_lines(target, "odd", io.StringIO(text), again, progress_out=io.StringIO())
    assert again.stored == 0 and seen(target, "odd") == before


def test_the_cli_round_trips_them(stores, server, namespace, capsys, tmp_path):
    source, _ = stores
    build(source)
    before = seen(source, "odd")
    out = tmp_path / "odd.jsonl"
    common = ["--url", server.url, "--namespace", namespace]
    assert main(["export", "odd", "-o", str(out), *common]) == 0
    assert main(["import", "copy", str(out), *common]) == 0
    capsys.readouterr()
    assert seen(source, "copy") == before


TURN = {
    "id": "t1",
    "start": 2,
    "outcome": "completed",
    "replies": 1,
    "first": 2,
    "count": 1,
    "first_seq": 1,
    "last_seq": 2,
}


def test_a_backup_of_the_format_before_is_read_as_it_was(stores):
    """Format 1: the turn and the token count beside the message's fields, taken as the
    backup's (a message of such a file has no unknown fields named so)."""
    _, target = stores
    lines = [user(1, turn_id="t1", tokens=11), user(2, turn_id="t1", tokens=12), user(3, odd=1)]
    text = sealed(header(3, 1, turns=[TURN]), lines)
    assert backup.import_lines(target, "old", io.StringIO(text), progress_out=io.StringIO()) == 3
    thread = target.thread("old")
    assert [m.to_dict() for m in thread.iter()] == [user(1), user(2), user(3, odd=1)]
    assert [m.seq_id for m in thread.list(turn_id="t1").messages] == [1, 2]
    assert stored_tokens(target, "old", [1, 2]) == {1: 11, 2: 12}


def test_a_new_backup_line_holds_the_message_apart_from_the_backups_data(stores):
    _, target = stores
    lines = [
        {"message": user(1, turn_id="x", tokens="y"), "turn_id": "t1", "tokens": 11},
        {"message": user(2, message={"a": 1}), "turn_id": "t1", "tokens": 12},
        {"message": user(3, kvstore_backup_end=2)},
    ]
    text = sealed(header(3, 2, turns=[TURN]), lines, end_format=2)
    assert backup.import_lines(target, "new", io.StringIO(text), progress_out=io.StringIO()) == 3
    thread = target.thread("new")
    assert [m.to_dict() for m in thread.iter()] == [
        user(1, turn_id="x", tokens="y"),
        user(2, message={"a": 1}),
        user(3, kvstore_backup_end=2),
    ]
    assert [m.seq_id for m in thread.list(turn_id="t1").messages] == [1, 2]
    assert stored_tokens(target, "new", [1, 2]).items() >= {1: 11, 2: 12}.items()


@pytest.mark.parametrize(
    "line",
    [
        user(1),  # a message line of the format before
        {"message": user(1), "seq": 1},  # a key the format does not have
        {"message": "text"},
        {"turn_id": "t1", "tokens": 3},  # no message
    ],
)
def test_a_new_backup_line_of_another_shape_is_refused_before_any_write(stores, line):
    _, target = stores
    text = sealed(header(1, 2), [line], end_format=2)
    with pytest.raises(errors.InvalidMessage, match="line 2"):
        backup.import_lines(target, "bad", io.StringIO(text), progress_out=io.StringIO())
    assert target.thread("bad").stats().stored_messages == 0


def test_an_end_line_of_another_format_than_the_header_is_refused(stores):
    _, target = stores
    text = sealed(header(1, 2), [{"message": user(1)}], end_format=1)
    with pytest.raises(errors.InvalidMessage, match="end line format"):
        backup.import_lines(target, "mixed", io.StringIO(text), progress_out=io.StringIO())


@pytest.mark.parametrize("form", [3, 0, True, 2.0, "2"])
def test_a_header_of_a_format_it_does_not_read_is_refused(stores, form):
    _, target = stores
    text = sealed(header(1, form), [{"message": user(1)}], end_format=2)
    with pytest.raises(errors.InvalidMessage, match="line 1: backup format"):
        backup.import_lines(target, "other", io.StringIO(text), progress_out=io.StringIO())
    assert target.thread("other").stats().next_sequence == 1
