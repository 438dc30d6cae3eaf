"""The demo's options, its limits, and the failure of one of its checks."""

from __future__ import annotations

from dataclasses import dataclass

from ...config import StoreConfig

# The demo keeps a short history so compaction visibly holds memory flat.
RETAINED = 200
COMPACT_EVERY = 5  # turns of one worker
CHAT_THREAD = "chat"
JOB_THREAD = "job"
JOB_REPLIES = 30
KILLED_AFTER = 12  # replies the server has stored when the worker dies
MEMORY_SAMPLES = 24
# Memory is flat if, once retention holds every thread, the mean of the samples in the second
# half of that stretch is at most this much above the first half's (unbounded, it would grow
# with the messages: about +40 % over the stretch of the default run).
FLAT_GROWTH = 0.15
MIN_HALF_SAMPLES = 3  # the fewest samples a mean is taken over
SPARKS = "▁▂▃▄▅▆▇█"


def demo_config(namespace: str) -> StoreConfig:
    return StoreConfig(namespace=namespace, retained_message_limit=RETAINED)


@dataclass(frozen=True)
class DemoOptions:
    url: str
    namespace: str
    workers: int = 4
    threads: int = 8
    turns: int = 400  # per worker
    # How a later command reaches the same server and namespace (for the command to try next).
    reach: str = "--namespace demo"


class DemoFailed(Exception):
    """A check of the demo's own claims failed."""


# The words the demo's messages are made of.
WORDS = [
    "the",
    "a",
    "thread",
    "message",
    "model",
    "tool",
    "call",
    "result",
    "user",
    "answer",
    "question",
    "context",
    "window",
    "chunk",
    "index",
    "summary",
    "turn",
    "reply",
    "stream",
    "token",
    "latency",
    "memory",
    "server",
    "worker",
    "process",
    "append",
    "page",
    "cursor",
    "order",
]
