"""Reads through a long-lived store equal a new store's, whatever another store wrote between.

A store keeps what its reads learnt for the next ones (each thread's ThreadRef: the newest
page's read ahead, the context's guessed chunks and the thread's start), shared by all its
handles of a thread. Another worker's writes move the thread under those hints. Here store W
writes at random (appends of every size, batches, turns, system messages, oversized messages,
compactions, replaces that grow and shrink, removed turns, a thread deleted and written again)
to two threads, and after every write store R (kept from the start) and a new store read both
threads the same ways: newest pages of five sizes, pages after and before random sequences,
context with four budgets and without, the whole history, a message by id, the counts. Every
answer must be equal. Small chunks and retention make closes, retention and hint misses common.

The seeds here are CI's short run; KVSTORE_LONG=1 runs twenty per server.
"""

from __future__ import annotations

import os
import random

import pytest

from kvstore import AssistantMessage, StoreConfig, SystemMessage, UserMessage, errors

from ..conftest import make_sync_store

LONG = os.environ.get("KVSTORE_LONG") == "1"
SEEDS = range(20) if LONG else range(2)
STEPS = 60


def _seen(message):
    return message.seq_id, message.id, type(message).__name__, getattr(message, "content", None)


def _reads(store, thread_id, seed, ids):
    """What the reads answer, in order (the random cursors drawn from `seed`)."""
    rng = random.Random(seed)
    thread = store.thread(thread_id)
    answers = []
    for limit in (1, 3, 17, 50, 130):
        page = thread.list(limit=limit, order="desc")
        answers.append(("newest", limit, [_seen(m) for m in page.messages], page.has_more))
    stats = thread.stats()
    answers.append(("stats", stats.model_dump()))
    for budget in (50, 400, 3000, None):
        answers.append(("context", budget, [_seen(m) for m in thread.context(max_tokens=budget)]))
    for _ in range(3):
        at, limit = rng.randint(0, stats.next_sequence), rng.choice((2, 9, 40))
        page = thread.list(after=at, limit=limit)
        answers.append(("after", at, limit, [_seen(m) for m in page.messages], page.has_more))
        page = thread.list(before=at, limit=limit, order="desc")
        answers.append(("before", at, limit, [_seen(m) for m in page.messages], page.has_more))
    answers.append(("all", [_seen(m) for m in thread.iter()]))
    if ids:
        wanted = rng.choice(ids)
        try:
            answers.append(("get", _seen(thread.get(wanted))))
        except errors.MessageNotFound:
            answers.append(("get", None))
    return answers


def _write(thread, rng, step, ids, turns):
    """One random write by the writing store; a refusal the write may meet is no failure."""
    kind = rng.choices(
        ["one", "batch", "big", "compact", "replace", "remove", "delete", "system"],
        [30, 20, 4, 5, 6, 4, 1, 2],
    )[0]
    try:
        if kind in ("one", "batch", "big", "system"):
            messages = []
            for _ in range(rng.randint(2, 25) if kind == "batch" else 1):
                size = rng.choice((2500, 12000) if kind == "big" else (5, 40, 300, 900))
                made = (
                    SystemMessage
                    if kind == "system"
                    else rng.choice((UserMessage, AssistantMessage))
                )
                messages.append(made(content=f"{step}-" + "x" * size))
            turn = f"turn-{step}" if rng.random() < 0.4 else None
            stored = thread.append(messages, turn_id=turn)
            ids += [m.id for m in stored]
            if turn:
                turns.append(turn)
        elif kind == "compact":
            last = thread.stats().next_sequence - 1
            if last > 2:
                thread.compact(f"summary {step}", rng.randint(max(1, last - 30), last - 1))
        elif kind == "replace" and ids:
            size = rng.choice((3, 200, 800, 2600))
            thread.replace(rng.choice(ids), AssistantMessage(content=f"r{step}-" + "y" * size))
        elif kind == "remove" and turns:
            thread.remove_turn(rng.choice(turns))
        elif kind == "delete":
            thread.delete()
            ids.clear()
            turns.clear()
    except (errors.MessageNotFound, errors.InvalidSummaryRange, errors.MessageTooLarge):
        pass
    return kind


@pytest.mark.parametrize("seed", SEEDS)
def test_a_long_lived_store_reads_what_a_new_store_reads(backend, server_only, namespace, seed):
    rng = random.Random(seed)
    config = StoreConfig(
        namespace=namespace,
        chunk_size=rng.choice((3, 5, 8)),
        chunk_max_bytes=rng.choice((1500, 3000, 9000)),
        retained_message_limit=rng.choice((None, 6, 20)),
        max_chunks_per_call=rng.choice((1, 4)),
    )
    writer, reader = make_sync_store(backend, config), make_sync_store(backend, config)
    ids = {"a": [], "b": []}
    turns = {"a": [], "b": []}
    try:
        for step in range(STEPS):
            thread_id = rng.choice("ab")
            kind = _write(writer.thread(thread_id), rng, step, ids[thread_id], turns[thread_id])
            seed_of_reads = rng.random()
            for each in "ab":
                fresh = make_sync_store(backend, config)
                try:
                    want = _reads(fresh, each, seed_of_reads, ids[each])
                finally:
                    fresh.close()
                got = _reads(reader, each, seed_of_reads, ids[each])
                assert got == want, f"step {step} ({kind} on {thread_id}), thread {each}"
    finally:
        for each in "ab":
            writer.thread(each).delete()
        writer.close()
        reader.close()
