"""An owner's directory under concurrent writers, on each real server: a listing paged while other
processes write lists no thread twice and misses none that stayed still, and an erasure while
appends and set_info calls race it refuses them (OwnerErasing) and leaves no key of a thread
its directory does not hold (docs/OWNERS.md)."""

from __future__ import annotations

import collections
import threading
import time

import pytest

from kvstore import StoreConfig, UserMessage, errors

from ..conftest import make_sync_store
from ..support.owners import listed, owner_keys, totals_match


@pytest.fixture
def make(backend, server_only, namespace):
    made = []

    def store(**config):
        made.append(make_sync_store(backend, StoreConfig(namespace=namespace, **config)))
        return made[-1]

    yield store
    for store in made:
        store.close()


def racing(make, target, workers: int = 3):
    """Runs target(store, worker, stop) in `workers` threads, each with its own store, until
    the `with` body ends; the Counter of what they report."""
    stop, counts = threading.Event(), collections.Counter()

    class Race:
        def __enter__(self):
            stores = [make(chunk_size=2, window_size=2) for _ in range(workers)]
            self.threads = [
                threading.Thread(target=target, args=(s, k, stop, counts))
                for k, s in enumerate(stores)
            ]
            for thread in self.threads:
                thread.start()
            time.sleep(0.05)
            return counts

        def __exit__(self, *exc):
            stop.set()
            for thread in self.threads:
                thread.join()

    return Race()


def test_a_listing_paged_while_threads_move_lists_each_once(make):
    store = make()
    ids = [f"chat-{i:02d}" for i in range(40)]
    for thread_id in ids:
        store.thread(thread_id, owner="ann").append(UserMessage(content="hi"))
    moved: set[str] = set()

    def write(worker_store, k, stop, counts):
        i = k
        while not stop.is_set():
            thread_id = ids[(i * 7) % 13]  # a third of the threads move, the rest stay still
            moved.add(thread_id)
            worker_store.thread(thread_id, owner="ann").append(UserMessage(content="moves"))
            counts["writes"] += 1
            i += 1

    with racing(make, write) as counts:
        for order in ("recent", "created"):
            for limit in (1, 3, 7):
                seen, page = [], store.threads("ann", order=order, limit=limit)
                seen += [t.thread_id for t in page.threads]
                while page.next_cursor:
                    page = store.threads("ann", order=order, limit=limit, after=page.next_cursor)
                    seen += [t.thread_id for t in page.threads]
                assert len(seen) == len(set(seen)), (order, limit)
                assert set(ids) - moved <= set(seen), (order, limit)
                if order == "created":
                    assert sorted(seen) == ids
    assert counts["writes"] > 0
    totals_match(store, "ann")


def test_an_erasure_raced_by_writers_leaves_nothing_it_does_not_list(make, raw_client, namespace):
    store = make(chunk_size=2, window_size=2)
    for i in range(30):
        store.thread(f"c{i}", owner="ann").append([UserMessage(content=f"m{j}") for j in range(5)])

    def write(worker_store, k, stop, counts):
        i = 0
        while not stop.is_set():
            i += 1
            late = worker_store.thread(f"c{(i + k) % 35}", owner="ann")
            new = worker_store.thread(f"new-{k}-{i}", owner="ann")
            for call in (
                lambda late=late: late.append(UserMessage(content="late")),
                lambda new=new: new.set_info(title="t"),
            ):
                try:
                    call()
                    counts["written"] += 1
                except errors.OwnerErasing:
                    counts["refused"] += 1

    with racing(make, write) as counts:
        receipt = store.erase_owner("ann")
    assert counts["refused"] > 0
    assert receipt.threads >= 30
    # What the writers made after the erasure ended is a new owner's, whole and listed.
    listed_ids = set(listed(store, "ann"))
    prefix = f"{namespace}:{{#ann}}:".encode()
    keyed = {
        key[len(prefix) :].split(b"|")[0].decode()
        for key in owner_keys(raw_client, namespace, "ann")
        if b"|" in key
    }
    assert keyed <= listed_ids
    totals_match(store, "ann")
    store.erase_owner("ann")
    assert owner_keys(raw_client, namespace, "ann") == []
