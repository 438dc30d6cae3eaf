"""Server time per append and per page, from INFO commandstats, against native baselines.

    python -m benchmarks.server_cost [--quick] [--url URL] [--json PATH]

The server is single-threaded and shared by every client, so its time per operation is what
bounds a deployment's throughput. On each server, over many calls of each:

- kvstore's append (one FCALL of its function, or one EVALSHA with scripting="eval"; one append
  in 32 also moves a chunk, so this is the amortized cost) against the bare 4-write script
  (HINCRBY, HSET, ZADD, HSET with the same record bytes, by EVALSHA);
- kvstore's newest page of 50 (native reads only) and an older page of 50 from a sequence
  cursor (the plan's native reads plus the native fetch of the chunks it names) against one native
  HMGET of 50 fields of 1 KB records, and the JSON list's LRANGE -50 -1; for information, the same
  older page from an id cursor (planned by the page_plan script).

An FCALL's or EVALSHA's usec covers the commands its script runs (they are also counted under
their own names); so a script request is charged that time, and a pipeline of native commands the
sum of its commands. Replayed requests are sent as the executor sends them. The same loops also report the server process's CPU time (INFO cpu,
user + sys, which includes reading and writing sockets) per call, for information.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis

from kvstore import MessageStore, StoreConfig, UserMessage
from kvstore._engine.core import Batch, Eval
from kvstore._engine.executor import record
from kvstore._engine.record import encode_record
from kvstore._engine.wire import ChunkEntry

from ._common import (
    SCRIPT_COMMANDS,
    MessagePool,
    new_messages,
    BARE_SCRIPT,
    command_stats,
    send_script,
    log,
    make_texts,
    ratio,
    render_ratios,
    server_version,
    standalone_main,
    stats_diff,
    collect_per_server,
)

PAGE = 50


@dataclass(frozen=True)
class Params:
    messages: int  # in the measured thread
    calls: int  # per operation
    warmup: int


DEFAULT = Params(messages=10_000, calls=3000, warmup=200)
QUICK = Params(messages=2_000, calls=500, warmup=50)


class Recorder(MessageStore):
    """A store that also keeps every request its operations send, to replay them one by one."""

    def __init__(self, client: redis.Redis, config: StoreConfig) -> None:
        super().__init__(client, config)
        self.requests: list[Eval | Batch] = []
        record(self, self.requests.append)


def cpu_seconds(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def timed(client: redis.Redis, calls: int, fn: Callable[[int], Any], scripted: bool) -> dict[str, Any]:
    """Server time per call of `fn`: its script command's time if `scripted`, else the sum of its
    commands."""
    cpu_before, before = cpu_seconds(client), command_stats(client)
    for i in range(calls):
        fn(i)
    after, cpu_after = command_stats(client), cpu_seconds(client)
    diff = stats_diff(before, after)
    diff.pop("cpu", None)
    diff = {k: v for k, v in diff.items() if not k.startswith("info")}
    if scripted:
        scripts = {k: v for k, v in diff.items() if k in SCRIPT_COMMANDS}
        usec = sum(v["usec"] for v in scripts.values())
        inner = sum(v["usec"] for k, v in diff.items() if k not in scripts)
    else:
        usec, inner = sum(v["usec"] for v in diff.values()), 0
    return {
        "calls": calls,
        "usec_per_call": usec / calls,
        "inner_usec_per_call": inner / calls,
        "cpu_usec_per_call": (cpu_after - cpu_before) * 1e6 / calls,
        "commands": {k: {**v, "per_call": v["calls"] / calls, "usec_per_call": v["usec"] / v["calls"]}
                     for k, v in sorted(diff.items())},
    }


def slowlog_appends(client: redis.Redis, append: Callable[[int], Any], calls: int,
                    per_chunk: int) -> dict[str, Any] | None:
    """Each append's own server time, from SLOWLOG with a 0 µs threshold (own servers only):
    the typical append against the one in `per_chunk` (the messages a chunk holds) that also
    moves a chunk."""
    try:
        client.config_set("slowlog-log-slower-than", 0)
        # Valkey also logs the commands a script runs: room for all of them.
        client.config_set("slowlog-max-len", calls * 40)
        client.slowlog_reset()
    except redis.ResponseError:
        return None
    for i in range(calls):
        append(i)
    entries = client.slowlog_get(calls * 40)
    client.config_set("slowlog-log-slower-than", 10000)
    scripted = tuple(name.upper().encode() + b" " for name in SCRIPT_COMMANDS)
    durations = sorted(e["duration"] for e in entries if bytes(e["command"]).upper().startswith(scripted))
    if not durations:
        return None
    moving = max(1, len(durations) // per_chunk)
    return {
        "calls": len(durations),
        "median_us": durations[len(durations) // 2],
        "typical_mean_us": sum(durations[:-moving]) / (len(durations) - moving),
        "slowest_share_mean_us": sum(durations[-moving:]) / moving,
        "slowest_share": f"1 in {per_chunk} ({moving})",
    }


def run_server(url: str, params: Params, own: bool) -> dict[str, Any]:
    client = redis.Redis.from_url(url, decode_responses=False)
    ns = f"bench-{uuid.uuid4().hex[:8]}"
    config = StoreConfig(namespace=ns)
    store = Recorder(client, config)
    texts = make_texts()
    messages = [UserMessage(content=t) for t in texts]
    try:
        version = server_version(client)
        log(f"{version} at {url}: filling a {params.messages:,}-message thread")
        thread = store.thread("cost")
        batch = config.max_chunks_per_call * config.chunk_size
        for start in range(0, params.messages, batch):
            thread.append(new_messages(texts, min(batch, params.messages - start), start))

        stamped = messages[0].model_copy(update={"id": f"message-{uuid.uuid4()}", "date": datetime.now(UTC)})
        blob = encode_record(stamped)
        script_keys = [f"{ns}:{{bare}}:{part}" for part in ("records", "meta", "index", "ids")]
        sha = client.script_load(BARE_SCRIPT)
        hmget_key = f"{ns}:{{native}}:hash"
        client.hset(hmget_key, mapping={i: blob for i in range(1, 65)})
        fields = list(range(1, PAGE + 1))
        list_key = f"{ns}:{{native}}:list"
        client.rpush(list_key, *[stamped.to_json()] * 100)

        # The requests of one newest page and of one older page, to replay.
        store.requests.clear()
        thread.list(limit=PAGE, order="desc")
        newest = list(store.requests)
        store.requests.clear()
        older_page = thread.list(before=params.messages // 2, limit=PAGE, order="desc")
        older = list(store.requests)
        if len(older_page.messages) != PAGE or len(older) != 2:
            raise RuntimeError("the older page was not one plan and one fetch")
        cursor_id = thread.list(after=params.messages // 2 - 1, limit=1).messages[0].id
        store.requests.clear()
        by_id_page = thread.list(before=cursor_id, limit=PAGE, order="desc")
        by_id = list(store.requests)
        if by_id_page.messages != older_page.messages or not isinstance(by_id[0], Eval):
            raise RuntimeError("the older page from an id cursor did not go through the page plan")

        def replay(request: Eval | Batch) -> Callable[[int], Any]:
            if isinstance(request, Eval):
                return lambda _i: send_script(client, store, request)

            def pipeline(_i: int) -> Any:
                pipe = client.pipeline(transaction=False)
                for command in request.commands:
                    pipe.execute_command(*command)
                return pipe.execute()
            return pipeline

        n = params.calls
        ids = [f"message-{uuid.uuid4()}" for _ in range(n + params.warmup)]
        log(f"  measuring {n:,} calls of each operation")
        for i, message in enumerate(new_messages(texts, params.warmup)):  # warm the script cache and the allocator
            thread.append(message)
            client.evalsha(sha, 4, *script_keys, ids[n + i], blob)
        store.requests.clear()
        pool = MessagePool(texts, 2 * n + 640)
        results = {
            "append": timed(client, n, lambda i: thread.append(pool.take()), scripted=True),
            "append_batch_10": timed(client, max(1, n // 10), lambda i: thread.append(pool.take(10)),
                                     scripted=True),
            "bare_script": timed(client, n, lambda i: client.evalsha(sha, 4, *script_keys, ids[i], blob),
                                 scripted=True),
            "newest_page": _replayed(client, n, newest, replay),
            "older_page": _replayed(client, n, older, replay),
            "older_page_by_id": _replayed(client, n, by_id, replay),
            "hmget_50": timed(client, n, lambda i: client.hmget(hmget_key, fields), scripted=False),
            "list_page": timed(client, n, lambda i: client.lrange(list_key, -PAGE, -1), scripted=False),
        }
        store.requests.clear()
        newest_chunk = client.zrange(thread.keys.chunk_index, -1, -1)[0]
        per_chunk = ChunkEntry.parse(newest_chunk).count
        per_call = (slowlog_appends(client, lambda i: thread.append(pool.take()), 640, per_chunk)
                    if own else None)
        shape = {
            "newest_page": [_describe(r, store) for r in newest],
            "older_page": [_describe(r, store) for r in older],
            "older_page_by_id": [_describe(r, store) for r in by_id],
            "append": "FCALL" if store.functions else "EVALSHA",
        }
    finally:
        if not own:
            thread.delete()
            client.delete(*script_keys, hmget_key, list_key)
        client.close()
    a, b, h = results["append"], results["bare_script"], results["hmget_50"]
    ratios = [
        ratio("append_vs_bare", "server time: append / bare 4-write script (stretch 1.5)",
              a["usec_per_call"] / b["usec_per_call"], 2.0),
        ratio("batch_message_vs_bare", "server time: per message of a batch of 10 / one bare call",
              results["append_batch_10"]["usec_per_call"] / 10 / b["usec_per_call"], 1.0),
        ratio("newest_page_vs_hmget", "server time: newest page of 50 / HMGET of 50",
              results["newest_page"]["usec_per_call"] / h["usec_per_call"], 1.5),
        ratio("older_page_vs_hmget", "server time: older page of 50 / HMGET of 50",
              results["older_page"]["usec_per_call"] / h["usec_per_call"], 3.0),
        ratio("older_page_by_id_vs_hmget", "server time: older page of 50, id cursor / HMGET of 50",
              results["older_page_by_id"]["usec_per_call"] / h["usec_per_call"], None),
        ratio("list_page_vs_hmget", "server time: JSON list LRANGE -50 -1 / HMGET of 50",
              results["list_page"]["usec_per_call"] / h["usec_per_call"], None),
        ratio("append_vs_bare_cpu", "server CPU incl. I/O: append / bare 4-write script",
              a["cpu_usec_per_call"] / b["cpu_usec_per_call"], None),
    ]
    return {"server": version, "messages": params.messages, "record_bytes": len(blob),
            "results": results, "requests": shape, "append_per_call": per_call, "ratios": ratios}


def _replayed(client: redis.Redis, calls: int, requests: list, replay: Callable) -> dict[str, Any]:
    """A multi-request operation: each request replayed `calls` times, the times added up."""
    parts = [timed(client, calls, replay(r), scripted=isinstance(r, Eval)) for r in requests]
    return {
        "calls": calls,
        "usec_per_call": sum(p["usec_per_call"] for p in parts),
        "inner_usec_per_call": sum(p["inner_usec_per_call"] for p in parts),
        "cpu_usec_per_call": sum(p["cpu_usec_per_call"] for p in parts),
        "parts": parts,
    }


def _describe(request: Eval | Batch, store: MessageStore) -> str:
    if isinstance(request, Eval):
        command = ("FCALL" if request.script.writes else "FCALL_RO") if store.functions else "EVALSHA"
        return f"{command} {request.script.name}"
    return "pipeline: " + ", ".join(str(c[0]) for c in request.commands)


def render(result: dict[str, Any]) -> str:
    r = result["results"]
    lines = [f"== {result['server']} ==",
             f"thread of {result['messages']:,} messages of {result['record_bytes']:,} B; "
             f"{r['append']['calls']:,} calls of each",
             "",
             f"{'server time per call (µs)':<52} {'commandstats':>12} {'CPU incl. I/O':>14}"]

    def row(label: str, entry: dict[str, Any]) -> None:
        lines.append(f"{label:<52} {entry['usec_per_call']:>12.1f} {entry['cpu_usec_per_call']:>14.1f}")

    row(f"kvstore append ({result['requests'].get('append', 'EVALSHA')}, amortized over rollovers)", r["append"])
    inner = r["append"]["inner_usec_per_call"]
    lines.append(f"  of which the commands it runs: {inner:.1f}; Lua and reply conversion: "
                 f"{r['append']['usec_per_call'] - inner:.1f}")
    top = sorted(((k, v) for k, v in r["append"]["commands"].items() if k not in SCRIPT_COMMANDS),
                 key=lambda kv: -kv[1]["usec"])
    lines.append("  commands per append: " + ", ".join(
        f"{k} ×{v['per_call']:.2f} {v['usec'] / r['append']['calls']:.2f}" for k, v in top))
    per_call = result.get("append_per_call")
    if per_call:
        lines.append(f"  per call (SLOWLOG, {per_call['calls']} appends): median {per_call['median_us']} µs; "
                     f"the slowest {per_call['slowest_share'].split(' (')[0]} (the appends that move a chunk)"
                     f" {per_call['slowest_share_mean_us']:.0f} µs "
                     f"on average, the others {per_call['typical_mean_us']:.1f}")
    row("bare 4-write script (EVALSHA)", r["bare_script"])
    row("kvstore newest page of 50", r["newest_page"])
    lines.append("  " + "; ".join(result["requests"]["newest_page"]))
    for name, label in (("older_page", "kvstore older page of 50 (plan + fetch)"),
                        ("older_page_by_id", "  the same from an id cursor")):
        row(label, r[name])
        lines.append("  " + "; ".join(result["requests"][name])
                     + " (" + " + ".join(f"{p['usec_per_call']:.1f}" for p in r[name]["parts"]) + ")")
    row("native HMGET of 50 fields (1 KB values)", r["hmget_50"])
    row("JSON list LRANGE -50 -1", r["list_page"])
    lines.append("")
    lines += render_ratios(result["ratios"], "ratios")
    return "\n".join(lines)


def collect(args: argparse.Namespace) -> dict[str, Any]:
    params = QUICK if args.quick else DEFAULT
    return collect_per_server("server cost", args, params, run_server, render)


def main(argv: list[str] | None = None) -> int:
    return standalone_main("server_cost", __doc__, collect, argv)


if __name__ == "__main__":
    sys.exit(main())
