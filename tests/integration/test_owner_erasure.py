"""An owner's erasure stopped after every one of its calls and run again (a caller that died
mid-way), writes refused while it runs, and threads that expire leaving the owner's directory
(docs/OWNERS.md)."""

from __future__ import annotations

import json
import time

import pytest

from kvstore import StoreConfig, UserMessage, errors
from kvstore._engine.layout.keys import OwnerKeys
from kvstore._engine.owners import erase_owner

from ..conftest import make_sync_store
from .test_cli import kvstore

SMALL = dict(chunk_size=2, window_size=2)


class Stopped(Exception):
    """The caller died here."""


def cut_after(operation, calls: int):
    """`operation` as a caller that dies after sending `calls` requests would run it."""
    reply = None
    for i in range(calls):
        request = next(operation) if i == 0 else operation.send(reply)
        reply = yield request
    raise Stopped


def counted(operation, seen: list):
    """`operation`, counting its requests into `seen`."""
    reply = None
    request = next(operation)
    while True:
        seen.append(request)
        reply = yield request
        try:
            request = operation.send(reply)
        except StopIteration as done:
            return done.value


def fill(store, owner: str) -> int:
    """Four threads of `owner` (one with many chunks, one titled without messages); the count of
    messages stored."""
    total = 0
    for i, count in enumerate((1, 9, 30)):
        store.thread(f"chat-{i}", owner=owner).append(
            [UserMessage(content=f"m{j} " + "x" * 200) for j in range(count)]
        )
        total += count
    store.thread("titled", owner=owner).set_info(title="empty")
    return total


@pytest.fixture
def store(backend, namespace):
    made = make_sync_store(backend, StoreConfig(namespace=namespace, **SMALL))
    yield made
    made.close()


def test_an_erasure_stopped_after_any_call_finishes_when_run_again(
    store, raw_client, namespace, monkeypatch
):
    # Deletes of one chunk a call: a thread's deletion takes several calls, so the erasure
    # can be stopped inside one.
    monkeypatch.setattr("kvstore._engine.operation.DELETE_STEP", 1)
    seen: list = []
    total = fill(store, "whole")
    receipt = store.run(counted(erase_owner(store.config, "whole"), seen))
    assert (receipt.threads, receipt.messages) == (4, total)
    assert len(seen) > 8
    for calls in range(1, len(seen)):
        owner = f"cut-{calls}"
        assert fill(store, owner) == total
        with pytest.raises(Stopped):
            store.run(cut_after(erase_owner(store.config, owner), calls))
        # Once it started, the owner's threads take no write but a delete.
        with pytest.raises(errors.OwnerErasing):
            store.thread("chat-9", owner=owner).append(UserMessage(content="late"))
        with pytest.raises(errors.OwnerErasing):
            store.thread("titled", owner=owner).set_info(title="late")
        receipt = store.erase_owner(owner)
        assert (receipt.threads, receipt.messages) == (4, total), calls
        assert list(raw_client.scan_iter(match=OwnerKeys.of(namespace, owner).pattern())) == []
        assert store.erase_owner(owner).threads == 0


def test_expired_threads_leave_the_directory(backend, namespace, raw_client):
    store = make_sync_store(backend, StoreConfig(namespace=namespace, thread_ttl=1))
    try:
        old = store.thread("old", owner="ann")
        old.append([UserMessage(content="soon gone"), UserMessage(content="also")])
        store.thread("titled", owner="ann").set_info(title="never written")
        assert store.owner_usage("ann").threads == 2
        time.sleep(1.0)
        kept = store.thread("kept", owner="ann")
        kept.append(UserMessage(content="stays"))
        deadline = time.monotonic() + 10
        while raw_client.exists(old.keys.meta) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not raw_client.exists(old.keys.meta)
        time.sleep(0.1)  # the titled thread's listing ends with its ttl too
        page = store.threads("ann")
        assert [info.thread_id for info in page.threads] == ["kept"]
        usage = store.owner_usage("ann")
        assert (usage.threads, usage.messages) == (1, 1)
        assert old.info() is None
    finally:
        store.close()


def test_the_command_line_lists_and_erases_an_owner(
    backend, server, server_only, namespace, raw_client
):
    store = make_sync_store(backend, StoreConfig(namespace=namespace))
    try:
        for i in range(3):
            store.thread(f"c{i}", owner="ann").append(UserMessage(content=f"hi {i}"))
            time.sleep(0.003)
        store.thread("c0", owner="ann").set_info(title="The first")
    finally:
        store.close()
    common = ("--url", server.url, "--namespace", namespace)
    listed = kvstore("threads", "ann", "--limit", "2", *common)
    assert listed.returncode == 0, listed.stderr
    assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == ["c2", "c1"]
    cursor = listed.stderr.strip().removeprefix("next: --after ")
    rest = json.loads(kvstore("threads", "ann", "--after", cursor, "--json", *common).stdout)
    assert [(t["thread_id"], t["title"]) for t in rest["threads"]] == [("c0", "The first")]
    erased = kvstore("erase-owner", "ann", *common)
    assert json.loads(erased.stdout) == {"owner": "ann", "threads": 3, "messages": 3}
    assert list(raw_client.scan_iter(match=OwnerKeys.of(namespace, "ann").pattern())) == []


def test_an_owned_fork_stopped_after_any_call_is_listed_once_when_run_again(store, monkeypatch):
    from kvstore._engine.fork import fork

    monkeypatch.setattr("kvstore._engine.fork.RESTORE_RUN", 4)  # a run of 4 messages a call
    source = store.thread("source", owner="ann")
    source.append([UserMessage(content=f"m{j} " + "x" * 200) for j in range(17)])
    seen: list = []
    whole = store.thread("whole", owner="ann")
    store.run(counted(fork(source._ref, "source", whole._ref, 17), seen))
    scripts = sum(1 for request in seen if hasattr(request, "script"))
    assert scripts > 4
    for calls in range(1, len(seen)):
        target = store.thread(f"fork-{calls}", owner="ann")
        with pytest.raises(Stopped):
            store.run(cut_after(fork(source._ref, "source", target._ref, 17), calls))
        source.fork(f"fork-{calls}", at=17)
        info, stats = target.info(), target.stats()
        assert (info.messages, info.stored_bytes) == (17, stats.stored_bytes), calls
    listed = [t.thread_id for t in store.threads("ann", limit=1000).threads]
    assert sorted(listed) == sorted(
        ["source", "whole", *(f"fork-{c}" for c in range(1, len(seen)))]
    )
    usage = store.owner_usage("ann")
    assert (usage.threads, usage.messages) == (len(listed), 17 * len(listed))


def bounded(operation, most: int):
    """`operation`, failing once it has sent `most` requests (an erasure that never ends)."""
    sent = 0
    request = next(operation)
    while True:
        sent += 1
        assert sent <= most, f"still going after {most} requests"
        reply = yield request
        try:
            request = operation.send(reply)
        except StopIteration as done:
            return done.value


def test_an_erasure_ends_with_index_entries_that_have_no_thread(store, raw_client, namespace):
    """Entries of the owner's indexes with no thread record (something else wrote them, or a
    write stopped by the server midway): each is named, deleted and gone, not named forever."""
    total = fill(store, "ann")
    keys = OwnerKeys.of(namespace, "ann")
    raw_client.zadd(keys.recent, {"stray": 5, "both": 6})
    raw_client.zadd(keys.created, {"stray-2": 5, "both": 6})
    raw_client.hset(keys.info, "stray", '{"title": "stray"}')
    stray = store.thread("both", owner="ann")
    raw_client.hset(stray.keys.meta, "foreign", "1")  # keys of a thread the directory lost
    receipt = store.run(bounded(erase_owner(store.config, "ann"), 100))
    # The lost thread had keys: the erasure counts it with the owner's four.
    assert (receipt.threads, receipt.messages) == (5, total)
    assert list(raw_client.scan_iter(match=keys.pattern())) == []


def test_an_erasure_ends_with_index_entries_no_thread_can_be_named_by(store, raw_client, namespace):
    """An entry that is not a thread id at all (no thread's keys can carry it): the erasure
    takes the entry out of the directory and ends, it does not fail on it forever."""
    total = fill(store, "ann")
    keys = OwnerKeys.of(namespace, "ann")
    bad = ["not a thread id", "x" * 300, "a|b", "\u00e9\n"]
    raw_client.zadd(keys.created, {name: 1 for name in bad[:2]})
    raw_client.zadd(keys.recent, {name: 1 for name in bad[2:]})
    raw_client.hset(keys.info, bad[0], '{"title": "foreign"}')
    raw_client.hset(keys.usage, "t:" + bad[1], "1:2:3:0:")
    receipt = store.run(bounded(erase_owner(store.config, "ann"), 100))
    assert (receipt.threads, receipt.messages) == (4, total)
    assert list(raw_client.scan_iter(match=keys.pattern())) == []
    store.thread("again", owner="ann").append(UserMessage(content="a new start"))
    assert store.owner_usage("ann").threads == 1


def test_erasing_an_owner_that_never_was_writes_nothing(store, raw_client, namespace):
    fill(store, "ann")
    before = {key: raw_client.dump(key) for key in raw_client.scan_iter(match=f"{namespace}:*")}
    receipt = store.erase_owner("nobody")
    assert (receipt.owner, receipt.threads, receipt.messages) == ("nobody", 0, 0)
    after = {key: raw_client.dump(key) for key in raw_client.scan_iter(match=f"{namespace}:*")}
    assert after == before
    assert store.owner_usage("nobody").threads == 0


def test_an_erasure_ends_with_index_entries_that_are_not_text(store, raw_client, namespace):
    """An entry whose bytes are not UTF-8 (something else wrote it) names no thread either: the
    erasure takes it out and ends, and the owner takes writes again."""
    total = fill(store, "ann")
    keys = OwnerKeys.of(namespace, "ann")
    raw_client.zadd(keys.recent, {b"\xff\xfe": 1})
    raw_client.zadd(keys.created, {b"chat-\xc3": 1})
    raw_client.hset(keys.info, b"\xff\xfe", '{"title": "foreign"}')
    raw_client.hset(keys.usage, mapping={b"t:chat-\xc3": "1:2:3:0:", b"t:\xff\xfe": "1:2:3:0:"})
    with pytest.raises(errors.RecordError, match="not UTF-8"):
        store.threads("ann")
    receipt = store.run(bounded(erase_owner(store.config, "ann"), 100))
    assert (receipt.threads, receipt.messages) == (4, total)
    assert list(raw_client.scan_iter(match=keys.pattern())) == []
    store.thread("chat-0", owner="ann").append(UserMessage(content="a new start"))
    assert store.owner_usage("ann").threads == 1
