"""`kvstore demo`: worker processes hold simulated chat conversations on shared threads."""

from __future__ import annotations

import multiprocessing
import random
import sys
import time
from dataclasses import dataclass

import redis

from .. import errors
from ..config import StoreConfig
from ..messages import (
    AssistantMessage,
    ReasoningMessage,
    ToolCall,
    ToolCallMessage,
    ToolReturnMessage,
    UserMessage,
)
from ..store import MessageStore

MESSAGES_PER_TURN = 5
# The demo keeps a short history so compaction visibly holds memory flat.
RETAINED = 200
COMPACT_EVERY = 5  # turns of one worker


def demo_config(namespace: str) -> StoreConfig:
    return StoreConfig(namespace=namespace, retained_message_limit=RETAINED)


@dataclass(frozen=True)
class DemoOptions:
    url: str
    namespace: str
    workers: int = 4
    threads: int = 8
    turns: int = 400  # per worker


def _turn_messages(rng: random.Random, worker: int, turn: int) -> tuple[UserMessage, list]:
    question = f"worker {worker} turn {turn}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 60)))
    call_id = f"call-{worker}-{turn}"
    replies = [
        ReasoningMessage(reasoning="Thinking about " + question[:80]),
        ToolCallMessage(tool_call=ToolCall(name="search", arguments='{"q": "%d"}' % turn, tool_call_id=call_id)),
        ToolReturnMessage(
            tool_call_id=call_id, status="success",
            tool_return=" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 200))),
        ),
        AssistantMessage(content=" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))),
    ]
    return UserMessage(content=question), replies


def _worker(options: DemoOptions, worker: int, progress, results) -> None:
    rng = random.Random(worker)
    store = MessageStore.from_url(options.url, demo_config(options.namespace))
    append_us: list[float] = []
    page_us: list[float] = []
    for turn in range(options.turns):
        thread = store.thread(f"demo-{rng.randrange(options.threads)}")
        turn_id = f"w{worker}-t{turn}"
        user, replies = _turn_messages(rng, worker, turn)
        started = time.perf_counter()
        thread.append(user, turn_id=turn_id)
        append_us.append((time.perf_counter() - started) * 1e6)
        thread.start_turn(turn_id)
        for reply in replies:
            started = time.perf_counter()
            thread.append(reply, turn_id=turn_id)
            append_us.append((time.perf_counter() - started) * 1e6)
        result = thread.finish_turn(turn_id)
        if result.reply_count != len(replies):
            raise RuntimeError(f"turn {turn_id} counted {result.reply_count} replies")
        if turn % COMPACT_EVERY == COMPACT_EVERY - 1:
            try:
                thread.compact(f"summary by worker {worker} after turn {turn}", result.last_sequence)
            except errors.InvalidSummaryRange:
                pass  # another worker's summary of this thread already reaches further
        started = time.perf_counter()
        thread.list(limit=50, order="desc")
        page_us.append((time.perf_counter() - started) * 1e6)
        with progress.get_lock():
            progress.value += 1
    results.put((append_us, page_us))
    store.close()


def run_demo(options: DemoOptions, out=sys.stdout) -> int:
    total_turns = options.workers * options.turns
    print(f"kvstore demo: {options.workers} workers, {total_turns} turns on {options.threads} shared threads", file=out)
    store = MessageStore.from_url(options.url, demo_config(options.namespace))
    client = redis.Redis.from_url(options.url)
    for t in range(options.threads):
        store.thread(f"demo-{t}").delete()  # start from empty threads
    run = _run_workers(options, client, out)
    if run is None:
        print("\na worker failed; see its traceback above", file=out)
        return 1
    counted = _count_messages(store, options, out)
    if counted is None:
        return 1
    rows = _summary(options, run, *counted)
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}", file=out)
    return 0


@dataclass(frozen=True)
class _Run:
    append_us: list[float]  # sorted
    page_us: list[float]  # sorted
    samples: list[tuple[int, int]]  # (turns done, bytes of the namespace)
    elapsed: float


def _run_workers(options: DemoOptions, client: redis.Redis, out) -> _Run | None:
    """Runs the worker processes, drawing their progress and sampling memory; None if one failed."""
    context = multiprocessing.get_context("spawn")
    progress = context.Value("i", 0)
    results = context.Queue()
    total_turns = options.workers * options.turns
    samples: list[tuple[int, int]] = []
    next_sample = total_turns // 4
    started = time.perf_counter()
    processes = [
        context.Process(target=_worker, args=(options, w, progress, results)) for w in range(options.workers)
    ]
    for process in processes:
        process.start()
    collected = []
    while len(collected) < len(processes):
        _draw(progress.value, total_turns, out)
        if progress.value >= next_sample:
            samples.append((progress.value, _namespace_bytes(client, options.namespace)))
            next_sample += total_turns // 4
        try:
            collected.append(results.get(timeout=0.2))
        except Exception:
            if any(p.exitcode not in (None, 0) for p in processes):
                return None
    for process in processes:
        process.join()
    elapsed = time.perf_counter() - started
    _draw(total_turns, total_turns, out)
    print(file=out)
    samples.append((total_turns, _namespace_bytes(client, options.namespace)))
    append_us = sorted(x for a, _ in collected for x in a)
    page_us = sorted(x for _, p in collected for x in p)
    return _Run(append_us, page_us, samples, elapsed)


def _count_messages(store: MessageStore, options: DemoOptions, out) -> tuple[int, int] | None:
    """(appended, kept) over the demo's threads; None if a thread's sequences have a gap."""
    messages = 0
    kept = 0
    for t in range(options.threads):
        thread = store.thread(f"demo-{t}")
        stored = list(thread.iter())
        stats = thread.stats()
        sequences = [m.seq_id for m in stored]
        first = stats.deleted_before_sequence or 1
        if sequences != list(range(first, first + len(sequences))):
            print(f"demo-{t}: sequences are not gap-free", file=out)
            return None
        messages += stats.next_sequence - 1
        kept += len(stored)
    return messages, kept


def _summary(options: DemoOptions, run: _Run, messages: int, kept: int) -> list[tuple[str, str]]:
    append_us, page_us, samples = run.append_us, run.page_us, run.samples
    return [
        ("threads", f"{options.threads}"),
        ("turns", f"{options.workers * options.turns}"),
        ("messages", f"{messages} appended, {kept} kept (retention {RETAINED}/thread), gap-free"),
        ("appends/s", f"{len(append_us) / run.elapsed:,.0f} over {options.workers} processes"),
        ("append p50 / p99", f"{_pct(append_us, 50):.0f} / {_pct(append_us, 99):.0f} µs"),
        ("newest page of 50 p50 / p99", f"{_pct(page_us, 50):.0f} / {_pct(page_us, 99):.0f} µs"),
        ("bytes per thread (MEMORY USAGE)", f"{samples[-1][1] / options.threads:,.0f}"),
        ("memory over the run", " → ".join(f"{b / 1024:,.0f} KiB @ {t} turns" for t, b in samples)),
        ("wall time", f"{run.elapsed:.1f} s"),
    ]


def _namespace_bytes(client: redis.Redis, namespace: str) -> int:
    return sum(client.memory_usage(k, samples=0) or 0 for k in client.scan_iter(match=f"{namespace}:*", count=1000))


def _pct(values: list[float], pct: float) -> float:
    return values[min(len(values) - 1, int(len(values) * pct / 100))] if values else 0.0


def _draw(done: int, total: int, out) -> None:
    width = 40
    filled = int(width * done / max(total, 1))
    print(f"\r  [{'#' * filled}{'.' * (width - filled)}] {done}/{total} turns", end="", file=out, flush=True)


WORDS = (
    "the a thread message model tool call result user answer question context window chunk index "
    "summary turn reply stream token latency memory server worker process append page cursor order"
).split()
