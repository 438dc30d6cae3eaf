"""Owned threads whose keys expire (thread_ttl), sync and async, on each server: a quota is not
taken by threads that are gone, a thread written again after its expiry starts afresh (no old
title, counts or creation time), and its info is gone with it (docs/OWNERS.md)."""

from __future__ import annotations

import time

import pytest

from kvstore import UserMessage

from ..support.owners import listed, stores, totals_match, wait_expired


@pytest.fixture
def make_store(backend, mode, namespace):
    yield from stores(backend, mode, namespace)


def test_a_quota_is_not_taken_by_threads_whose_keys_expired(make_store, raw_client):
    store = make_store(thread_ttl=1)
    store.set_owner_quota("ann", threads=2, stored_bytes=1_000)
    old = [store.thread(name, owner="ann") for name in ("a", "b")]
    for thread in old:
        thread.append(UserMessage(content="x" * 300))
    wait_expired(raw_client, *(thread.keys.meta for thread in old))
    # No listing or usage read in between: the write itself finds the quota free.
    store.thread("c", owner="ann").append(UserMessage(content="a new thread " + "y" * 300))
    store.thread("d", owner="ann").set_info(title="and another")
    usage = store.owner_usage("ann")
    assert (usage.threads, usage.messages) == (2, 1)
    assert sorted(listed(store, "ann")) == ["c", "d"]
    totals_match(store, "ann")


def test_a_thread_written_after_its_expiry_starts_afresh(make_store, raw_client):
    store = make_store(thread_ttl=1)
    titled = store.thread("titled", owner="ann")
    titled.append([UserMessage(content="one"), UserMessage(content="two")])
    titled.set_info(title="Old", metadata={"model": "small"})
    written = store.thread("written", owner="ann")
    written.append(UserMessage(content="first life"))
    written.set_info(title="Old too")
    born = {t.thread_id: t.created_at for t in store.threads("ann").threads}
    wait_expired(raw_client, titled.keys.meta, written.keys.meta)
    # Gone before any listing repaired the directory.
    assert titled.info() is None and written.info() is None
    # Titled again: listed anew, with nothing of its first life.
    assert titled.set_info(title="New") is True
    info = titled.info()
    assert (info.title, info.metadata, info.messages, info.stored_bytes) == ("New", {}, 0, 0)
    assert info.created_at > born["titled"]
    # Written again: its old title is gone with it.
    written.append(UserMessage(content="second life"))
    info = written.info()
    assert (info.title, info.messages) == (None, 1)
    assert info.created_at > born["written"]
    for _ in range(2):  # a listing leaves both (they are not expired now)
        assert sorted(listed(store, "ann")) == ["titled", "written"]
    assert store.threads("ann", where={"model": "small"}).threads == []
    usage = store.owner_usage("ann")
    assert (usage.threads, usage.messages) == (2, 1)
    totals_match(store, "ann")


def test_a_write_by_a_store_without_a_ttl_keeps_the_deadline_its_keys_have(make_store, raw_client):
    with_ttl, without = make_store(thread_ttl=1), make_store()
    chat = with_ttl.thread("chat", owner="ann")
    chat.append(UserMessage(content="from the app"))
    # An admin tool without thread_ttl writes too: the keys keep their deadline.
    without.thread("chat", owner="ann").append(UserMessage(content="from a tool"))
    assert raw_client.pttl(chat.keys.meta) > 0
    wait_expired(raw_client, chat.keys.meta)
    assert chat.info() is None
    assert listed(with_ttl, "ann") == []
    usage = without.owner_usage("ann")
    assert (usage.threads, usage.messages) == (0, 0)


def test_a_usage_read_repairs_every_expired_thread_of_a_mass_expiry(make_store, raw_client):
    store = make_store(thread_ttl=1)
    threads = [store.thread(f"chat-{i:02d}", owner="ann") for i in range(40)]
    for thread in threads:
        thread.append(UserMessage(content="soon gone"))
    wait_expired(raw_client, *(thread.keys.meta for thread in threads))
    usage = store.owner_usage("ann")  # no listing first
    assert (usage.threads, usage.messages, usage.stored_bytes) == (0, 0, 0)
    assert listed(store, "ann") == []


def test_a_thread_listed_by_set_info_alone_is_gone_with_its_ttl(make_store, raw_client):
    store = make_store(thread_ttl=1)
    draft = store.thread("draft", owner="ann")
    assert draft.set_info(title="Not yet written", metadata={"k": "v"}) is True
    assert draft.info().title == "Not yet written"
    assert draft.stats().title == "Not yet written"
    time.sleep(1.2)  # past the ttl: no key of the thread was ever made to expire
    # Every read agrees with the listing: the thread is gone, title and all.
    assert draft.info() is None
    never = store.thread("never-written", owner="ann").stats()
    assert (
        (draft.stats().title, draft.stats().metadata) == (never.title, never.metadata) == (None, {})
    )
    assert listed(store, "ann") == []
    assert draft.info() is None
    # Titled again, it is a new thread.
    assert draft.set_info(title="Again") is True
    assert (draft.info().title, draft.info().metadata) == ("Again", {})


def test_keys_a_store_without_a_ttl_made_expire_with_the_thread(make_store, raw_client, namespace):
    with_ttl, without = make_store(thread_ttl=1, chunk_size=10), make_store(chunk_size=10)
    with_ttl.thread("chat", owner="ann").append(UserMessage(content="from the app"))
    # A worker without thread_ttl (a rolling config change) closes chunks and opens new ones.
    without.thread("chat", owner="ann").append([UserMessage(content=f"n{i}") for i in range(30)])
    chat = with_ttl.thread("chat", owner="ann")
    wait_expired(raw_client, chat.keys.meta)
    # Nothing of the thread outlived it, and its id starts a new thread.
    assert [k for k in raw_client.scan_iter(match=f"{namespace}:*") if b"|" in k] == []
    chat.append(UserMessage(content="a new conversation"))
    assert [m.content for m in chat.iter()] == ["a new conversation"]
    with_ttl.erase_owner("ann")
    assert list(raw_client.scan_iter(match=f"{namespace}:*")) == []
