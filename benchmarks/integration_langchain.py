"""KvstoreChatMessageHistory against LangChain community's RedisChatMessageHistory, side by side
on the same server.

    python -m benchmarks.integration_langchain [--quick] [--url URL] [--json PATH]

On each server, one conversation at turn 1,000 (2,000 messages of 0.2–1 KB, human and AI in
turn) is written through each history; then, alternating them in every round:

- **Newest 50**: ``KvstoreChatMessageHistory(max_messages=50).messages`` against the peer's
  ``messages`` sliced to its last 50 (the peer has no bounded read: it reads the list whole).
  Target ≤ 1.0.
- **Whole history**: the peer's ``messages`` against kvstore's whole thread as LangChain
  messages (``messages_from_dict(to_langchain(thread.iter()))``: the adapter itself reads at most
  1,000). Target ≤ 1.2.
- **History handed to the model**: after a compaction keeping the newest 40 messages,
  ``KvstoreChatMessageHistory(max_tokens=8000).messages`` against the peer's whole read.
  Target ≥ 10× faster.

Medians of the rounds, in µs per call.
"""

from __future__ import annotations

import argparse
import random
import sys
import warnings
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, messages_from_dict

from kvstore.importers import to_langchain
from kvstore.integrations.langchain import KvstoreChatMessageHistory

from ._adapters import adapter_ratios, interleaved_medians, render
from ._common import Fixture, collect_per_server, standalone_main

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # langchain-community announces its sunset
    from langchain_community.chat_message_histories import RedisChatMessageHistory


@dataclass(frozen=True)
class Params:
    messages: int  # the conversation's length (2 per turn)
    rounds: int  # calls of each variant measured
    warmup: int


DEFAULT = Params(messages=2000, rounds=60, warmup=5)
QUICK = Params(messages=2000, rounds=8, warmup=1)
_WORDS = ("weather", "cloudy", "forecast", "rain", "Oslo", "Bergen", "wind", "degrees", "evening")


class Histories(Fixture):
    def cleanup(self) -> None:
        for key in self.client.scan_iter(match=f"{self.ns}*", count=1000):
            self.client.unlink(key)


def conversation(count: int, seed: int = 3) -> list[BaseMessage]:
    """`count` messages of 200–1000 characters, human and AI in turn."""
    rng = random.Random(seed)
    made: list[BaseMessage] = []
    for n in range(count):
        size = rng.randint(200, 1000)
        text = ""
        while len(text) < size:
            text += rng.choice(_WORDS) + " "
        kind = HumanMessage if n % 2 == 0 else AIMessage
        made.append(kind(content=text[:size]))
    return made


def _variants(fixture: Histories, url: str) -> tuple[dict[str, Any], Any]:
    messages = conversation(fixture.params.messages)
    peer = RedisChatMessageHistory("peer", url=url, key_prefix=f"{fixture.ns}:message_store:")
    peer.add_messages(messages)
    thread = fixture.store.thread("chat")
    for start in range(0, len(messages), 500):
        KvstoreChatMessageHistory(fixture.store, "chat").add_messages(messages[start : start + 500])
    newest = KvstoreChatMessageHistory(fixture.store, "chat", max_messages=50)
    budget = KvstoreChatMessageHistory(fixture.store, "chat", max_tokens=8000)

    def kvstore_whole() -> list[BaseMessage]:
        return messages_from_dict(to_langchain(thread.iter()))

    assert [m.content for m in newest.messages] == [m.content for m in peer.messages[-50:]]
    assert [m.content for m in kvstore_whole()] == [m.content for m in peer.messages]
    thread.compact("What was said so far.", thread.stats().next_sequence - 41)
    return {
        "peer_whole": lambda: peer.messages,
        "peer_newest_50": lambda: peer.messages[-50:],
        "kvstore_newest_50": lambda: newest.messages,
        "kvstore_whole": kvstore_whole,
        "kvstore_context": lambda: budget.messages,
    }, peer


def run_server(url: str, params: Params, own: bool) -> dict[str, Any]:
    with Histories(url, params, own) as fixture:
        variants, peer = _variants(fixture, url)
        medians = interleaved_medians(variants, params.warmup, params.rounds)
        peer.redis_client.close()
        ratios = adapter_ratios(medians, "RedisChatMessageHistory")
        return {"server": fixture.version, "medians_us": medians, "ratios": ratios}


def collect(args: argparse.Namespace) -> dict[str, Any]:
    params = QUICK if args.quick else DEFAULT
    return collect_per_server("integration_langchain", args, params, run_server, render)


def main(argv: list[str] | None = None) -> int:
    return standalone_main("integration_langchain", __doc__, collect, argv)


if __name__ == "__main__":
    sys.exit(main())
