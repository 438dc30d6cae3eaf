"""`kvstore demo`: what kvstore does, in four short scenes on one server.

1. A conversation, stored and read back as a chat.
2. The same request sent twice (same otid): stored once.
3. A worker killed between the server storing its append and reading the reply; the job run
   again stores nothing twice.
4. Worker processes chatting on shared threads while summaries and retention hold memory flat.

Scenes 1 to 3 check what they claim on the server, scene 4 that every thread is gap-free; the
demo exits 1 if a check fails.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import random
import signal
import sys
import time
from dataclasses import dataclass

import redis

from .. import errors
from .._engine.keys import ThreadKeys
from ..config import StoreConfig
from ..messages import (
    AssistantMessage,
    ReasoningMessage,
    ToolCall,
    ToolCallMessage,
    ToolReturnMessage,
    UserMessage,
)
from ..store import MessageStore, Thread

# The demo keeps a short history so compaction visibly holds memory flat.
RETAINED = 200
COMPACT_EVERY = 5  # turns of one worker
CHAT_THREAD = "chat"
JOB_THREAD = "job"
JOB_REPLIES = 30
KILLED_AFTER = 12  # replies the server has stored when the worker dies
MEMORY_SAMPLES = 24
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


def run_demo(options: DemoOptions, out=sys.stdout) -> int:
    client = redis.Redis.from_url(options.url)
    store = MessageStore.from_url(options.url, demo_config(options.namespace))
    print(f"durability: {durability(client)}", file=out)
    for thread_id in (CHAT_THREAD, JOB_THREAD, *(f"demo-{t}" for t in range(options.threads))):
        store.thread(thread_id).delete()  # start from empty threads
    try:
        _conversation(store.thread(CHAT_THREAD), out)
        _killed_worker(options, store.thread(JOB_THREAD), out)
        if not _workers(options, store, client, out):
            return 1
    except DemoFailed as failed:
        print(f"\nFAILED: {failed}", file=out)
        return 1
    finally:
        store.close()
        client.close()
    print(f"\nNext, look at how a thread is stored:  kvstore inspect demo-0 {options.reach}", file=out)
    print(f"  or read the chat back as JSON lines:  kvstore export {CHAT_THREAD} {options.reach}", file=out)
    return 0


def durability(client: redis.Redis) -> str:
    """What an acknowledged write survives on this server, from CONFIG GET."""
    try:
        appendonly = _config(client, "appendonly")
        appendfsync = _config(client, "appendfsync")
    except redis.RedisError as exc:
        return f"could not read the server's appendfsync (CONFIG GET: {exc})"
    if appendonly != "yes":
        return f"appendonly {appendonly}: no AOF, a restart keeps only the last snapshot, if any"
    meaning = {
        "always": "every acknowledged write is on disk before the reply",
        "everysec": "a crash can lose the last second of acknowledged writes",
        "no": "the operating system decides when writes reach the disk",
    }
    return f"appendfsync {appendfsync} (AOF on): {meaning.get(appendfsync, 'an unknown setting')}"


def _config(client: redis.Redis, name: str) -> str:
    reply = client.config_get(name)
    value = reply.get(name.encode(), reply.get(name))
    if value is None:
        raise redis.ResponseError(f"{name} not returned")
    return value.decode() if isinstance(value, bytes) else str(value)


# Scenes 1 and 2: a conversation, and a request sent twice.


def _conversation(thread: Thread, out) -> None:
    print("\n1. A conversation, stored and read back (thread chat)", file=out)
    thread.append(UserMessage(content="What's the weather in Oslo tomorrow?", otid="req-1"), turn_id="turn-1")
    thread.start_turn("turn-1")
    thread.append([
        ReasoningMessage(reasoning="A forecast question: ask the weather tool.", otid="req-1-r1"),
        ToolCallMessage(tool_call=ToolCall(name="weather", arguments='{"city": "Oslo", "day": "tomorrow"}',
                                           tool_call_id="call-1"), otid="req-1-r2"),
    ], turn_id="turn-1")
    thread.append(ToolReturnMessage(tool_call_id="call-1", status="success", otid="req-1-r3",
                                    tool_return="cloudy, 4 °C, rain from 15:00"), turn_id="turn-1")
    thread.append(AssistantMessage(content="Cloudy and 4 °C, with rain from mid-afternoon.", otid="req-1-r4"),
                  turn_id="turn-1")
    turn = thread.finish_turn("turn-1")
    for message in thread.list(limit=10).messages:
        print(_chat_line(message), file=out)
    print(f"      turn-1 {turn.outcome}: {turn.reply_count} replies, "
          f"#{turn.first_sequence}..#{turn.last_sequence}", file=out)

    print("\n2. The same request, sent twice (as a client retries after a timeout)", file=out)
    question = UserMessage(content="Should I take an umbrella?", otid="req-2")
    first = thread.append(question.model_copy(), turn_id="turn-2")
    print(_chat_line(first[0]) + "   otid req-2", file=out)
    again = thread.append(question.model_copy(), turn_id="turn-2")
    print(f"      sent again with otid req-2: {'a replay' if again.replayed else 'STORED AGAIN'}, "
          f"nothing written, #{again[0].seq_id} returned", file=out)
    thread.start_turn("turn-2")
    thread.append(AssistantMessage(content="Yes: rain is forecast from 15:00.", otid="req-2-r1"), turn_id="turn-2")
    thread.finish_turn("turn-2")
    print(_chat_line(thread.list(limit=1, order="desc").messages[0]), file=out)
    stored = list(thread.iter())
    with_otid = [m.seq_id for m in stored if m.otid == "req-2"]
    if not again.replayed or again[0].id != first[0].id or with_otid != [first[0].seq_id] or len(stored) != 7:
        raise DemoFailed(f"req-2 sent twice: replayed={again.replayed}, stored as {with_otid}, {len(stored)} messages")
    print(f"      checked: {len(stored)} messages in the thread, one of them with otid req-2", file=out)


def _chat_line(message) -> str:
    kind = message.message_type
    if kind == "user_message":
        who, text = "user", message.content
    elif kind == "assistant_message":
        who, text = "assistant", message.content
    elif kind == "reasoning_message":
        who, text = "reasoning", message.reasoning
    elif kind == "tool_call_message":
        who, text = "tool call", f"{message.tool_call.name}({message.tool_call.arguments})"
    elif kind == "tool_return_message":
        who, text = "tool", message.tool_return
    else:
        who, text = kind.removesuffix("_message"), ""
    return f"  #{message.seq_id:<3} {who:<10} {text}"


# Scene 3: a worker killed mid-append, and its job run again.


def _job(thread: Thread, doomed: _DiesBeforeReading | None = None) -> tuple[int, int]:
    """A job as a queue would hand it out: a user message and a turn of JOB_REPLIES replies, one
    append each. Every message has an otid made from the job, so running the job again is safe.
    Returns (appends replayed, appends stored)."""
    replayed = stored = 0

    def append(message, number: int) -> None:
        nonlocal replayed, stored
        if doomed is not None and number == KILLED_AFTER:
            doomed.doomed = True
        result = thread.append(message, turn_id="job-7")
        replayed += result.replayed
        stored += not result.replayed

    append(UserMessage(content="Summarise the incident reports of last week.", otid="job-7-user"), 0)
    thread.start_turn("job-7")
    for n in range(1, JOB_REPLIES + 1):
        append(AssistantMessage(content=f"Report {n}: " + " ".join(random.Random(n).choices(WORDS, k=20)),
                                otid=f"job-7-reply-{n}"), n)
    thread.finish_turn("job-7")
    return replayed, stored


class _DiesBeforeReading(redis.Redis):
    """A client that, once `doomed`, waits for the server's reply to its next command, tells
    the demo, and waits to be killed without reading it."""

    doomed = False
    ready = None

    def parse_response(self, connection, command_name, **options):
        if self.doomed:
            connection.can_read(timeout=30)  # the server ran the append and answered
            self.ready.set()
            time.sleep(60)
        return super().parse_response(connection, command_name, **options)


def _doomed_worker(url: str, namespace: str, ready) -> None:
    client = _DiesBeforeReading.from_url(url)
    client.ready = ready
    _job(MessageStore(client, demo_config(namespace)).thread(JOB_THREAD), client)


def _killed_worker(options: DemoOptions, thread: Thread, out) -> None:
    print("\n3. A worker killed mid-append, then its job run again (thread job)", file=out)
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    worker = context.Process(target=_doomed_worker, args=(options.url, options.namespace, ready), daemon=True)
    worker.start()
    while not ready.wait(0.05):
        if not worker.is_alive():
            raise DemoFailed(f"the worker ended before its reply {KILLED_AFTER} (exit code {worker.exitcode})")
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(10)
    print(f"      worker {worker.pid} runs job-7: a user message, then a turn of {JOB_REPLIES} replies,"
          " one append each", file=out)
    print(f"      killed (SIGKILL) after the server stored reply {KILLED_AFTER}, before the worker read"
          " the answer", file=out)
    before = thread.stats()
    turn = thread.snapshot().turn
    print(f"      on the server: {before.stored_messages} messages, turn job-7 {turn.outcome if turn else '-'}",
          file=out)
    replayed, stored = _job(thread)
    print(f"      job-7 run again, as a queue redelivers it: {replayed} appends replayed (nothing written),"
          f" {stored} stored", file=out)
    messages = list(thread.iter())
    otids = [m.otid for m in messages]
    sequences = [m.seq_id for m in messages]
    result = thread.finish_turn("job-7")
    expected = 1 + JOB_REPLIES
    if (before.stored_messages != KILLED_AFTER + 1 or replayed != KILLED_AFTER + 1
            or len(set(otids)) != len(otids) or len(otids) != expected
            or sequences != list(range(1, expected + 1)) or result.reply_count != JOB_REPLIES):
        raise DemoFailed(f"job-7 run twice: {len(otids)} messages, {len(set(otids))} otids, "
                         f"{result.reply_count} replies counted")
    print(f"      checked: {len(messages)} messages, each otid once, #1..#{expected} gap-free,"
          f" turn job-7 {result.outcome} with {result.reply_count} replies", file=out)


# Scene 4: worker processes on shared threads, memory held flat.


def _turn_messages(rng: random.Random, worker: int, turn: int) -> tuple[UserMessage, list]:
    question = f"worker {worker} turn {turn}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 60)))
    call_id = f"call-{worker}-{turn}"
    replies = [
        ReasoningMessage(reasoning="Thinking about " + question[:80]),
        ToolCallMessage(tool_call=ToolCall(name="search", arguments=f'{{"q": "{turn}"}}', tool_call_id=call_id)),
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


def _workers(options: DemoOptions, store: MessageStore, client: redis.Redis, out) -> bool:
    total_turns = options.workers * options.turns
    print(f"\n4. Memory held flat while messages keep coming: {options.workers} workers, {total_turns} turns"
          f" on {options.threads} shared threads", file=out)
    print(f"   (demo-0..{options.threads - 1}; a summary every {COMPACT_EVERY} turns of a worker, retention then"
          f" keeps each thread's newest {RETAINED})", file=out)
    run = _run_workers(options, client, out)
    if run is None:
        print("\na worker failed; see its traceback above", file=out)
        return False
    messages, kept, trimmed = _count_messages(store, options)
    rows = _summary(options, run, messages, kept, trimmed)
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}", file=out)
    return True


@dataclass(frozen=True)
class _Run:
    append_us: list[float]  # sorted
    page_us: list[float]  # sorted
    samples: list[tuple[int, int]]  # (messages appended, bytes of the worker threads)
    elapsed: float


def _run_workers(options: DemoOptions, client: redis.Redis, out) -> _Run | None:
    """Runs the worker processes, drawing their progress and sampling memory; None if one failed."""
    context = multiprocessing.get_context("spawn")
    progress = context.Value("i", 0)
    results = context.Queue()
    total_turns = options.workers * options.turns
    step = max(total_turns // MEMORY_SAMPLES, 1)
    samples: list[tuple[int, int]] = []
    next_sample = step
    draw = out.isatty()  # a log or a pipe gets the last state only
    started = time.perf_counter()
    processes = [
        context.Process(target=_worker, args=(options, w, progress, results)) for w in range(options.workers)
    ]
    for process in processes:
        process.start()
    collected = []
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


def _summary(options: DemoOptions, run: _Run, messages: int, kept: int, trimmed: bool) -> list[tuple[str, str]]:
    append_us, page_us, samples = run.append_us, run.page_us, run.samples
    appended = [count for count, _ in samples]
    memory = [size for _, size in samples]
    second_half = _second_half(samples)
    if not trimmed:
        second_half += f"; retention has not begun (under {RETAINED} messages a thread): more --turns show it"
    processes = f"{options.workers} process{'es' if options.workers != 1 else ''}"
    return [
        ("messages", f"{messages:,} appended, {kept:,} kept (retention {RETAINED}/thread), gap-free"),
        ("messages over the run", f"{sparkline(appended)}  {appended[0]:,} → {appended[-1]:,} appended"),
        ("memory over the run", (f"{sparkline(memory)}  {memory[0] / 1024:,.0f} → {memory[-1] / 1024:,.0f} KiB"
                                 " (MEMORY USAGE of the threads' keys)")),
        ("second half of the run", second_half),
        ("appends/s", f"{len(append_us) / run.elapsed:,.0f} over {processes}"),
        ("append p50 / p99", f"{_pct(append_us, 50):.0f} / {_pct(append_us, 99):.0f} µs"),
        ("newest page of 50 p50 / p99", f"{_pct(page_us, 50):.0f} / {_pct(page_us, 99):.0f} µs"),
        ("wall time", f"{run.elapsed:.1f} s"),
    ]


def _second_half(samples: list[tuple[int, int]]) -> str:
    """How memory moved while the second half of the messages came in."""
    total, end = samples[-1]
    count, middle = next((count, size) for count, size in samples if count >= total / 2)
    if count == total:
        return "too short a run to sample"
    grew = f"{(end - middle) / middle:+.0%}" if middle else "from 0"
    return f"memory {grew} ({middle / 1024:,.0f} → {end / 1024:,.0f} KiB) while messages went {count:,} → {total:,}"


def sparkline(values: list[float]) -> str:
    """One block a value, from zero to the largest (so a flat series reads as flat)."""
    top = max(values) or 1
    return "".join(SPARKS[min(len(SPARKS) - 1, int(v / top * len(SPARKS)))] for v in values)


def _sample(client: redis.Redis, options: DemoOptions) -> tuple[int, int]:
    """(messages appended, MEMORY USAGE in bytes) of the worker threads (demo-0, demo-1 …)."""
    metas = [ThreadKeys.of(options.namespace, f"demo-{t}").meta for t in range(options.threads)]
    appended = sum(int(client.hget(meta, "last_seq") or 0) for meta in metas)
    keys = client.scan_iter(match=f"{options.namespace}:{{demo-*", count=1000)
    return appended, sum(client.memory_usage(k, samples=0) or 0 for k in keys)


def _pct(values: list[float], pct: float) -> float:
    return values[min(len(values) - 1, int(len(values) * pct / 100))] if values else 0.0


def _draw(done: int, total: int, out, again: bool) -> None:
    """The progress bar; `again` draws over the previous one."""
    width = 40
    filled = int(width * done / max(total, 1))
    start = "\r" if again else ""
    print(f"{start}  [{'#' * filled}{'.' * (width - filled)}] {done}/{total} turns", end="", file=out, flush=True)


WORDS = (
    "the a thread message model tool call result user answer question context window chunk index "
    "summary turn reply stream token latency memory server worker process append page cursor order"
).split()
