"""A fork meeting another worker between two of its steps: its source deleted, its target
deleted, the owner of both erased. Each later step checks, before it writes, that the source is
the incarnation the fork started from and the target the fork in progress this call started; a
fork that cannot go on fails (MessageNotFound for a source gone, RestoreConflict for a target
gone) and is never left marked finished with part of the history. A finished fork called again
with the same point is a replay, by id too, whatever became of its source."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from kvstore import StoreConfig, UserMessage, errors
from kvstore._engine.core import Eval
from kvstore._engine.fork import fork

from ..conftest import make_async_store, make_sync_store
from ..support.facade import SyncFacade

SOURCE, TARGET, OWNER = "src", "dst", "o"
MESSAGES = 250  # three runs of the copy: 1-100, 101-200, 201-250


class Stores:
    """The forking store (sync or async) and another worker's sync store, on one server."""

    def __init__(self, backend: str, mode: str, namespace: str) -> None:
        config = StoreConfig(namespace=namespace)
        self.mode = mode
        self.loop = asyncio.new_event_loop() if mode == "async" else None
        self.forking = (make_async_store if mode == "async" else make_sync_store)(backend, config)
        self.other = make_sync_store(backend, config)

    def thread(self, thread_id: str, owner: str | None):
        made = self.forking.thread(thread_id, owner=owner)
        return SyncFacade(made, self.loop) if self.loop else made

    def run(self, operation):
        if self.loop:
            return self.loop.run_until_complete(self.forking.run(operation))
        return self.forking.run(operation)

    def fork(self, owner: str | None, at, before_restore: int = 0, act: Callable = lambda: None):
        """thread SOURCE forked into TARGET at `at`, `act()` run before the fork's
        `before_restore`-th restore call (0: never)."""
        source, target = self.thread(SOURCE, owner), self.thread(TARGET, owner)
        operation = fork(source._ref, SOURCE, target._ref, at)
        return self.run(acting(operation, before_restore, act))

    def close(self) -> None:
        self.other.close()
        if self.loop:
            self.loop.run_until_complete(self.forking.close())
            self.loop.close()
        else:
            self.forking.close()


@pytest.fixture
def stores(backend, mode, namespace):
    made = Stores(backend, mode, namespace)
    yield made
    made.close()


def acting(operation, call: int, act: Callable):
    """`operation`, with `act()` run just before its `call`-th restore script call is sent
    (another worker between two of its steps); typed errors are thrown back into it."""
    restores = 0
    request = next(operation)
    while True:
        if isinstance(request, Eval) and request.script.name == "restore":
            restores += 1
            if restores == call:
                act()
        try:
            reply = yield request
        except Exception as error:  # the operation decides
            request = operation.throw(error)
            continue
        try:
            request = operation.send(reply)
        except StopIteration as done:
            return done.value


def fill(stores: Stores, owner: str | None) -> None:
    source = stores.other.thread(SOURCE, owner=owner)
    for start in range(0, MESSAGES, 50):
        source.append([UserMessage(content=f"m{j}") for j in range(start, start + 50)])


def never_finished_with_part(stores: Stores, owner: str | None) -> None:
    """The target is not a fork marked finished holding only part of the history."""
    stats = stores.other.thread(TARGET, owner=owner).stats()
    if stats.fork_sequence is not None:
        assert stats.stored_messages == MESSAGES, stats


@pytest.mark.parametrize("owner", [None, OWNER])
def test_a_fork_whose_source_is_deleted_between_steps_fails_and_leaves_no_thread(
    stores, raw_client, owner
):
    fill(stores, owner)
    delete_source = stores.other.thread(SOURCE, owner=owner).delete
    with pytest.raises(errors.MessageNotFound, match="deleted"):
        stores.fork(owner, MESSAGES, before_restore=2, act=delete_source)
    never_finished_with_part(stores, owner)
    # The copy so far is gone with the source: no half branch left mid-restore.
    assert stores.other.thread(TARGET, owner=owner).stats().stored_messages == 0
    # Called again, the fork fails the same way.
    with pytest.raises(errors.MessageNotFound):
        stores.fork(owner, MESSAGES)


@pytest.mark.parametrize("owner", [None, OWNER])
def test_a_fork_whose_source_is_made_again_between_steps_copies_no_mix(stores, owner):
    fill(stores, owner)

    def make_again() -> None:
        stores.other.thread(SOURCE, owner=owner).delete()
        fill(stores, owner)  # the same sequences, other ids: another incarnation

    with pytest.raises(errors.MessageNotFound, match="deleted"):
        stores.fork(owner, MESSAGES, before_restore=2, act=make_again)
    never_finished_with_part(stores, owner)
    # Run again, it forks the thread as it is now, whole.
    stores.fork(owner, MESSAGES)
    fork_ids = [m.id for m in stores.other.thread(TARGET, owner=owner).iter()]
    assert fork_ids == [m.id for m in stores.other.thread(SOURCE, owner=owner).iter()]


@pytest.mark.parametrize("owner", [None, OWNER])
def test_a_fork_whose_target_is_deleted_between_steps_fails_and_runs_again_whole(stores, owner):
    fill(stores, owner)
    delete_target = stores.other.thread(TARGET, owner=owner).delete
    with pytest.raises(errors.RestoreConflict, match="not the import or fork in progress"):
        stores.fork(owner, MESSAGES, before_restore=2, act=delete_target)
    never_finished_with_part(stores, owner)
    # The later runs were refused: nothing went into the emptied target.
    assert stores.other.thread(TARGET, owner=owner).stats().stored_messages == 0
    assert stores.fork(owner, MESSAGES) == MESSAGES
    stats = stores.other.thread(TARGET, owner=owner).stats()
    assert (stats.stored_messages, stats.fork_sequence) == (MESSAGES, MESSAGES)


def test_a_fork_whose_target_is_deleted_before_its_last_step_is_not_finished(stores):
    fill(stores, None)
    delete_target = stores.other.thread(TARGET, owner=None).delete
    # The third restore call is the last run: the target goes before restore_state too.
    with pytest.raises(errors.RestoreConflict, match="not the import or fork in progress"):
        stores.fork(None, MESSAGES, before_restore=3, act=delete_target)
    never_finished_with_part(stores, None)


def test_an_erasure_between_two_steps_of_a_fork_leaves_the_owner_nothing(
    stores, raw_client, namespace
):
    fill(stores, OWNER)

    def erase() -> None:
        stores.other.erase_owner(OWNER)

    with pytest.raises((errors.RestoreConflict, errors.MessageNotFound)):
        stores.fork(OWNER, MESSAGES, before_restore=2, act=erase)
    assert list(raw_client.scan_iter(match=f"{namespace}:{{#{OWNER}}}:*")) == []
    assert stores.other.threads(OWNER).threads == []
    never_finished_with_part(stores, OWNER)


@pytest.mark.parametrize("owner", [None, OWNER])
def test_a_finished_fork_called_again_by_id_replays_once_its_source_is_gone(stores, owner):
    source = stores.other.thread(SOURCE, owner=owner)
    stored = source.append([UserMessage(content=f"m{i}") for i in range(10)])
    point = stored[3]
    assert stores.fork(owner, point.id) == point.seq_id
    source.delete()
    for at in (point.seq_id, point.id):
        assert stores.fork(owner, at) == point.seq_id
    assert stores.other.thread(TARGET, owner=owner).stats().stored_messages == 4
    # Another point is still refused, by id the target holds too.
    with pytest.raises((errors.RestoreConflict, errors.MessageNotFound)):
        stores.fork(owner, stored[2].id)


@pytest.mark.parametrize("owner", [None, OWNER])
def test_a_fork_run_again_after_retention_passed_its_copy_finishes(
    stores, owner, backend, namespace
):
    """A compaction of the source while the fork copies (its retention deleting messages the
    first run already copied) fails that run (run it again); the run again finishes the fork as
    the source is now, instead of refusing the copy that holds what retention deleted."""
    fill(stores, owner)
    retaining = make_sync_store(
        backend, StoreConfig(namespace=namespace, retained_message_limit=60)
    )

    def compact() -> None:
        retaining.thread(SOURCE, owner=owner).compact("the first 150", last_sequence=150)

    try:
        with pytest.raises(errors.ServerError, match="compacted during the fork"):
            stores.fork(owner, MESSAGES, before_restore=2, act=compact)
        never_finished_with_part(stores, owner)
        source = stores.other.thread(SOURCE, owner=owner)
        deleted_before = source.stats().deleted_before_sequence
        assert deleted_before is not None and deleted_before > 1  # retention passed 1-100
        stores.fork(owner, MESSAGES)
        target = stores.other.thread(TARGET, owner=owner)
        kept = [m.id for m in source.iter() if m.seq_id <= MESSAGES]  # not the summary after
        assert [m.id for m in target.iter()] == kept
        assert target.stats().deleted_before_sequence == deleted_before
        assert target.stats().fork_sequence == MESSAGES
    finally:
        retaining.close()


class Stopped(Exception):
    """The fork's worker stopped between two steps (a crash, an interrupt)."""


def stop() -> None:
    raise Stopped


def same_as_fork_made_now(
    stores: Stores, owner: str | None, at: int, ids: list[str] | None = None
) -> None:
    """The target is what an uninterrupted fork of the source's point, made now, is: the same
    messages, the same stats, none of `ids` (the source's, by sequence from 1) readable below
    its deleted_before."""
    made = stores.other.thread(SOURCE, owner=owner).fork("whole", at=at)
    target = stores.other.thread(TARGET, owner=owner)
    listed = [(m.seq_id, m.id, m.content) for m in target.iter()]
    assert listed == [(m.seq_id, m.id, m.content) for m in made.iter()]
    got, want = target.stats(), made.stats()
    for field in (
        "stored_messages",
        "stored_bytes",
        "tokens",
        "chunks",
        "next_sequence",
        "deleted_before_sequence",
        "summary_last_sequence",
        "fork_sequence",
        "restore_unfinished",
    ):
        assert getattr(got, field) == getattr(want, field), field
    for gone in (ids or [])[: listed[0][0] - 1]:
        with pytest.raises(errors.MessageNotFound):
            target.get(gone)


@pytest.mark.parametrize("owner", [None, OWNER])
@pytest.mark.parametrize("compacted", [90, 240], ids=["into-the-copy", "past-the-copy"])
def test_a_fork_stopped_then_resumed_after_retention_is_the_fork_made_then(
    stores, owner, backend, namespace, compacted
):
    """A fork stopped after its first run, its source then compacted with retention (deleting
    part of what the run copied, or all of it), and run again: the fork finishes, and is the
    fork of the same point made after that retention (no message below its deleted_before, the
    same counts); never refused for ever, never keeping what it copied before."""
    fill(stores, owner)
    retaining = make_sync_store(
        backend, StoreConfig(namespace=namespace, retained_message_limit=20)
    )
    ids = [m.id for m in stores.other.thread(SOURCE, owner=owner).iter()]
    try:
        with pytest.raises(Stopped):
            stores.fork(owner, MESSAGES, before_restore=2, act=stop)
        retaining.thread(SOURCE, owner=owner).compact("earlier", last_sequence=compacted)
        assert stores.other.thread(SOURCE, owner=owner).stats().deleted_before_sequence > 2
        assert stores.fork(owner, MESSAGES) == MESSAGES
        same_as_fork_made_now(stores, owner, MESSAGES, ids)
        stores.other.thread(TARGET, owner=owner).append(UserMessage(content="next"))
    finally:
        retaining.close()


def replace_two(stores: Stores, owner: str | None) -> None:
    """Another worker edits one message the first run copied and one it has not."""
    source = stores.other.thread(SOURCE, owner=owner)
    for sequence in (50, 120):
        (stored,) = [m for m in source.iter() if m.seq_id == sequence]
        source.replace(stored.id, UserMessage(content=f"edited {sequence}"))


def remove_turn(stores: Stores, owner: str | None) -> None:
    stores.other.thread(SOURCE, owner=owner).remove_turn("crossing")


def fill_with_turn(stores: Stores, owner: str | None) -> None:
    """MESSAGES messages, 91-110 of them one turn (across the copy's first two runs)."""
    source = stores.other.thread(SOURCE, owner=owner)
    source.append([UserMessage(content=f"m{j}") for j in range(90)])
    source.start_turn("crossing")
    source.append([UserMessage(content=f"m{j}") for j in range(90, 110)], turn_id="crossing")
    source.finish_turn("crossing")
    for start in range(110, MESSAGES, 70):
        source.append(
            [UserMessage(content=f"m{j}") for j in range(start, min(start + 70, MESSAGES))]
        )


@pytest.mark.parametrize("owner", [None, OWNER])
@pytest.mark.parametrize("edit", [replace_two, remove_turn], ids=["replace", "remove_turn"])
def test_a_fork_meeting_an_edit_of_its_source_fails_and_runs_again_whole(stores, owner, edit):
    """An in-place replace or a remove_turn of the source between two runs of the copy fails
    the fork as a compaction does (ServerError, run it again), never a torn history (the old
    message 50 with the new 120, half a removed turn); the run again is the source now."""
    fill_with_turn(stores, owner)
    with pytest.raises(errors.ServerError, match="run the fork again"):
        stores.fork(owner, MESSAGES, before_restore=2, act=lambda: edit(stores, owner))
    never_finished_with_part(stores, owner)
    stores.fork(owner, MESSAGES)
    source = stores.other.thread(SOURCE, owner=owner)
    target = stores.other.thread(TARGET, owner=owner)
    now = [(m.seq_id, m.id, m.content) for m in source.iter()]
    assert [(m.seq_id, m.id, m.content) for m in target.iter()] == now
    assert target.stats().stored_messages == len(now)
    same_as_fork_made_now(stores, owner, MESSAGES)
