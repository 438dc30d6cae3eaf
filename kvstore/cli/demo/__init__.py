"""`kvstore demo`: what kvstore does, in four short scenes on one server.

1. A conversation, stored and read back as a chat.
2. The same request sent twice (same otid): stored once.
3. A worker killed between the server storing its append and reading the reply; the job run
   again stores nothing twice.
4. Worker processes chatting on shared threads while summaries and retention hold memory flat.

Scenes 1 to 3 check what they claim on the server, scene 4 that every thread is gap-free and
that memory held flat once retention held every thread (workers.memory_verdict); the demo
prints FAILED and exits 1 if a check fails.
"""

from __future__ import annotations

import sys
from typing import IO, Any

import redis

from ...store import MessageStore
from .options import CHAT_THREAD, JOB_THREAD, DemoFailed, DemoOptions, demo_config
from .story import conversation_scene, killed_worker_scene
from .workers import workers_scene

__all__ = ["DemoOptions", "durability", "run_demo"]


def run_demo(options: DemoOptions, out: IO[str] = sys.stdout) -> int:
    client = redis.Redis.from_url(options.url)
    store = MessageStore.from_url(options.url, demo_config(options.namespace))
    print(f"durability: {durability(client)}", file=out)
    for thread_id in (CHAT_THREAD, JOB_THREAD, *(f"demo-{t}" for t in range(options.threads))):
        store.thread(thread_id).delete()  # start from empty threads
    try:
        conversation_scene(store.thread(CHAT_THREAD), out)
        killed_worker_scene(options, store.thread(JOB_THREAD), out)
        if not workers_scene(options, store, client, out):
            return 1
    except DemoFailed as failed:
        print(f"\nFAILED: {failed}", file=out)
        return 1
    finally:
        store.close()
        client.close()
    print(
        f"\nNext, look at how a thread is stored:  kvstore inspect demo-0 {options.reach}", file=out
    )
    print(
        f"  or read the chat back as JSON lines:  kvstore export {CHAT_THREAD} {options.reach}",
        file=out,
    )
    return 0


def durability(client: redis.Redis) -> str:
    """What an acknowledged write survives on this server, from CONFIG GET."""
    try:
        appendonly = _config(client, "appendonly")
        appendfsync = _config(client, "appendfsync")
    except redis.RedisError as exc:
        return f"could not read the server's appendfsync (CONFIG GET: {exc})"
    if appendonly != "yes":
        return f"appendonly {appendonly}: no AOF, a restart keeps only the last snapshot, if any"
    meaning = {
        "always": "every acknowledged write is on disk before the reply",
        "everysec": "a crash can lose the last second of acknowledged writes",
        "no": "the operating system decides when writes reach the disk",
    }
    return f"appendfsync {appendfsync} (AOF on): {meaning.get(appendfsync, 'an unknown setting')}"


def _config(client: redis.Redis, name: str) -> str:
    # Bytes keys and values on a client without decode_responses (redis-py types them str).
    reply: dict[Any, Any] = client.config_get(name)
    value = reply.get(name.encode(), reply.get(name))
    if value is None:
        raise redis.ResponseError(f"{name} not returned")
    return value.decode() if isinstance(value, bytes) else str(value)
