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

from ._common import (
    BARE_SCRIPT,
    SCRIPT_COMMANDS,
    Fixture,
    MessagePool,
    bare_keys,
    collect_per_server,
    command_stats,
    fill_thread,
    log,
    new_messages,
    ratio,
    render_ratios,
    send_script,
    standalone_main,
    stats_diff,
)
from ._engine import Batch, ChunkEntry, Eval, encode_record, record

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


def timed(
    client: redis.Redis, calls: int, fn: Callable[[int], Any], scripted: bool
) -> dict[str, Any]:
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
        "commands": {
            k: {**v, "per_call": v["calls"] / calls, "usec_per_call": v["usec"] / v["calls"]}
            for k, v in sorted(diff.items())
        },
    }


def slowlog_appends(
    client: redis.Redis, append: Callable[[int], Any], calls: int, per_chunk: int
) -> dict[str, Any] | None:
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
    durations = sorted(
        e["duration"] for e in entries if bytes(e["command"]).upper().startswith(scripted)
    )
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


class Cost(Fixture):
    """The thread, the baselines' keys and the recorded page requests of one run on one server."""

    params: Params
    store: Recorder

    def __init__(self, url: str, params: Params, own: bool) -> None:
        super().__init__(url, params, own, Recorder)
        self.thread = self.store.thread("cost")
        self.script_keys = bare_keys(f"{self.ns}:{{bare}}")
        self.hmget_key = f"{self.ns}:{{native}}:hash"
        self.list_key = f"{self.ns}:{{native}}:list"

    def setup(self) -> None:
        """The thread, then the baselines with the bytes of one of its records."""
        fill_thread(self.thread, self.config, self.texts, self.params.messages)
        stamped = UserMessage(content=self.texts[0]).model_copy(
            update={"id": f"message-{uuid.uuid4()}", "date": datetime.now(UTC)}
        )
        self.blob = encode_record(stamped)
        self.sha = self.client.script_load(BARE_SCRIPT)
        self.client.hset(self.hmget_key, mapping={i: self.blob for i in range(1, 65)})
        self.client.rpush(self.list_key, *[stamped.to_json()] * 100)

    def recorded(self, read: Callable[[], Any]) -> tuple[Any, list[Eval | Batch]]:
        """What `read` returns, and the requests it sent."""
        self.store.requests.clear()
        result = read()
        return result, list(self.store.requests)

    def page_requests(self) -> dict[str, list[Eval | Batch]]:
        """The requests of the newest page, of an older page and of the same from an id cursor."""
        thread, middle = self.thread, self.params.messages // 2
        _, newest = self.recorded(lambda: thread.list(limit=PAGE, order="desc"))
        older_page, older = self.recorded(
            lambda: thread.list(before=middle, limit=PAGE, order="desc")
        )
        if len(older_page.messages) != PAGE or len(older) != 2:
            raise RuntimeError("the older page was not one plan and one fetch")
        cursor_id = thread.list(after=middle - 1, limit=1).messages[0].id
        by_id_page, by_id = self.recorded(
            lambda: thread.list(before=cursor_id, limit=PAGE, order="desc")
        )
        if by_id_page.messages != older_page.messages or not isinstance(by_id[0], Eval):
            raise RuntimeError("the older page from an id cursor did not go through the page plan")
        return {"newest_page": newest, "older_page": older, "older_page_by_id": by_id}

    def replay(self, request: Eval | Batch) -> Callable[[int], Any]:
        """Sends `request` again as the executor sends it."""
        client = self.client
        if isinstance(request, Eval):
            return lambda _i: send_script(client, self.store, request)

        def pipeline(_i: int) -> Any:
            pipe = client.pipeline(transaction=False)
            for command in request.commands:
                pipe.execute_command(*command)
            return pipe.execute()

        return pipeline

    def measure(self, pages: dict[str, list[Eval | Batch]]) -> dict[str, Any]:
        """Server time per call of each operation, after a warm-up of the script cache and the
        allocator."""
        client, thread, n = self.client, self.thread, self.params.calls
        sha, keys, blob = self.sha, self.script_keys, self.blob
        ids = [f"message-{uuid.uuid4()}" for _ in range(n + self.params.warmup)]
        log(f"  measuring {n:,} calls of each operation")
        for i, message in enumerate(new_messages(self.texts, self.params.warmup)):
            thread.append(message)
            client.evalsha(sha, 4, *keys, ids[n + i], blob)
        self.store.requests.clear()
        self.pool = MessagePool(self.texts, 2 * n + 640)
        fields = list(range(1, PAGE + 1))
        return {
            "append": timed(client, n, lambda i: thread.append(self.pool.take()), scripted=True),
            "append_batch_10": timed(
                client, max(1, n // 10), lambda i: thread.append(self.pool.take(10)), scripted=True
            ),
            "bare_script": timed(
                client, n, lambda i: client.evalsha(sha, 4, *keys, ids[i], blob), scripted=True
            ),
            **{
                name: _replayed(client, n, requests, self.replay)
                for name, requests in pages.items()
            },
            "hmget_50": timed(
                client, n, lambda i: client.hmget(self.hmget_key, fields), scripted=False
            ),
            "list_page": timed(
                client, n, lambda i: client.lrange(self.list_key, -PAGE, -1), scripted=False
            ),
        }

    def per_call(self) -> dict[str, Any] | None:
        """Each append's own server time (SLOWLOG), against the messages a chunk holds."""
        self.store.requests.clear()
        newest_chunk = self.client.zrange(self.thread.keys.chunk_index, -1, -1)[0]
        per_chunk = ChunkEntry.parse(newest_chunk).count
        return slowlog_appends(
            self.client, lambda i: self.thread.append(self.pool.take()), 640, per_chunk
        )

    def cleanup(self) -> None:
        self.thread.delete()
        self.client.delete(*self.script_keys, self.hmget_key, self.list_key)


def run_server(url: str, params: Params, own: bool) -> dict[str, Any]:
    with Cost(url, params, own) as cost:
        log(f"{cost.version} at {url}: filling a {params.messages:,}-message thread")
        cost.setup()
        pages = cost.page_requests()
        results = cost.measure(pages)
        per_call = cost.per_call() if own else None
        shape = {
            name: [_describe(r, cost.store) for r in requests] for name, requests in pages.items()
        }
        shape["append"] = "FCALL" if cost.store.functions else "EVALSHA"
    return {
        "server": cost.version,
        "messages": params.messages,
        "record_bytes": len(cost.blob),
        "results": results,
        "requests": shape,
        "append_per_call": per_call,
        "ratios": _ratios(results),
    }


def _ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    a, b, h = results["append"], results["bare_script"], results["hmget_50"]
    return [
        ratio(
            "append_vs_bare",
            "server time: append / bare 4-write script (stretch 1.5)",
            a["usec_per_call"] / b["usec_per_call"],
            2.0,
        ),
        ratio(
            "batch_message_vs_bare",
            "server time: per message of a batch of 10 / one bare call",
            results["append_batch_10"]["usec_per_call"] / 10 / b["usec_per_call"],
            1.0,
        ),
        ratio(
            "newest_page_vs_hmget",
            "server time: newest page of 50 / HMGET of 50",
            results["newest_page"]["usec_per_call"] / h["usec_per_call"],
            1.5,
        ),
        ratio(
            "older_page_vs_hmget",
            "server time: older page of 50 / HMGET of 50",
            results["older_page"]["usec_per_call"] / h["usec_per_call"],
            3.0,
        ),
        ratio(
            "older_page_by_id_vs_hmget",
            "server time: older page of 50, id cursor / HMGET of 50",
            results["older_page_by_id"]["usec_per_call"] / h["usec_per_call"],
            None,
        ),
        ratio(
            "list_page_vs_hmget",
            "server time: JSON list LRANGE -50 -1 / HMGET of 50",
            results["list_page"]["usec_per_call"] / h["usec_per_call"],
            None,
        ),
        ratio(
            "append_vs_bare_cpu",
            "server CPU incl. I/O: append / bare 4-write script",
            a["cpu_usec_per_call"] / b["cpu_usec_per_call"],
            None,
        ),
    ]


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
        command = (
            ("FCALL" if request.script.writes else "FCALL_RO") if store.functions else "EVALSHA"
        )
        return f"{command} {request.script.name}"
    return "pipeline: " + ", ".join(str(c[0]) for c in request.commands)


def render(result: dict[str, Any]) -> str:
    r = result["results"]
    lines = [
        f"== {result['server']} ==",
        f"thread of {result['messages']:,} messages of {result['record_bytes']:,} B; "
        f"{r['append']['calls']:,} calls of each",
        "",
        f"{'server time per call (µs)':<52} {'commandstats':>12} {'CPU incl. I/O':>14}",
    ]

    def row(label: str, entry: dict[str, Any]) -> None:
        lines.append(
            f"{label:<52} {entry['usec_per_call']:>12.1f} {entry['cpu_usec_per_call']:>14.1f}"
        )

    row(
        f"kvstore append ({result['requests'].get('append', 'EVALSHA')}, amortized over rollovers)",
        r["append"],
    )
    inner = r["append"]["inner_usec_per_call"]
    lines.append(
        f"  of which the commands it runs: {inner:.1f}; Lua and reply conversion: "
        f"{r['append']['usec_per_call'] - inner:.1f}"
    )
    top = sorted(
        ((k, v) for k, v in r["append"]["commands"].items() if k not in SCRIPT_COMMANDS),
        key=lambda kv: -kv[1]["usec"],
    )
    lines.append(
        "  commands per append: "
        + ", ".join(
            f"{k} ×{v['per_call']:.2f} {v['usec'] / r['append']['calls']:.2f}" for k, v in top
        )
    )
    per_call = result.get("append_per_call")
    if per_call:
        lines.append(
            f"  per call (SLOWLOG, {per_call['calls']} appends): median {per_call['median_us']} µs; "
            f"the slowest {per_call['slowest_share'].split(' (')[0]} (the appends that move a chunk)"
            f" {per_call['slowest_share_mean_us']:.0f} µs "
            f"on average, the others {per_call['typical_mean_us']:.1f}"
        )
    row("bare 4-write script (EVALSHA)", r["bare_script"])
    row("kvstore newest page of 50", r["newest_page"])
    lines.append("  " + "; ".join(result["requests"]["newest_page"]))
    for name, label in (
        ("older_page", "kvstore older page of 50 (plan + fetch)"),
        ("older_page_by_id", "  the same from an id cursor"),
    ):
        row(label, r[name])
        lines.append(
            "  "
            + "; ".join(result["requests"][name])
            + " ("
            + " + ".join(f"{p['usec_per_call']:.1f}" for p in r[name]["parts"])
            + ")"
        )
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
