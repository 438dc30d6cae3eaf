"""A watcher of a thread whose messages appear with no `added` event (docs/EVENTS.md, "Messages
stored without an event"): a fork or a restore (`kvstore import`) fills the thread at its own
sequences and adds no event, so a watcher opened before it pages what it stored, with no gap and
no repeat; sync and async, on every backend."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import Callable

import pytest

from kvstore import MessageStore, StoreConfig, UserMessage
from kvstore.cli import backup
from kvstore.events import MessagesAdded, ThreadDeleted, ThreadEvent

from ..conftest import make_async_store, make_sync_store

BLOCK_MS = 200  # short: a quiet watcher checks the thread this often
WAIT_S = 10.0


def _blocked_clients(raw_client) -> int:
    return int(raw_client.info("clients")["blocked_clients"])


def _wait_blocked(backend: str, raw_client, before: int) -> None:
    """Until the watcher waits in its blocking read, having read the thread's state (fakeredis
    counts no blocked client: a pause instead)."""
    if backend == "fakeredis":
        time.sleep(0.3)
        return
    deadline = time.monotonic() + 5
    while _blocked_clients(raw_client) <= before:
        assert time.monotonic() < deadline, "the watcher never blocked"
        time.sleep(0.005)


def _sequences(events: list[ThreadEvent]) -> list[int]:
    return [m.seq_id for e in events if isinstance(e, MessagesAdded) for m in e.messages]


def _watched(
    backend: str,
    mode: str,
    config: StoreConfig,
    raw_client,
    write: Callable[[MessageStore], None],
    last: int,
    after: int | None = 0,
) -> list[ThreadEvent]:
    """Watches thread "f" from `after` (a sync or async watcher of its own store, in a thread
    of its own), runs write(store) with another store once the watcher waits on the stream, and
    returns the events until one delivers sequence `last` (or ends the watch; 10 s at most)."""
    events: list[ThreadEvent] = []
    done = threading.Event()
    failures: list[BaseException] = []

    def seen(event: ThreadEvent) -> bool:
        events.append(event)
        return last in _sequences([event]) or isinstance(event, ThreadDeleted)

    def run_sync(watch) -> None:
        for event in watch:
            if seen(event):
                break

    async def run_async() -> None:
        store = make_async_store(backend, config)
        try:
            async with store.thread("f").watch(after=after, block_ms=BLOCK_MS) as watch:
                async for event in watch:
                    if seen(event):
                        break
        finally:
            await store.close()

    sync_store = make_sync_store(backend, config) if mode == "sync" else None
    watch = sync_store.thread("f").watch(after=after, block_ms=BLOCK_MS) if sync_store else None

    def iterate() -> None:
        try:
            if watch is not None:
                run_sync(watch)
            else:
                asyncio.run(asyncio.wait_for(run_async(), WAIT_S))
        except BaseException as exc:  # recorded: the test fails on it
            failures.append(exc)
        finally:
            done.set()

    before = _blocked_clients(raw_client) if backend != "fakeredis" else 0
    reader = threading.Thread(target=iterate, daemon=True)
    reader.start()
    writer = make_sync_store(backend, config)
    try:
        _wait_blocked(backend, raw_client, before)
        write(writer)
        done.wait(WAIT_S)
    finally:
        if watch is not None:
            watch.close()
        reader.join(WAIT_S)
        writer.close()
        if sync_store is not None:
            sync_store.close()
    assert not [f for f in failures if not isinstance(f, TimeoutError)], failures
    return events


def _source(store: MessageStore) -> None:
    store.thread("s").append([UserMessage(content=f"m{i}") for i in range(5)])


def _fork(store: MessageStore) -> None:
    _source(store)
    store.thread("s").fork("f", at=5)


def _fork_then_append(store: MessageStore) -> None:
    _fork(store)
    store.thread("f").append(UserMessage(content="after the fork"))


def _turn_fork_then_append(store: MessageStore) -> None:
    """A turn started on "f" before any message (its first event), then the fork fills it."""
    store.thread("f").start_turn("early")
    _fork_then_append(store)


def _import_then_append(store: MessageStore) -> None:
    _source(store)
    out = io.StringIO()
    backup.export(store, "s", out, progress_out=io.StringIO())
    backup.import_lines(store, "f", io.StringIO(out.getvalue()), progress_out=io.StringIO())
    store.thread("f").append(UserMessage(content="after the import"))


@pytest.mark.parametrize(
    "write, last",
    [
        (_fork_then_append, 6),
        (_fork, 5),  # no event at all after it: the quiet watcher finds the messages
        (_turn_fork_then_append, 6),
        (_import_then_append, 6),
    ],
    ids=["fork-append", "fork-quiet", "turn-fork-append", "import-append"],
)
@pytest.mark.parametrize("after", [0, None], ids=["after-0", "from-now"])
def test_messages_a_fork_or_restore_stores_are_delivered_without_a_gap(
    backend, mode, namespace, raw_client, write, last, after
):
    config = StoreConfig(namespace=namespace)
    events = _watched(backend, mode, config, raw_client, write, last, after)
    sequences = _sequences(events)
    assert not [e for e in events if isinstance(e, ThreadDeleted)], events
    assert sequences == list(range(1, last + 1)), events
    # What the fork or restore stored comes paged: it had no event.
    assert all(e.paged for e in events if isinstance(e, MessagesAdded) and e.first_sequence < 6)


def test_a_watcher_opened_before_the_first_append_still_reads_its_events(
    backend, mode, namespace, raw_client
):
    """Unchanged: a thread made by appends is delivered from its added events, not paged."""

    def appends(store: MessageStore) -> None:
        for i in range(3):
            store.thread("f").append(UserMessage(content=f"m{i}"))

    events = _watched(backend, mode, StoreConfig(namespace=namespace), raw_client, appends, 3)
    assert _sequences(events) == [1, 2, 3]
    assert [e.paged for e in events if isinstance(e, MessagesAdded)] == [False] * 3


def test_a_forked_thread_deleted_and_made_again_ends_the_watch(
    backend, mode, namespace, raw_client
):
    """The watcher took the fork's incarnation when it paged it: a thread made again under the
    id is another, and the watch ends with ThreadDeleted rather than going on into it."""

    def fork_delete_append(store: MessageStore) -> None:
        _fork(store)
        time.sleep(BLOCK_MS / 1000 * 3)  # the quiet watcher pages the fork
        store.thread("f").delete()
        store.thread("f").append(UserMessage(content="another thread"))

    config = StoreConfig(namespace=namespace)
    events = _watched(backend, mode, config, raw_client, fork_delete_append, 99)
    assert _sequences(events) == [1, 2, 3, 4, 5]
    assert isinstance(events[-1], ThreadDeleted), events
