"""Memory per stored message, and a thread's memory over 600 turns with compaction.

    python -m benchmarks.memory [--quick] [--url URL] [--json PATH]

On each server:

- **Per message**: threads of 1,000 and 10,000 messages of ~1 KB (``UserMessage`` with 1,000
  characters of text). Their memory is the sum of ``MEMORY USAGE key SAMPLES 0`` over every key
  of the thread, broken down by key kind (window, window side hash, chunks, ids map, chunk
  indexes, meta, ...), divided by the messages stored; against the msgpack record size and
  against the JSON-list layout (one Redis list holding the same messages as JSON, as the popular
  chat-history stores keep them), measured the same way.
- **Bounded state**: one thread with ``retained_message_limit=100`` over 600 turns (a user
  message with an otid, ``start_turn``, an assistant reply, ``finish_turn``, each message ~1 KB),
  compacted every 20 turns with a ~500-character summary covering everything so far; its memory
  and stored messages sampled after every turn (a chunk closes about every 25 turns here, and
  retention drops one: sampled at that period, every sample would fall at the same point of
  the cycle, and the samples would drift with it), against a JSON list that receives the same
  messages; then the same turns with events off.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from kvstore import AssistantMessage, MessageStore, StoreConfig, UserMessage

from ._common import (
    TEXTS,
    Fixture,
    collect_per_server,
    fill_thread,
    log,
    make_texts,
    ratio,
    render_ratios,
    standalone_main,
)
from ._key_kinds import KINDS, memory_usage, thread_memory
from ._retained import bounded_ratios


@dataclass(frozen=True)
class Params:
    sizes: tuple[int, ...]
    turns: int
    compact_every: int
    retained: int
    sample_every: int


# The retained chat of issue 27: 600 turns, the newest 100 messages kept, compaction every 20.
DEFAULT = Params(sizes=(1_000, 10_000), turns=600, compact_every=20, retained=100, sample_every=1)
QUICK = DEFAULT


class Memory(Fixture):
    """The threads and JSON lists whose memory is measured, on one server."""

    params: Params

    def __init__(self, url: str, params: Params, own: bool) -> None:
        super().__init__(url, params, own)
        self.summary_text = make_texts(seed=11, count=1, size=500)[0]
        self.lists: list[str] = []
        self.stores: list[tuple[MessageStore, str]] = []

    def prefix(self, config: StoreConfig, thread_id: str) -> str:
        return f"{config.namespace}:{{{thread_id}}}:"

    def json_list(self, name: str) -> str:
        key = f"{self.ns}:{{list-{name}}}:messages"
        self.lists.append(key)
        return key

    # --- per message

    def per_message(self, size: int) -> dict[str, Any]:
        config = StoreConfig(namespace=self.ns)
        store = MessageStore(self.client, config)
        thread = store.thread(f"mem-{size}")
        self.stores.append((store, f"mem-{size}"))
        stored = fill_thread(thread, config, self.texts, size)
        stats = thread.stats()
        kvstore = thread_memory(self.client, self.prefix(config, f"mem-{size}"))

        # The list layout holding the same messages (as the appends returned them), as JSON.
        key = self.json_list(str(size))
        json_bytes = 0
        pipe = self.client.pipeline(transaction=False)
        for i, message in enumerate(stored):
            text = message.to_json()
            json_bytes += len(text.encode())
            pipe.rpush(key, text)
            if i % 1000 == 999:
                pipe.execute()
        pipe.execute()
        listed = memory_usage(self.client, key)
        n = stats.stored_messages
        return {
            "size": size,
            "messages": n,
            "record_bytes": stats.stored_bytes,
            "json_bytes": json_bytes,
            "kvstore": kvstore,
            "json_list": {"bytes": listed, "encoding": _text(self.client.object("encoding", key))},
            "chunks": stats.chunks,
            "window": stats.window_messages,
        }

    # --- bounded state

    def bounded(self, events: bool = True) -> dict[str, Any]:
        """The retained chat on one thread (`events`: with its event stream, or without)."""
        p = self.params
        config = StoreConfig(namespace=self.ns, retained_message_limit=p.retained, events=events)
        store = MessageStore(self.client, config)
        name = "bounded" if events else "bounded-quiet"
        thread = store.thread(name)
        self.stores.append((store, name))
        prefix = self.prefix(config, name)
        key = self.json_list(name)
        samples = []
        for turn in range(1, p.turns + 1):
            turn_id = f"turn-{turn}"
            (user,) = thread.append(
                UserMessage(content=self.texts[turn % TEXTS], otid=f"otid-{turn}"), turn_id=turn_id
            )
            thread.start_turn(turn_id)
            (reply,) = thread.append(
                AssistantMessage(content=self.texts[(turn * 7) % TEXTS]), turn_id=turn_id
            )
            thread.finish_turn(turn_id)
            self.client.rpush(key, user.to_json(), reply.to_json())
            if turn % p.compact_every == 0:
                summary = thread.compact(self.summary_text, reply.seq_id)
                self.client.rpush(key, summary.to_json())
            if turn % p.sample_every == 0:
                stats = thread.stats()
                memory = thread_memory(self.client, prefix)
                samples.append(
                    {
                        "turn": turn,
                        "kvstore_bytes": memory["total"],
                        "kinds": {k: v["bytes"] for k, v in memory["kinds"].items()},
                        "stored_messages": stats.stored_messages,
                        "stored_bytes": stats.stored_bytes,
                        "chunks": stats.chunks,
                        "window": stats.window_messages,
                        "deleted_before": stats.deleted_before_sequence,
                        "list_bytes": memory_usage(self.client, key),
                        "list_messages": self.client.llen(key),
                    }
                )
        return {
            "samples": samples,
            "bound_messages": p.retained + config.window_size + config.chunk_size,
            "config": {
                "retained_message_limit": p.retained,
                "window_size": config.window_size,
                "chunk_size": config.chunk_size,
                "compact_every": p.compact_every,
                "events": events,
            },
        }

    def cleanup(self) -> None:
        for store, thread_id in self.stores:
            store.thread(thread_id).delete()
        if self.lists:
            self.client.delete(*self.lists)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def run_server(url: str, params: Params, own: bool) -> dict[str, Any]:
    with Memory(url, params, own) as bench:
        version = bench.version
        sizes = []
        for size in params.sizes:
            log(f"{version}: a {size:,}-message thread and its JSON list")
            sizes.append(bench.per_message(size))
        log(f"{version}: {params.turns:,} turns with compaction every {params.compact_every}")
        bounded = bench.bounded()
        log(f"{version}: the same, events off")
        quiet = bench.bounded(events=False)
    # Debian's Redis allocates with jemalloc, the embedded Valkey with libc malloc.
    per_message_target = 1.1 if version.startswith("Valkey") else 1.25
    ratios = []
    for s in sizes:
        size, n = s["size"], s["messages"]
        ratios.append(
            ratio(
                f"memory_vs_list_{size}",
                f"memory per message, {size:,}: kvstore / JSON list",
                s["kvstore"]["total"] / s["json_list"]["bytes"],
                per_message_target,
            )
        )
        ratios.append(
            ratio(
                f"memory_vs_record_{size}",
                f"memory per message, {size:,}: kvstore / msgpack record",
                s["kvstore"]["total"] / s["record_bytes"],
                None,
            )
        )
        ratios.append(
            ratio(
                f"list_vs_json_{size}",
                f"memory per message, {size:,}: JSON list / JSON text",
                s["json_list"]["bytes"] / s["json_bytes"],
                None,
            )
        )
        s["per_message"] = {
            "kvstore": s["kvstore"]["total"] / n,
            "json_list": s["json_list"]["bytes"] / n,
            "record": s["record_bytes"] / n,
            "json": s["json_bytes"] / n,
        }
    ratios += bounded_ratios(bounded, quiet, params)
    return {
        "server": version,
        "sizes": sizes,
        "bounded": bounded,
        "bounded_events_off": quiet,
        "ratios": ratios,
    }


def render(result: dict[str, Any]) -> str:
    lines = [f"== {result['server']} ==", ""]
    sizes = result["sizes"]
    heads = "".join(f"{s['size']:>15,} msgs" + " " * 2 for s in sizes)
    lines.append(f"{'bytes per stored message':<28}{heads}")
    lines.append(f"{'':<28}" + "".join(f"{'per msg':>10} {'keys':>11}" for _ in sizes))
    kinds = []
    for s in sizes:
        for kind in s["kvstore"]["kinds"]:
            if kind not in kinds:
                kinds.append(kind)
    order = [k for k in KINDS if k in kinds] + [k for k in kinds if k not in KINDS]
    for kind in order:
        row = f"  {KINDS.get(kind, kind):<26}"
        for s in sizes:
            entry = s["kvstore"]["kinds"].get(kind)
            if entry:
                encodings = ",".join(entry["encodings"])
                row += f"{entry['bytes'] / s['messages']:>10.1f} {entry['keys']:>3} {encodings:<7}"
            else:
                row += f"{'-':>10} {'':>11}"
        lines.append(row)

    def total(label: str, pick: Any) -> None:
        lines.append(
            f"{label:<28}" + "".join(f"{pick(s) / s['messages']:>10.1f} {'':>11}" for s in sizes)
        )

    total("kvstore, all keys", lambda s: s["kvstore"]["total"])
    total("JSON list (same messages)", lambda s: s["json_list"]["bytes"])
    total("  msgpack record", lambda s: s["record_bytes"])
    total("  JSON text", lambda s: s["json_bytes"])
    lines.append("")
    lines += _bounded_lines(result)
    lines.append("")
    lines += render_ratios(result["ratios"], "ratios")
    return "\n".join(lines)


def _bounded_lines(result: dict[str, Any]) -> list[str]:
    """The retained chat's samples, its band, and the same turns with events off."""
    lines: list[str] = []
    b = result["bounded"]
    cfg = b["config"]
    lines.append(
        f"bounded state: {b['samples'][-1]['turn']:,} turns, compaction every "
        f"{cfg['compact_every']}, retained_message_limit {cfg['retained_message_limit']}; "
        f"retention from turn {b.get('retention_from_turn', '-')}"
    )
    lines.append(
        f"{'turn':>6} {'kvstore KB':>11} {'stored':>7} {'chunks':>7} {'JSON list KB':>13} {'list msgs':>10}"
    )
    for x in b["samples"]:
        if x["turn"] % 100 == 0 or x is b["samples"][0]:
            lines.append(
                f"{x['turn']:>6} {x['kvstore_bytes'] / 1024:>11.1f} {x['stored_messages']:>7} "
                f"{x['chunks']:>7} {x['list_bytes'] / 1024:>13.1f} {x['list_messages']:>10}"
            )
    if "band" in b:
        lines.append(
            f"kvstore after retention starts: {b['band'][0] / 1024:.1f}-{b['band'][1] / 1024:.1f} KB, "
            f"at most {b['max_stored']} messages stored (bound {b['bound_messages']} + summaries)"
        )
    if "bytes_per_message" in b:
        per = b["bytes_per_message"]
        lines.append(
            f"bytes per stored message once retention runs: {per['min']:,.0f}-{per['max']:,.0f}"
            f" (median {per['median']:,.0f})"
        )
    quiet = result.get("bounded_events_off")
    if quiet:
        lines.append(
            "events off, the same turns: "
            + ", ".join(
                f"turn {x['turn']} {x['kvstore_bytes'] / 1024:.1f} KB"
                for x in quiet["samples"]
                if x["turn"] % 200 == 0
            )
        )
    last = b["samples"][-1]
    lines.append(
        "at the last sample, kvstore by key kind (KB): "
        + ", ".join(
            f"{KINDS.get(k, k)} {v / 1024:.1f}"
            for k, v in sorted(last["kinds"].items(), key=lambda kv: -kv[1])
        )
    )
    return lines


def collect(args: argparse.Namespace) -> dict[str, Any]:
    params = QUICK if args.quick else DEFAULT
    return collect_per_server("memory", args, params, run_server, render)


def main(argv: list[str] | None = None) -> int:
    return standalone_main("memory", __doc__, collect, argv)


if __name__ == "__main__":
    sys.exit(main())
