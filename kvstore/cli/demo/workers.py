"""Scene 4 of the demo: worker processes on shared threads while summaries and retention hold
memory flat."""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from typing import IO

import redis

from ... import errors
from ...messages import (
    AssistantMessage,
    Message,
    ReasoningMessage,
    ToolCall,
    ToolCallMessage,
    ToolReturnMessage,
    UserMessage,
)
from ...store import MessageStore
from .options import (
    COMPACT_EVERY,
    FLAT_GROWTH,
    MEMORY_SAMPLES,
    MIN_HALF_SAMPLES,
    RETAINED,
    SPARKS,
    WORDS,
    DemoFailed,
    DemoOptions,
    demo_config,
)

# Scene 4: worker processes on shared threads, memory held flat.


def _turn_messages(rng: random.Random, worker: int, turn: int) -> tuple[UserMessage, list[Message]]:
    question = f"worker {worker} turn {turn}: " + " ".join(
        rng.choice(WORDS) for _ in range(rng.randint(10, 60))
    )
    call_id = f"call-{worker}-{turn}"
    replies: list[Message] = [
        ReasoningMessage(reasoning="Thinking about " + question[:80]),
        ToolCallMessage(
            tool_call=ToolCall(name="search", arguments=f'{{"q": "{turn}"}}', tool_call_id=call_id)
        ),
        ToolReturnMessage(
            tool_call_id=call_id,
            status="success",
            tool_return=" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 200))),
        ),
        AssistantMessage(content=" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))),
    ]
    return UserMessage(content=question), replies


# What a worker sends back: its appends' and its page reads' times, in µs.
Timings = tuple[list[float], list[float]]


def _worker(
    options: DemoOptions, worker: int, progress: Synchronized[int], results: Queue[Timings]
) -> None:
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
            assert result.last_sequence is not None  # the turn has replies
            # Another worker's summary of this thread may already reach further.
            with contextlib.suppress(errors.InvalidSummaryRange):
                thread.compact(
                    f"summary by worker {worker} after turn {turn}", result.last_sequence
                )
        started = time.perf_counter()
        thread.list(limit=50, order="desc")
        page_us.append((time.perf_counter() - started) * 1e6)
        with progress.get_lock():
            progress.value += 1
    results.put((append_us, page_us))
    store.close()


def workers_scene(
    options: DemoOptions, store: MessageStore, client: redis.Redis, out: IO[str]
) -> bool:
    total_turns = options.workers * options.turns
    print(
        f"\n4. Memory held flat while messages keep coming: {options.workers} workers, {total_turns} turns"
        f" on {options.threads} shared threads",
        file=out,
    )
    print(
        f"   (demo-0..{options.threads - 1}; a summary every {COMPACT_EVERY} turns of a worker, retention then"
        f" keeps each thread's newest {RETAINED})",
        file=out,
    )
    run = _run_workers(options, client, out)
    if run is None:
        print("\na worker failed; see its traceback above", file=out)
        return False
    messages, kept, trimmed = _count_messages(store, options)
    rows, failure = _summary(options, run, messages, kept, trimmed)
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}", file=out)
    if failure:
        raise DemoFailed(failure)
    return True


@dataclass(frozen=True)
class _Sample:
    appended: int  # messages appended to the worker threads
    size: int  # MEMORY USAGE of their keys, in bytes
    retained: bool  # retention holds every worker thread (each has deleted some)


@dataclass(frozen=True)
class _Run:
    append_us: list[float]  # sorted
    page_us: list[float]  # sorted
    samples: list[_Sample]
    elapsed: float


def _run_workers(options: DemoOptions, client: redis.Redis, out: IO[str]) -> _Run | None:
    """Runs the worker processes, drawing their progress and sampling memory; None if one failed."""
    context = multiprocessing.get_context("spawn")
    progress = context.Value("i", 0)
    results = context.Queue()
    total_turns = options.workers * options.turns
    step = max(total_turns // MEMORY_SAMPLES, 1)
    samples: list[_Sample] = []
    next_sample = step
    draw = out.isatty()  # a log or a pipe gets the last state only
    started = time.perf_counter()
    processes = [
        context.Process(target=_worker, args=(options, w, progress, results))
        for w in range(options.workers)
    ]
    for process in processes:
        process.start()
    collected: list[Timings] = []
    while len(collected) < len(processes):
        done = progress.value
        if draw:
            _draw(done, total_turns, out, again=True)
        if done >= next_sample and done < total_turns:
            samples.append(_sample(client, options))
            next_sample = (done // step + 1) * step
        try:
            collected.append(results.get(timeout=0.05))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in processes):
                return None
    for process in processes:
        process.join()
    elapsed = time.perf_counter() - started
    _draw(total_turns, total_turns, out, again=draw)
    print(file=out)
    samples.append(_sample(client, options))
    append_us = sorted(x for a, _ in collected for x in a)
    page_us = sorted(x for _, p in collected for x in p)
    return _Run(append_us, page_us, samples, elapsed)


def _count_messages(store: MessageStore, options: DemoOptions) -> tuple[int, int, bool]:
    """(appended, kept, whether retention deleted any) over the demo's threads, each checked gap-free."""
    messages = 0
    kept = 0
    trimmed = False
    for t in range(options.threads):
        thread = store.thread(f"demo-{t}")
        stored = list(thread.iter())
        stats = thread.stats()
        sequences = [m.seq_id for m in stored]
        first = stats.deleted_before_sequence or 1
        if sequences != list(range(first, first + len(sequences))):
            raise DemoFailed(f"demo-{t}: sequences are not gap-free")
        messages += stats.next_sequence - 1
        kept += len(stored)
        trimmed = trimmed or stats.deleted_before_sequence is not None
    return messages, kept, trimmed


def _summary(
    options: DemoOptions, run: _Run, messages: int, kept: int, trimmed: bool
) -> tuple[list[tuple[str, str]], str | None]:
    """The table's rows, and why the memory claim fails (None: it holds, or is not checked)."""
    append_us, page_us, samples = run.append_us, run.page_us, run.samples
    appended = [sample.appended for sample in samples]
    memory = [sample.size for sample in samples]
    flat, failure = memory_verdict(samples)
    if not trimmed:
        flat += (
            f"; retention has not begun (under {RETAINED} messages a thread): more --turns show it"
        )
    processes = f"{options.workers} process{'es' if options.workers != 1 else ''}"
    rows = [
        (
            "messages",
            f"{messages:,} appended, {kept:,} kept (retention {RETAINED}/thread), gap-free",
        ),
        (
            "messages over the run",
            f"{sparkline(appended)}  {appended[0]:,} → {appended[-1]:,} appended",
        ),
        (
            "memory over the run",
            (
                f"{sparkline(memory)}  {memory[0] / 1024:,.0f} → {memory[-1] / 1024:,.0f} KiB"
                " (MEMORY USAGE of the threads' keys)"
            ),
        ),
        ("memory under retention", flat),
        ("appends/s", f"{len(append_us) / run.elapsed:,.0f} over {processes}"),
        ("append p50 / p99", f"{_pct(append_us, 50):.0f} / {_pct(append_us, 99):.0f} µs"),
        ("newest page of 50 p50 / p99", f"{_pct(page_us, 50):.0f} / {_pct(page_us, 99):.0f} µs"),
        ("wall time", f"{run.elapsed:.1f} s"),
    ]
    return rows, failure


def memory_verdict(samples: Sequence[_Sample]) -> tuple[str, str | None]:
    """Whether memory held flat once retention held every thread: the mean of the samples in
    the first half of that stretch (by messages) against the mean of those in its second half,
    at most FLAT_GROWTH apart. Returns the row, and the failure (None if it held or there was
    too little to check).

    One sample against another says little: each lands anywhere in retention's saw-tooth (a
    thread drops a whole chunk at once, and its open chunk's string grows by doubling its
    allocation), so two of them differed by 11 % in a run whose memory held flat. A mean over
    several samples, taken only while retention holds every thread (before, memory grows as
    it should), measures the claim."""
    held = [sample for sample in samples if sample.retained]
    short = "not checked: retention held every thread for too short a stretch"
    if len(held) < 2 * MIN_HALF_SAMPLES:
        return short, None
    first, end = held[0].appended, held[-1].appended
    middle = (first + end) / 2
    early = [s.size for s in held if s.appended <= middle]
    late = [s.size for s in held if s.appended > middle]
    if min(len(early), len(late)) < MIN_HALF_SAMPLES:
        return short, None
    before, after = sum(early) / len(early), sum(late) / len(late)
    growth = (after - before) / before if before else 0.0
    row = (
        f"{growth:+.0%} ({before / 1024:,.0f} → {after / 1024:,.0f} KiB on average) while messages"
        f" went {first:,} → {end:,}"
    )
    if growth > FLAT_GROWTH:
        return f"NOT flat: {row}", (
            f"memory grew {growth:+.0%} while retention held every thread (at most"
            f" {FLAT_GROWTH:+.0%} is flat): the claim 'memory held flat' does not hold"
        )
    return f"held flat: {row}", None


def sparkline(values: Sequence[float]) -> str:
    """One block a value, from zero to the largest (so a flat series reads as flat)."""
    top = max(values) or 1
    return "".join(SPARKS[min(len(SPARKS) - 1, int(v / top * len(SPARKS)))] for v in values)


def _sample(client: redis.Redis, options: DemoOptions) -> _Sample:
    """Messages appended, MEMORY USAGE in bytes of the worker threads' keys (demo-0, demo-1 …),
    and whether retention holds every one of them yet."""
    store = MessageStore(client, demo_config(options.namespace))
    stats = [store.thread(f"demo-{t}").stats() for t in range(options.threads)]
    appended = sum(stat.next_sequence - 1 for stat in stats)
    retained = all(stat.deleted_before_sequence is not None for stat in stats)
    keys = client.scan_iter(match=f"{options.namespace}:{{demo-*", count=1000)
    return _Sample(appended, sum(client.memory_usage(k, samples=0) or 0 for k in keys), retained)


def _pct(values: list[float], pct: float) -> float:
    return values[min(len(values) - 1, int(len(values) * pct / 100))] if values else 0.0


def _draw(done: int, total: int, out: IO[str], again: bool) -> None:
    """The progress bar; `again` draws over the previous one."""
    width = 40
    filled = int(width * done / max(total, 1))
    start = "\r" if again else ""
    print(
        f"{start}  [{'#' * filled}{'.' * (width - filled)}] {done}/{total} turns",
        end="",
        file=out,
        flush=True,
    )
