"""An import (`kvstore import`, and the `kvstore.admin` restore calls it makes) meeting another
worker between two of its steps: its thread deleted, the thread's owner erased, or the thread
made again. Every call after the import's first names the incarnation it restores into (meta
`born`), and the scripts refuse another before they write: the import fails (RestoreConflict)
and never finishes a thread holding part of the backup. Run again, it starts over into the empty
thread. `kvstore import` is a sync command, and the admin calls take a sync store."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest

from kvstore import MessageStore, StoreConfig, UserMessage, admin, errors
from kvstore._engine.executor import record
from kvstore._engine.operation import Eval
from kvstore.cli import backup
from kvstore.cli.main import main as cli

from ..support.backup_files import one_error_line

SOURCE, TARGET, OWNER = "src", "dst", "o"
MESSAGES = 250  # three runs of the restore: 1-100, 101-200, 201-250
GONE = "not the import or fork in progress"


@pytest.fixture
def stores(server, namespace, server_only):
    """The importing store, and another worker's."""
    config = StoreConfig(namespace=namespace)
    with (
        MessageStore.from_url(server.url, config) as importing,
        MessageStore.from_url(server.url, config) as other,
    ):
        yield importing, other


def backup_text(store: MessageStore) -> str:
    """A backup of a MESSAGES-message thread."""
    source = store.thread(SOURCE)
    for start in range(0, MESSAGES, 50):
        source.append([UserMessage(content=f"m{j}") for j in range(start, start + 50)])
    out = io.StringIO()
    backup.export(store, SOURCE, out, progress_out=io.StringIO())
    return out.getvalue()


def import_acting(
    store: MessageStore,
    text: str,
    owner: str | None,
    script: str = "",
    call: int = 0,
    act: Callable[[], object] = lambda: None,
) -> int:
    """`kvstore import` of `text` into TARGET, `act()` run just before its `call`-th call of
    `script` is sent (another worker between two of its steps)."""
    calls = [0]

    def sink(request) -> None:
        if isinstance(request, Eval) and request.script.name == script:
            calls[0] += 1
            if calls[0] == call:
                act()

    record(store, sink)
    try:
        return backup.import_lines(
            store, TARGET, io.StringIO(text), progress_out=io.StringIO(), owner=owner
        )
    finally:
        record(store, None)


def never_finished_with_part(store: MessageStore, owner: str | None) -> None:
    """The target is not a thread served as finished that holds only part of the backup."""
    stats = store.thread(TARGET, owner=owner).stats()
    if stats.stored_messages:
        assert stats.restore_unfinished or stats.stored_messages == MESSAGES, stats


def restored_whole(store: MessageStore, owner: str | None) -> None:
    target, source = store.thread(TARGET, owner=owner), store.thread(SOURCE)
    assert [m.to_dict() for m in target.iter()] == [m.to_dict() for m in source.iter()]
    assert not target.stats().restore_unfinished


@pytest.mark.parametrize("owner", [None, OWNER])
@pytest.mark.parametrize(("script", "call"), [("restore", 2), ("restore", 3), ("restore_state", 1)])
def test_an_import_whose_thread_is_deleted_between_steps_fails_and_runs_again_whole(
    stores, owner, script, call
):
    importing, other = stores
    text = backup_text(importing)
    delete = other.thread(TARGET, owner=owner).delete
    with pytest.raises(errors.RestoreConflict, match=GONE):
        import_acting(importing, text, owner, script, call, delete)
    never_finished_with_part(other, owner)
    # The steps after the deletion were refused: nothing went into the emptied thread.
    assert other.thread(TARGET, owner=owner).stats().stored_messages == 0
    # Run again, the import starts over into the empty thread.
    assert import_acting(importing, text, owner) == MESSAGES
    restored_whole(other, owner)


def test_an_erasure_between_two_steps_of_an_import_leaves_the_owner_nothing(
    stores, raw_client, namespace
):
    importing, other = stores
    text = backup_text(importing)
    with pytest.raises(errors.RestoreConflict, match=GONE):
        import_acting(importing, text, OWNER, "restore", 2, lambda: other.erase_owner(OWNER))
    assert list(raw_client.scan_iter(match=f"{namespace}:{{#{OWNER}}}:*")) == []
    assert other.threads(OWNER).threads == []
    # Run again (the operator's choice), it restores the whole backup into the owner afresh.
    assert import_acting(importing, text, OWNER) == MESSAGES
    restored_whole(other, OWNER)
    assert other.owner_usage(OWNER).threads == 1


def test_an_import_whose_thread_is_made_again_between_steps_leaves_that_thread_alone(stores):
    importing, other = stores
    text = backup_text(importing)
    target = other.thread(TARGET)

    def make_again() -> None:
        target.delete()
        target.append([UserMessage(content=f"new {i}") for i in range(3)])

    with pytest.raises(errors.RestoreConflict, match=GONE):
        import_acting(importing, text, None, "restore", 2, make_again)
    after = [m.content for m in target.iter()]
    assert after == ["new 0", "new 1", "new 2"] and not target.stats().restore_unfinished
    # Run again, it is refused as over any thread holding other messages, nothing written.
    with pytest.raises(errors.RestoreConflict, match="restore into an empty thread"):
        import_acting(importing, text, None)
    assert [m.content for m in target.iter()] == after


def test_importing_a_finished_restore_again_while_it_is_deleted_writes_nothing(stores):
    """A second import of the same backup stores nothing (every run is a replay); deleted under
    it, its later runs are refused as well, instead of restoring the backup's tail."""
    importing, other = stores
    text = backup_text(importing)
    assert import_acting(importing, text, None) == MESSAGES
    with pytest.raises(errors.RestoreConflict, match=GONE):
        import_acting(importing, text, None, "restore", 2, other.thread(TARGET).delete)
    stats = other.thread(TARGET).stats()
    assert (stats.stored_messages, stats.next_sequence, stats.restore_unfinished) == (0, 1, False)
    # Without anyone in its way it is the replay it was.
    assert import_acting(importing, text, None) == MESSAGES
    assert import_acting(importing, text, None) == 0
    restored_whole(other, None)


def test_the_admin_calls_check_the_incarnation_they_are_given(stores):
    """restore_run and restore_state take the incarnation (`born`) restore_incarnation reads;
    called as before, without it, they restore as before."""
    importing, other = stores
    text = backup_text(importing)
    lines = text.splitlines()[1:-1]
    state = admin.backup_state(importing, SOURCE)
    items = [
        admin.BackedUpMessage(m.seq_id, None, m, None)
        for m in importing.thread(SOURCE).iter()
        if m.seq_id is not None
    ]
    runs = list(admin.restore_runs(items))
    assert len(lines) == MESSAGES and len(runs) == 3
    # Without `born`: the old calls, unchanged.
    for run in runs:
        admin.restore_run(importing, "plain", run)
    admin.restore_state(importing, "plain", state)
    assert importing.thread("plain").stats().stored_messages == MESSAGES
    # With it: none writes into another incarnation.
    assert admin.restore_incarnation(importing, TARGET) is None  # no thread yet
    assert admin.restore_run(importing, TARGET, runs[0]) == (100, 0)
    born = admin.restore_incarnation(importing, TARGET, mid_restore=True)
    assert born
    assert admin.restore_run(importing, TARGET, runs[1], born=born) == (100, 0)
    other.thread(TARGET).delete()
    with pytest.raises(errors.RestoreConflict, match=GONE):
        admin.restore_run(importing, TARGET, runs[2], born=born)
    with pytest.raises(errors.RestoreConflict, match=GONE):
        admin.restore_state(importing, TARGET, state, born=born)
    with pytest.raises(errors.RestoreConflict, match=GONE):
        admin.restore_incarnation(importing, TARGET, mid_restore=True)
    assert other.thread(TARGET).stats().stored_messages == 0


def test_the_cli_import_of_a_thread_deleted_under_it_fails_in_one_line_and_runs_again(
    stores, server, namespace, tmp_path, capsys, monkeypatch
):
    importing, other = stores
    file = tmp_path / "backup.jsonl"
    file.write_text(backup_text(importing))
    at = ["--url", server.url, "--namespace", namespace]
    real = admin.restore_run
    calls = [0]

    def deleted_before_the_second(store, thread_id, run, **kwargs):
        calls[0] += 1
        if calls[0] == 2:
            other.thread(thread_id).delete()
        return real(store, thread_id, run, **kwargs)

    monkeypatch.setattr(admin, "restore_run", deleted_before_the_second)
    assert cli(["import", TARGET, str(file), *at]) == 1
    assert GONE in one_error_line(capsys)
    never_finished_with_part(other, None)
    assert other.thread(TARGET).stats().stored_messages == 0
    monkeypatch.setattr(admin, "restore_run", real)
    assert cli(["import", TARGET, str(file), *at]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"imported into {TARGET}: {MESSAGES} new, 0 already stored"
    )
    restored_whole(other, None)
