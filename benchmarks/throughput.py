"""Appends per second from 1, 2 and 4 worker processes, and the server's own ceiling.

    python -m benchmarks.throughput [--quick] [--url URL] [--json PATH]

On each server, for a fixed time per configuration:

- kvstore: each worker process runs ``thread.append(UserMessage(<1 KB>))`` in a loop, on its own
  thread ("distinct") or all on one ("shared"); the shared thread's stored count is checked
  against the appends made afterwards;
- the floor from Python: the same workers sending the bare 4-write EVALSHA (distinct keys);
- the server's ceiling for the same kind of script, from ``redis-benchmark`` (50 connections,
  no pipelining, then 16 commands per pipeline): EVALSHA of the bare 4-write script, and
  kvstore's own append as the store sends it (FCALL of its function) with its arguments built
  once (a fresh message id per call, and a record of ASCII text of the same length that differs
  on every call, as Lua never reads it). Without
  ``redis-benchmark`` on PATH (Debian package redis-tools) the ceiling is skipped with a note.

Client processes and the server share the machine's CPUs, as they do in a small deployment:
on 2 cores, 4 workers and the server compete for them.
"""

from __future__ import annotations

import argparse
import csv
import io
import multiprocessing
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import redis

from kvstore import MessageStore, StoreConfig, Thread, UserMessage

from ._common import (
    BARE_SCRIPT,
    MessagePool,
    bare_keys,
    collect_per_server,
    log,
    make_texts,
    ratio,
    render_ratios,
    script_command,
    server_version,
    standalone_main,
)
from ._engine import core

WORKERS = (1, 2, 4)


@dataclass(frozen=True)
class Params:
    seconds: float  # measured per configuration
    warmup: int  # appends per worker before the clock starts
    ceiling_bare: int  # requests per redis-benchmark run
    ceiling_kvstore: int


DEFAULT = Params(seconds=4.0, warmup=50, ceiling_bare=200_000, ceiling_kvstore=60_000)
QUICK = Params(seconds=1.0, warmup=20, ceiling_bare=40_000, ceiling_kvstore=15_000)


def _worker(
    url: str,
    namespace: str,
    target: str,
    kind: str,
    warmup: int,
    seconds: float,
    barrier: Any,
    results: Any,
) -> None:
    """One worker process: warm up, wait for the others, then append until the deadline."""
    client = redis.Redis.from_url(url, decode_responses=False)
    texts = make_texts()
    if kind == "kvstore":
        thread = MessageStore(client, StoreConfig(namespace=namespace)).thread(target)
        pool = MessagePool(texts, 20_000)  # made before the clock starts; more are made if needed

        def call(i: int) -> None:
            thread.append(pool.take())
    else:
        sha = client.script_load(BARE_SCRIPT)
        keys = bare_keys(f"{namespace}:{{{target}}}")
        blob = texts[0].encode() + b"x" * 122
        prefix = f"message-{uuid.uuid4()}-"

        def call(i: int) -> None:
            client.evalsha(sha, 4, *keys, prefix + str(i), blob)

    for i in range(warmup):
        call(i)
    barrier.wait()
    count, clock = 0, time.perf_counter
    start = clock()
    deadline = start + seconds
    while clock() < deadline:
        call(warmup + count)
        count += 1
    results.put((count, clock() - start))
    client.close()


def run_workers(
    url: str, namespace: str, kind: str, workers: int, shared: bool, params: Params
) -> dict[str, Any]:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(workers)
    results = context.Queue()
    label = "shared" if shared else "distinct"
    targets = ["shared" if shared else f"w{workers}-{i}" for i in range(workers)]
    processes = [
        context.Process(
            target=_worker,
            args=(
                url,
                namespace,
                f"{kind}-{label}-{workers}-{t}" if not shared else f"{kind}-shared-{workers}",
                kind,
                params.warmup,
                params.seconds,
                barrier,
                results,
            ),
        )
        for t in targets
    ]
    for p in processes:
        p.start()
    outcomes = [results.get(timeout=params.seconds + 120) for _ in processes]
    for p in processes:
        p.join(timeout=30)
        if p.exitcode != 0:
            raise RuntimeError(f"a {kind} worker exited with {p.exitcode}")
    appends = sum(count for count, _ in outcomes)
    elapsed = max(seconds for _, seconds in outcomes)
    return {
        "kind": kind,
        "workers": workers,
        "shared": shared,
        "appends": appends,
        "seconds": elapsed,
        "per_second": appends / elapsed,
    }


# ------------------------------------------------------------------------------- ceiling


def ceiling(url: str, namespace: str, params: Params) -> dict[str, Any]:
    """The server's own limit for the bare script and for kvstore's append script."""
    binary = shutil.which("redis-benchmark")
    if not binary:
        return {
            "skipped": "redis-benchmark is not on PATH (Debian package redis-tools): no ceiling line"
        }
    bare, kvstore, blob = _ceiling_commands(url, namespace)
    check = redis.Redis.from_url(url, decode_responses=False)
    thread = MessageStore(check, StoreConfig(namespace=namespace)).thread("rb-kvstore")
    runs = {}
    try:
        for name, command, n in (
            ("bare", lambda run: bare, params.ceiling_bare),
            ("kvstore", kvstore, params.ceiling_kvstore),
        ):
            for pipeline in (1, 16):
                requests = n * (2 if pipeline > 1 else 1)
                row, stored = _redis_benchmark(
                    binary, url, command, requests, pipeline, thread, must_store=name == "kvstore"
                )
                runs[f"{name}_p{pipeline}"] = {
                    "per_second": float(row[1]),
                    "p50_ms": float(row[4]),
                    "requests": requests,
                }
                if name == "kvstore" and stored < requests * 0.999:
                    return {
                        "skipped": f"three runs of kvstore's script with {pipeline} per pipeline stored"
                        f" {stored} of {requests} messages (replays of ids redis-benchmark"
                        " repeated): no limit line this time"
                    }
        stats = thread.stats()
    finally:
        check.close()
    if stats.window_messages > 200:
        raise RuntimeError(f"the ceiling runs left a window of {stats.window_messages} messages")
    return {
        "runs": runs,
        "clients": 50,
        "value_bytes": len(blob),
        "kvstore_thread": stats.model_dump(),
    }


def _ceiling_commands(
    url: str, namespace: str
) -> tuple[list[str], Callable[[str], list[str]], str]:
    """redis-benchmark's commands: the bare script's EVALSHA; kvstore's append as the store sends
    it, given a run's own id prefix; and the value both carry."""
    client = redis.Redis.from_url(url, decode_responses=False)
    try:
        blob = (
            make_texts()[0] + "x" * 122
        )  # ASCII of a record's length: argv cannot carry NUL bytes
        bare_sha = client.script_load(BARE_SCRIPT)
        bare_sha = bare_sha.decode() if isinstance(bare_sha, bytes) else bare_sha
        bare = [
            "EVALSHA",
            bare_sha,
            "4",
            *bare_keys(f"{namespace}:{{rb-bare}}"),
            "message-__rand_int__",
            blob,
        ]
        store = MessageStore(client, StoreConfig(namespace=namespace))
        store.thread("rb-kvstore").append(UserMessage(content="warm up"))  # loads the library
        ref = core.ThreadRef.of(store.config, "rb-kvstore")
        request = next(core.append(ref, UserMessage(content="x"), None))
        head = [
            str(a) for a in script_command(store, request)[:2]
        ]  # FCALL <function>, as the store sends it
    finally:
        client.close()
    named = request.named()  # the append's arguments by name (lua/append.lua's header)
    ((_, _, _, tokens, _),) = named["messages"]  # the message's token count, as the store sent it
    # Every record must differ, as real ones do (each holds its message id): the window is a
    # sorted set, where an equal record would only move, not add.
    record = blob[: -len("__rand_int__")] + "__rand_int__"

    # redis-benchmark seeds its __rand_int__ sequence the same way for runs that start in
    # the same second, so ids are made distinct per run by a prefix of their own.
    def kvstore(run: str) -> list[str]:
        message = (f"message-{run}-__rand_int__", "", 0, tokens, record)
        args = request.script.args(**{**named, "messages": [message]})
        return [*head, str(len(request.keys)), *request.keys, *map(str, args)]

    return bare, kvstore, blob


def _redis_benchmark(
    binary: str,
    url: str,
    command: Callable[[str], list[str]],
    requests: int,
    pipeline: int,
    thread: Thread,
    must_store: bool,
) -> tuple[list[str], int]:
    """One redis-benchmark run of `command` (50 connections): its CSV row and the messages it
    stored on `thread`.

    An append whose message id is already stored is a replay: it stores nothing and costs less,
    so a run that repeated ids would overstate the ceiling. A run that `must_store` one message
    per request (a random id drawn twice within a run, seen about once in 10,000, is let pass) is
    run again, at most three times in all."""
    parsed = urlparse(url)
    for _attempt in range(3):
        argv = [
            binary,
            "-h",
            parsed.hostname or "127.0.0.1",
            "-p",
            str(parsed.port or 6379),
            "-c",
            "50",
            "-n",
            str(requests),
            "-r",
            "100000000000",
            "-P",
            str(pipeline),
            "--csv",
            *command(uuid.uuid4().hex[:8]),
        ]
        before = thread.stats().stored_messages
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        rows = list(csv.reader(io.StringIO(done.stdout)))
        if done.returncode or len(rows) < 2:
            raise RuntimeError(f"redis-benchmark failed: {done.stderr[-500:]}")
        stored = thread.stats().stored_messages - before
        if not must_store or stored >= requests * 0.999:
            break
    return rows[1], stored


# ------------------------------------------------------------------------------- running


def run_server(url: str, params: Params, own: bool) -> dict[str, Any]:
    client = redis.Redis.from_url(url, decode_responses=False)
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    version = server_version(client)
    runs = []
    try:
        for workers in WORKERS:
            for kind, shared in (("kvstore", False), ("kvstore", True), ("bare", False)):
                if kind == "kvstore" and shared and workers == 1:
                    continue  # one worker on one thread is the distinct case
                log(
                    f"{version}: {kind}, {workers} worker(s), {'one shared thread' if shared else 'distinct threads'}"
                )
                run = run_workers(url, namespace, kind, workers, shared, params)
                if kind == "kvstore" and shared:
                    store = MessageStore(client, StoreConfig(namespace=namespace))
                    stored = store.thread(f"kvstore-shared-{workers}").stats().stored_messages
                    expected = run["appends"] + workers * params.warmup
                    if stored != expected:
                        raise RuntimeError(
                            f"shared thread holds {stored} messages, {expected} were appended"
                        )
                    run["stored_check"] = stored
                runs.append(run)
        log(f"{version}: the server's ceiling (redis-benchmark)")
        limit = ceiling(url, namespace, params)
    finally:
        if not own:
            for key in client.scan_iter(match=f"{namespace}:*", count=1000):
                client.delete(key)
        client.close()

    def rate(kind: str, workers: int, shared: bool) -> float:
        return next(
            r["per_second"]
            for r in runs
            if r["kind"] == kind and r["workers"] == workers and (r["shared"] == shared)
        )

    ratios = [
        ratio(
            "scaling_distinct",
            "appends/s: 4 workers / 1 worker, distinct threads",
            rate("kvstore", 4, False) / rate("kvstore", 1, False),
            None,
        ),
        ratio(
            "shared_vs_distinct",
            "appends/s, 4 workers: one shared thread / distinct threads",
            rate("kvstore", 4, True) / rate("kvstore", 4, False),
            None,
        ),
        ratio(
            "kvstore_vs_bare_4",
            "appends/s, 4 workers: kvstore / bare script from Python",
            rate("kvstore", 4, False) / rate("bare", 4, False),
            None,
        ),
    ]
    if "runs" in limit:
        r = limit["runs"]
        ratios.append(
            ratio(
                "ceiling_kvstore_vs_bare",
                "server ceiling (saturated): kvstore append script / bare script (aim 0.85)",
                r["kvstore_p1"]["per_second"] / r["bare_p1"]["per_second"],
                0.7,
                higher=True,
            )
        )
        ratios.append(
            ratio(
                "kvstore_4_vs_ceiling",
                "kvstore, 4 workers / kvstore script's server ceiling",
                rate("kvstore", 4, False) / r["kvstore_p1"]["per_second"],
                None,
            )
        )
    return {"server": version, "runs": runs, "ceiling": limit, "ratios": ratios}


def render(result: dict[str, Any], params: Params) -> str:
    lines = [
        f"== {result['server']} ==",
        "",
        f"{'appends per second':<44} {'1 worker':>9} {'2 workers':>10} {'4 workers':>10}",
    ]
    for kind, shared, label in (
        ("kvstore", False, "kvstore, distinct threads"),
        ("kvstore", True, "kvstore, one shared thread"),
        ("bare", False, "bare 4-write EVALSHA from Python"),
    ):
        cells = []
        for workers in WORKERS:
            match = [
                r
                for r in result["runs"]
                if r["kind"] == kind
                and r["workers"] == workers
                and (r["shared"] == shared or (workers == 1 and kind == "kvstore"))
            ]
            cells.append(f"{match[0]['per_second']:,.0f}" if match else "-")
        lines.append(f"{label:<44} {cells[0]:>9} {cells[1]:>10} {cells[2]:>10}")
    limit = result["ceiling"]
    if "runs" in limit:
        r = limit["runs"]
        lines.append(f"server ceiling (redis-benchmark, {limit['clients']} connections):")
        lines.append(
            f"  {'bare 4-write EVALSHA':<42} {r['bare_p1']['per_second']:>9,.0f}/s"
            f"   pipelined ×16: {r['bare_p16']['per_second']:,.0f}/s"
        )
        lines.append(
            f"  {'kvstore append FCALL':<42} {r['kvstore_p1']['per_second']:>9,.0f}/s"
            f"   pipelined ×16: {r['kvstore_p16']['per_second']:,.0f}/s"
        )
    else:
        lines.append(f"server ceiling: skipped ({limit['skipped']})")
    lines.append(
        f"({params.seconds:g} s per configuration; the shared thread's stored count matched the appends)"
    )
    lines.append("")
    lines += render_ratios(result["ratios"], "ratios")
    return "\n".join(lines)


def collect(args: argparse.Namespace) -> dict[str, Any]:
    params = QUICK if args.quick else DEFAULT
    return collect_per_server(
        "throughput", args, params, run_server, lambda result: render(result, params)
    )


def main(argv: list[str] | None = None) -> int:
    return standalone_main("throughput", __doc__, collect, argv)


if __name__ == "__main__":
    sys.exit(main())
