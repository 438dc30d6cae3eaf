"""A backup of a thread not yet in the current layout is refused, naming the layout it is in
(kvstore.admin.backup_state, and `kvstore export` on the command line): a layout-2 thread the
previous release wrote says layout 2, a layout-1 thread layout 1, also one no write has touched
(a legacy hash and no meta), which was backed up as a file no import takes; a layout newer than
this version's says to upgrade."""

from __future__ import annotations

import io

import pytest

from kvstore import MessageStore, StoreConfig, UserMessage, admin, errors
from kvstore.cli import backup
from kvstore.cli.main import main as cli

from ..support.backup_files import one_error_line
from ..support.old_release import run_previous
from .test_migration import write_layout_1


@pytest.fixture
def store(server, namespace, server_only):
    with MessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as made:
        yield made


def refused(
    store: MessageStore, server, namespace: str, capsys, thread_id: str, match: str = "migrate"
) -> str:
    """The line the CLI prints when it refuses to back the thread up (the library's error)."""
    with pytest.raises(errors.LayoutError, match=match) as library:
        admin.backup_state(store, thread_id)
    out = io.StringIO()
    with pytest.raises(errors.LayoutError, match=match) as exported:
        backup.export(store, thread_id, out, progress_out=io.StringIO())
    assert out.getvalue() == ""
    assert cli(["export", thread_id, "--url", server.url, "--namespace", namespace]) == 1
    line = one_error_line(capsys)
    assert str(library.value) == str(exported.value) and line == f"kvstore: {exported.value}"
    return line


def test_a_layout_2_thread_is_refused_as_layout_2(store, server, namespace, raw_client, capsys):
    code = "store.thread('chat').append(UserMessage(content='hi'))"
    run_previous(server.url, {"namespace": namespace}, code)
    assert raw_client.hget(store.thread("chat").keys.meta, "layout") == b"2"
    line = refused(store, server, namespace, capsys, "chat")
    assert "the thread is in layout 2: migrate it (kvstore migrate)" in line
    # Migrated, it is backed up.
    store.thread("chat").migrate()
    assert admin.backup_state(store, "chat").last_seq == 1


@pytest.mark.parametrize("meta", ["layout 1", "none"])
def test_a_layout_1_thread_is_refused_as_layout_1(
    store, server, namespace, raw_client, capsys, meta
):
    keys = store.thread("legacy").keys
    write_layout_1(raw_client, keys, 5, last_seq=None)
    if meta == "none":  # a thread no write has touched: its legacy hash alone
        raw_client.delete(keys.meta)
    line = refused(store, server, namespace, capsys, "legacy")
    assert "the thread is in layout 1: migrate it (kvstore migrate)" in line


def test_a_thread_of_a_layout_this_version_does_not_know_says_to_upgrade(
    store, server, namespace, raw_client, capsys
):
    thread = store.thread("newer")
    thread.append(UserMessage(content="hi"))
    raw_client.hset(thread.keys.meta, "layout", "4")
    line = refused(store, server, namespace, capsys, "newer", match="upgrade")
    assert "layout '4', which this version of kvstore does not write: upgrade kvstore" in line
