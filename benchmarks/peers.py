"""kvstore beside real chat-history stores from PyPI that need no server modules (optional).

    python -m benchmarks.peers [--quick] [--url URL] [--json PATH]

The peers are llama-index's ``RedisChatStore`` (package llama-index-storage-chat-store-redis)
and LangChain's legacy ``RedisChatMessageHistory`` (package langchain-community). Both keep a
conversation as one Redis list of JSON messages: they are the JSON-list layout of the other
benchmarks as people install it. They are not kvstore's dependencies: this benchmark installs
them with pip into ``benchmarks/results/peer-packages`` (git-ignored) the first time, and
imports them from there; nothing else is changed. ``python -m benchmarks`` runs it only with
``--peers``.

On each server, interleaved round by round: appending one ~1 KB user message (their
``add_message``, kvstore's ``thread.append``), and reading a conversation of 1,000 and of 10,000
messages the way each offers (theirs: the whole list, parsed into their message models;
kvstore: the newest page of 50, validated). Then memory per message (MEMORY USAGE) of each at
10,000 messages.
"""

from __future__ import annotations

import argparse
import importlib
import site
import subprocess
import sys
from dataclasses import dataclass
from itertools import count
from typing import Any

from ._common import (
    RESULTS_DIR,
    TEXTS,
    Fixture,
    MessagePool,
    Variant,
    each_server,
    fill_thread,
    log,
    measure,
    new_messages,
    ratio,
    render_ratios,
    standalone_main,
    summarize,
)
from ._key_kinds import thread_memory
from ._machine import headline, machine

PACKAGES = ("llama-index-storage-chat-store-redis", "langchain-community")
TARGET = RESULTS_DIR / "peer-packages"
PAGE = 50


@dataclass(frozen=True)
class Params:
    calls: int
    warmup: int
    sizes: tuple[int, ...]
    whole_every: dict[int, int]  # list size -> one read every N rounds


DEFAULT = Params(calls=1000, warmup=100, sizes=(1_000, 10_000), whole_every={1_000: 10, 10_000: 50})
QUICK = Params(calls=200, warmup=20, sizes=(1_000, 10_000), whole_every={1_000: 10, 10_000: 40})


def ensure_installed() -> str | None:
    """Makes the peers importable; installs them with pip the first time. None, or why not."""
    site.addsitedir(str(TARGET))  # after the environment's own packages: theirs win
    try:
        importlib.import_module("llama_index.storage.chat_store.redis")
        importlib.import_module("langchain_community.chat_message_histories")
        return None
    except ImportError:
        pass
    log(f"installing {', '.join(PACKAGES)} into {TARGET} (pip; once)")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--target", str(TARGET), *PACKAGES],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        return f"pip install failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
    importlib.invalidate_caches()
    site.addsitedir(str(TARGET))
    try:
        importlib.import_module("llama_index.storage.chat_store.redis")
        importlib.import_module("langchain_community.chat_message_histories")
    except ImportError as exc:
        return f"installed but not importable: {exc}"
    return None


class Peers(Fixture):
    """kvstore's threads and the peers' conversations of one run on one server."""

    params: Params

    def __init__(self, url: str, params: Params, own: bool) -> None:
        from langchain_core.messages import HumanMessage
        from llama_index.core.llms import ChatMessage
        from llama_index.storage.chat_store.redis import RedisChatStore

        super().__init__(url, params, own)
        self.llama = RedisChatStore(redis_url=url, redis_client=self.client)
        self.llama_messages = [ChatMessage(role="user", content=t) for t in self.texts]
        self.lc_messages = [HumanMessage(content=t) for t in self.texts]
        self.lc_keys: list[str] = []
        # Per size: kvstore's thread, llama-index's list key, LangChain's history.
        self.kv: dict[int, Any] = {}
        self.ll: dict[int, str] = {}
        self.lc: dict[int, Any] = {}

    def langchain(self, session: str) -> Any:
        from langchain_community.chat_message_histories import RedisChatMessageHistory

        history = RedisChatMessageHistory(session, url=self.url, key_prefix=f"{self.ns}:lc:")
        self.lc_keys.append(history.key)
        return history

    def fill(self) -> None:
        """A conversation of each size in each store, and one more of each to append to."""
        for size in self.params.sizes:
            self.kv[size] = self.store.thread(f"kv-{size}")
            fill_thread(self.kv[size], self.config, self.texts, size)
            self.ll[size] = f"{self.ns}:llama:{size}"
            pipe = self.client.pipeline(transaction=False)
            for i in range(size):
                pipe.rpush(self.ll[size], self.llama_messages[i % TEXTS].model_dump_json())
            pipe.execute()
            self.lc[size] = self.langchain(f"read-{size}")
            self.lc[size].add_messages([self.lc_messages[i % TEXTS] for i in range(size)])
        self.append_thread = self.store.thread("kv-append")
        self.append_thread.append(new_messages(self.texts, 100))
        self.append_llama = f"{self.ns}:llama:append"
        self.append_lc = self.langchain("append")

    def variants(self) -> list[Variant]:
        p, llama = self.params, self.llama
        thread, llama_key, history = self.append_thread, self.append_llama, self.append_lc
        llama_messages, lc_messages = self.llama_messages, self.lc_messages
        ours, ll_calls, lc_calls = MessagePool(self.texts, p.warmup + p.calls), count(), count()
        variants = [
            Variant("kv_append", "kvstore: thread.append", lambda: thread.append(ours.take())),
            Variant(
                "llama_append",
                "llama-index: RedisChatStore.add_message",
                lambda: llama.add_message(llama_key, llama_messages[next(ll_calls) % TEXTS]),
            ),
            Variant(
                "lc_append",
                "LangChain: RedisChatMessageHistory.add_message",
                lambda: history.add_message(lc_messages[next(lc_calls) % TEXTS]),
            ),
        ]
        for size in p.sizes:
            every = p.whole_every[size]
            variants += [
                Variant(
                    f"kv_page_{size}",
                    f"kvstore: newest 50 of {size:,} (thread.list)",
                    lambda t=self.kv[size]: t.list(limit=PAGE, order="desc"),
                ),
                Variant(
                    f"llama_read_{size}",
                    f"llama-index: get_messages of {size:,} (whole list)",
                    lambda k=self.ll[size]: llama.get_messages(k),
                    every=every,
                ),
                Variant(
                    f"lc_read_{size}",
                    f"LangChain: .messages of {size:,} (whole list)",
                    lambda h=self.lc[size]: h.messages,
                    every=every,
                ),
            ]
        return variants

    def check(self) -> None:
        size = self.params.sizes[0]
        if (
            len(self.llama.get_messages(self.ll[size])) != size
            or len(self.lc[size].messages) != size
        ):
            raise RuntimeError("a peer does not hold the messages it was given")

    def memory(self) -> dict[str, Any]:
        """Memory per message of each at the largest size, and the JSON of one message of each peer."""
        client, big = self.client, max(self.params.sizes)
        return {
            "kvstore": thread_memory(client, f"{self.ns}:{{kv-{big}}}:")["total"] / big,
            "llama": int(client.memory_usage(self.ll[big], samples=0)) / big,
            "langchain": int(client.memory_usage(self.lc[big].key, samples=0)) / big,
            "llama_json_bytes": len(self.llama_messages[0].model_dump_json()),
            "langchain_json_bytes": len(client.lindex(self.lc[big].key, 0)),
        }

    def cleanup(self) -> None:
        for thread in self.kv.values():
            thread.delete()
        self.append_thread.delete()
        self.client.delete(*self.ll.values(), self.append_llama, *self.lc_keys)


def run_server(url: str, params: Params, own: bool) -> dict[str, Any]:
    with Peers(url, params, own) as peers:
        log(f"{peers.version}: filling kvstore threads and the peers' conversations")
        peers.fill()
        variants = peers.variants()
        peers.check()
        log(f"  measuring {len(variants)} variants, {params.calls:,} rounds, interleaved")
        samples = measure(variants, params.calls, params.warmup)
        latency = {v.name: {"label": v.label, **summarize(samples[v.name])} for v in variants}
        memory = peers.memory()
    return {
        "server": peers.version,
        "latency": latency,
        "memory": memory,
        "ratios": _ratios(latency, memory, max(params.sizes)),
    }


def _ratios(latency: dict[str, Any], memory: dict[str, Any], big: int) -> list[dict[str, Any]]:
    med = {k: v["median_us"] for k, v in latency.items()}
    return [
        ratio(
            "append_vs_llama",
            "append: kvstore / llama-index add_message",
            med["kv_append"] / med["llama_append"],
            None,
        ),
        ratio(
            "append_vs_langchain",
            "append: kvstore / LangChain add_message",
            med["kv_append"] / med["lc_append"],
            None,
        ),
        ratio(
            "llama_read_vs_page",
            f"read {big:,}: llama-index whole / kvstore newest 50",
            med[f"llama_read_{big}"] / med[f"kv_page_{big}"],
            20.0,
            higher=True,
        ),
        ratio(
            "langchain_read_vs_page",
            f"read {big:,}: LangChain whole / kvstore newest 50",
            med[f"lc_read_{big}"] / med[f"kv_page_{big}"],
            20.0,
            higher=True,
        ),
        ratio(
            "memory_vs_llama",
            f"memory per message, {big:,}: kvstore / llama-index list",
            memory["kvstore"] / memory["llama"],
            1.1,
        ),
        ratio(
            "memory_vs_langchain",
            f"memory per message, {big:,}: kvstore / LangChain list",
            memory["kvstore"] / memory["langchain"],
            1.1,
        ),
    ]


def render(result: dict[str, Any]) -> str:
    lines = [
        f"== {result['server']} ==",
        "",
        f"{'latency (µs)':<52} {'median':>10} {'p99':>10} {'calls':>6}",
    ]
    for s in result["latency"].values():
        lines.append(f"{s['label']:<52} {s['median_us']:>10,.1f} {s['p99_us']:>10,.1f} {s['n']:>6}")
    m = result["memory"]
    lines.append(
        f"memory per message at 10,000: kvstore {m['kvstore']:,.0f} B, llama-index {m['llama']:,.0f} B "
        f"({m['llama_json_bytes']:,} B of JSON each), LangChain {m['langchain']:,.0f} B "
        f"({m['langchain_json_bytes']:,} B of JSON each)"
    )
    lines.append("")
    lines += render_ratios(result["ratios"], "ratios")
    return "\n".join(lines)


def collect(args: argparse.Namespace) -> dict[str, Any]:
    params = QUICK if args.quick else DEFAULT
    info = machine()
    print(headline("peers", info, args.quick))
    problem = ensure_installed()
    if problem:
        print(f"peers skipped: {problem}")
        return {"params": params.__dict__, "machine": info, "skipped": problem, "servers": []}
    from importlib import metadata

    versions = {}
    for package in (
        "llama-index-storage-chat-store-redis",
        "llama-index-core",
        "langchain-community",
        "langchain-core",
    ):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    print("peers: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    results = []
    for name, url, own in each_server(args.url):
        results.append({"name": name, **run_server(url, params, own)})
        print()
        print(render(results[-1]), flush=True)
    return {
        "params": params.__dict__,
        "machine": info,
        "peer_versions": versions,
        "servers": results,
    }


def main(argv: list[str] | None = None) -> int:
    return standalone_main("peers", __doc__, collect, argv)


if __name__ == "__main__":
    sys.exit(main())
