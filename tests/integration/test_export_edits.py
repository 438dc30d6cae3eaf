"""An export and the edits of stored messages: every edit that changes what a message reads moves
meta's `gen` (a replace in place too, wherever the message is), so an export that overlaps one
fails its end check instead of writing a file of a state the thread never had; and the same for
the library's backup state (kvstore.admin.backup_state, BackupState.same_moment) and for a
snapshot, whose stats and page are one state of the thread."""

from __future__ import annotations

import io

import pytest

from kvstore import AssistantMessage, MessageStore, StoreConfig, UserMessage, admin, errors
from kvstore._engine.executor import record
from kvstore.cli import backup
from kvstore.cli.main import main as cli

from ..conftest import make_sync_store
from ..support.backup_files import one_error_line
from ..support.layout_check import check_layout, to_hash_chunk

SMALL = dict(window_size=8, chunk_size=4, chunk_max_bytes=4096)
CHANGED = "changed while it was exported"


def gen(raw_client, thread) -> int:
    return int(raw_client.hget(thread.keys.meta, "gen") or 0)


def test_every_edit_of_a_stored_message_moves_gen_once(make_thread, raw_client, namespace):
    """In place in the open chunk, in a closed chunk (strings, and a layout-2 hash kept from
    before), moved into its own chunk, a removed turn: each moves gen by one."""
    thread = make_thread(**SMALL)
    config = StoreConfig(namespace=namespace, **SMALL)
    stored = []
    for i in range(10):
        turn = "t" if i in (8, 9) else None
        stored += thread.append(UserMessage(content=f"m{i} " + "x" * 200), turn_id=turn)
    layout = check_layout(raw_client, thread.keys, config)
    assert list(layout.chunks) == [1, 5] and sorted(layout.open) == [9, 10]
    to_hash_chunk(raw_client, thread.keys, 5)
    edits = {
        "open chunk, in place": lambda: thread.replace(stored[9].id, UserMessage(content="a")),
        "closed chunk, in place": lambda: thread.replace(stored[1].id, UserMessage(content="b")),
        "layout-2 hash, in place": lambda: thread.replace(stored[5].id, UserMessage(content="c")),
        "into its own chunk": lambda: thread.replace(stored[8].id, UserMessage(content="G" * 6000)),
        "a removed turn": lambda: thread.remove_turn("t"),
    }
    for name, edit in edits.items():
        before = gen(raw_client, thread)
        edit()
        assert gen(raw_client, thread) == before + 1, name
        check_layout(raw_client, thread.keys, config)
    assert [m.content for m in thread.iter()][:6] == [
        "m0 " + "x" * 200,
        "b",
        *[f"m{i} " + "x" * 200 for i in (2, 3, 4)],
        "c",
    ]


def test_a_snapshot_overlapping_an_in_place_replace_reads_one_state(
    make_thread, backend, namespace
):
    """snapshot() reads the stats, then the newest page, then checks meta: a replace in place
    between the two is seen, and the snapshot reads again (its stats the page's state)."""
    thread = make_thread()
    stored = thread.append([UserMessage(content=f"m{i}") for i in range(10)])
    other = make_sync_store(backend, StoreConfig(namespace=namespace)).thread(thread.thread_id)
    requests = [0]

    def sink(request) -> None:
        requests[0] += 1
        if requests[0] == 2:  # the page, after the stats
            other.replace(stored[3].id, UserMessage(content="replaced, and longer than it was"))

    record(thread._store, sink)
    try:
        during = thread.snapshot()
    finally:
        record(thread._store, None)
    assert during == thread.snapshot()
    assert during.messages[3].content.startswith("replaced")
    other._store.close()


@pytest.fixture
def store(server, namespace, server_only):
    with MessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as made:
        yield made


def chat(store: MessageStore) -> dict[int, str]:
    """A 300-message thread; its message ids by sequence."""
    thread = store.thread("chat")
    stored = thread.append([UserMessage(content=f"my card is 4111-{i:04d}") for i in range(300)])
    thread.append(AssistantMessage(content="noted"))
    return {m.seq_id: m.id for m in stored if m.seq_id is not None}


def redacting_pages(monkeypatch, store: MessageStore, ids: dict[int, str]) -> None:
    """The export's pages, with another worker replacing message 5 (already written) and 250
    (not yet) once the first page is out: a redaction pass."""
    real = admin.pages
    other = store.thread("chat")

    def pages(*args, **kwargs):
        for number, page in enumerate(real(*args, **kwargs)):
            yield page
            if number == 0:
                other.replace(ids[5], UserMessage(content="[redacted]"))
                other.replace(ids[250], UserMessage(content="[redacted]"))

    monkeypatch.setattr(admin, "pages", pages)


def test_an_export_overlapping_in_place_replaces_fails_without_an_end_line(store, monkeypatch):
    ids = chat(store)
    before = admin.backup_state(store, "chat")
    redacting_pages(monkeypatch, store, ids)
    out = io.StringIO()
    with pytest.raises(errors.KVStoreError, match=CHANGED):
        backup.export(store, "chat", out, progress_out=io.StringIO())
    assert "kvstore_backup_end" not in out.getvalue()
    # The library's check says the same: the state is not the one the export started from.
    assert not before.same_moment(admin.backup_state(store, "chat"))
    # Nothing in its way, the export is one state: the thread as it is now.
    monkeypatch.undo()
    out = io.StringIO()
    assert backup.export(store, "chat", out, progress_out=io.StringIO()) == 301
    assert out.getvalue().count("[redacted]") == 2


def test_the_cli_export_overlapping_a_replace_leaves_the_file_as_it_was(
    store, server, namespace, tmp_path, capsys, monkeypatch
):
    ids = chat(store)
    file = tmp_path / "chat.jsonl"
    file.write_text("a good backup\n")
    redacting_pages(monkeypatch, store, ids)
    at = ["--url", server.url, "--namespace", namespace]
    assert cli(["export", "chat", "-o", str(file), *at]) == 1
    assert CHANGED in one_error_line(capsys)
    assert file.read_text() == "a good backup\n"
