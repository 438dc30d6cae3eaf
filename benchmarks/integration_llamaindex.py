"""KvstoreChatStore against LlamaIndex's own RedisChatStore, side by side on the same server.

    python -m benchmarks.integration_llamaindex [--quick] [--url URL] [--json PATH]

On each server, one conversation at turn 1,000 (2,000 ChatMessages of 0.2–1 KB, user and
assistant in turn) is written through each store; then, alternating the two in every round:

- **Newest 50**: ``KvstoreChatStore(max_messages=50).get_messages`` against the peer's
  ``get_messages`` sliced to its last 50 (its interface has no bounded read: it reads the
  list whole). Target ≤ 1.0.
- **Whole history**: ``get_messages`` of both, every message. Target ≤ 1.2.
- **History handed to the model**: after a compaction keeping the newest 40 messages,
  ``KvstoreChatStore(max_tokens=8000).get_messages`` against the peer's whole read (what its
  memory reads before trimming). Target ≥ 10× faster.

Medians of the rounds, in µs per call.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass
from typing import Any

from llama_index.core.base.llms.types import ChatMessage
from llama_index.storage.chat_store.redis import RedisChatStore

from kvstore.integrations.llamaindex import KvstoreChatStore

from ._adapters import adapter_ratios, interleaved_medians, render
from ._common import Fixture, collect_per_server, standalone_main


@dataclass(frozen=True)
class Params:
    messages: int  # the conversation's length (2 per turn)
    rounds: int  # calls of each variant measured
    warmup: int


DEFAULT = Params(messages=2000, rounds=60, warmup=5)
QUICK = Params(messages=2000, rounds=8, warmup=1)


class Chats(Fixture):
    def cleanup(self) -> None:
        for key in self.client.scan_iter(match=f"{self.ns}*", count=1000):
            self.client.unlink(key)


def conversation(count: int, seed: int = 3) -> list[ChatMessage]:
    """`count` messages of 200–1000 characters, user and assistant in turn."""
    rng = random.Random(seed)
    words = [
        "weather",
        "cloudy",
        "forecast",
        "rain",
        "Oslo",
        "Bergen",
        "wind",
        "degrees",
        "tomorrow",
        "evening",
    ]
    made = []
    for n in range(count):
        size = rng.randint(200, 1000)
        text = ""
        while len(text) < size:
            text += rng.choice(words) + " "
        made.append(ChatMessage(role="user" if n % 2 == 0 else "assistant", content=text[:size]))
    return made


def run_server(url: str, params: Params, own: bool) -> dict[str, Any]:
    with Chats(url, params, own) as fixture:
        messages = conversation(params.messages)
        peer = RedisChatStore(redis_url=url)
        peer_key = f"{fixture.ns}:peer"
        peer.set_messages(peer_key, messages)
        whole = KvstoreChatStore(fixture.store)
        whole.set_messages("chat", messages)
        thread = fixture.store.thread("chat")
        newest = KvstoreChatStore(fixture.store, max_messages=50)
        budget = KvstoreChatStore(fixture.store, max_tokens=8000)
        assert newest.get_messages("chat") == peer.get_messages(peer_key)[-50:]
        assert whole.get_messages("chat") == peer.get_messages(peer_key)
        thread.compact("What was said so far.", thread.stats().next_sequence - 41)
        variants = {
            "peer_whole": lambda: peer.get_messages(peer_key),
            "peer_newest_50": lambda: peer.get_messages(peer_key)[-50:],
            "kvstore_newest_50": lambda: newest.get_messages("chat"),
            "kvstore_whole": lambda: whole.get_messages("chat"),
            "kvstore_context": lambda: budget.get_messages("chat"),
        }
        medians = interleaved_medians(variants, params.warmup, params.rounds)
        peer._redis_client.close()
        ratios = adapter_ratios(medians, "RedisChatStore")
        return {"server": fixture.version, "medians_us": medians, "ratios": ratios}


def collect(args: argparse.Namespace) -> dict[str, Any]:
    params = QUICK if args.quick else DEFAULT
    return collect_per_server("integration_llamaindex", args, params, run_server, render)


def main(argv: list[str] | None = None) -> int:
    return standalone_main("integration_llamaindex", __doc__, collect, argv)


if __name__ == "__main__":
    sys.exit(main())
