"""Processes for the live-tail tests (tests/integration/test_watch_processes.py): producers that append, and
a consumer that watches, each in its own interpreter, on its own client."""

from __future__ import annotations

from typing import Any

from kvstore import MessageStore, StoreConfig, UserMessage
from kvstore.events import MessagesAdded


def produce(url: str, namespace: str, thread_id: str, worker: int, count: int) -> None:
    """Appends `count` messages with otids w<worker>-<k>, one call each."""
    with MessageStore.from_url(url, StoreConfig(namespace=namespace)) as store:
        thread = store.thread(thread_id)
        for k in range(count):
            thread.append(UserMessage(content=f"from {worker}", otid=f"w{worker}-{k}"))


def consume(url: str, namespace: str, thread_id: str, total: int, out: Any) -> None:
    """Watches from the thread's first event until `total` messages came; puts what it saw,
    [(cursor, [(sequence, otid)])], on `out`."""
    seen: list[tuple[str, list[tuple[int, str]]]] = []
    count = 0
    with (
        MessageStore.from_url(url, StoreConfig(namespace=namespace)) as store,
        store.thread(thread_id).watch(after="0-0", block_ms=1000) as events,
    ):
        for event in events:
            assert isinstance(event, MessagesAdded), event
            seen.append((event.cursor, [(m.seq_id, m.otid) for m in event.messages]))
            count += len(event.messages)
            if count >= total:
                break
    out.put(seen)
