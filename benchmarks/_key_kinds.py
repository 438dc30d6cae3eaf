"""A thread's keys by kind, and what they weigh on the server (MEMORY USAGE).

The memory benchmark breaks a thread's memory down by these kinds, peers compares a thread's
total with the peers' lists, and the plots label the kinds the same way.
"""

from __future__ import annotations

from typing import Any

import redis

# Key kinds, by the last part of the key name (docs/LAYOUT.md).
KINDS = {
    "window": "window (sorted set)",
    "wside": "window side hash",
    "open:d": "open chunk (string)",
    "open:m": "open chunk manifest",
    "chunk": "closed chunks",
    "ids": "ids map",
    "otids": "otids map",
    "chunks": "index: chunks",
    "large": "index: large",
    "turns": "turns",
    "meta": "meta",
    "messages": "legacy hash",
    "events": "event stream",
}


def memory_usage(client: redis.Redis, key: str) -> int:
    return int(client.memory_usage(key, samples=0) or 0)


def thread_memory(client: redis.Redis, prefix: str) -> dict[str, Any]:
    """MEMORY USAGE of every key under `prefix`, summed per key kind, with each kind's encoding."""
    kinds: dict[str, dict[str, Any]] = {}
    for key in client.scan_iter(match=prefix + "*", count=1000):
        part = key.decode()[len(prefix) :]
        kind = "chunk" if part.startswith("chunk:") else part
        entry = kinds.setdefault(kind, {"keys": 0, "bytes": 0, "encodings": {}})
        entry["keys"] += 1
        entry["bytes"] += memory_usage(client, key)
        encoding = client.object("encoding", key)
        encoding = encoding.decode() if isinstance(encoding, bytes) else str(encoding)
        entry["encodings"][encoding] = entry["encodings"].get(encoding, 0) + 1
    return {"total": sum(k["bytes"] for k in kinds.values()), "kinds": kinds}
