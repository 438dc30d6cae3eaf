"""Scenes 1 to 3 of the demo: a conversation, a request sent twice, a worker killed mid-append."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from multiprocessing.synchronize import Event
from typing import IO, Any

import redis

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
from ...thread import Thread
from .options import (
    JOB_REPLIES,
    JOB_THREAD,
    KILLED_AFTER,
    WORDS,
    DemoFailed,
    DemoOptions,
    demo_config,
)

# Scenes 1 and 2: a conversation, and a request sent twice.


def conversation_scene(thread: Thread, out: IO[str]) -> None:
    _conversation(thread, out)
    _request_sent_twice(thread, out)


def _conversation(thread: Thread, out: IO[str]) -> None:
    print("\n1. A conversation, stored and read back (thread chat)", file=out)
    thread.append(
        UserMessage(content="What's the weather in Oslo tomorrow?", otid="req-1"), turn_id="turn-1"
    )
    thread.start_turn("turn-1")
    thread.append(
        [
            ReasoningMessage(
                reasoning="A forecast question: ask the weather tool.", otid="req-1-r1"
            ),
            ToolCallMessage(
                tool_call=ToolCall(
                    name="weather",
                    arguments='{"city": "Oslo", "day": "tomorrow"}',
                    tool_call_id="call-1",
                ),
                otid="req-1-r2",
            ),
        ],
        turn_id="turn-1",
    )
    thread.append(
        ToolReturnMessage(
            tool_call_id="call-1",
            status="success",
            otid="req-1-r3",
            tool_return="cloudy, 4 °C, rain from 15:00",
        ),
        turn_id="turn-1",
    )
    thread.append(
        AssistantMessage(content="Cloudy and 4 °C, with rain from mid-afternoon.", otid="req-1-r4"),
        turn_id="turn-1",
    )
    turn = thread.finish_turn("turn-1")
    for message in thread.list(limit=10).messages:
        print(_chat_line(message), file=out)
    print(
        f"      turn-1 {turn.outcome}: {turn.reply_count} replies, "
        f"#{turn.first_sequence}..#{turn.last_sequence}",
        file=out,
    )


def _request_sent_twice(thread: Thread, out: IO[str]) -> None:
    print("\n2. The same request, sent twice (as a client retries after a timeout)", file=out)
    question = UserMessage(content="Should I take an umbrella?", otid="req-2")
    first = thread.append(question.model_copy(), turn_id="turn-2")
    print(_chat_line(first[0]) + "   otid req-2", file=out)
    again = thread.append(question.model_copy(), turn_id="turn-2")
    print(
        f"      sent again with otid req-2: {'a replay' if again.replayed else 'STORED AGAIN'}, "
        f"nothing written, #{again[0].seq_id} returned",
        file=out,
    )
    thread.start_turn("turn-2")
    thread.append(
        AssistantMessage(content="Yes: rain is forecast from 15:00.", otid="req-2-r1"),
        turn_id="turn-2",
    )
    thread.finish_turn("turn-2")
    print(_chat_line(thread.list(limit=1, order="desc").messages[0]), file=out)
    stored = list(thread.iter())
    with_otid = [m.seq_id for m in stored if m.otid == "req-2"]
    if (
        not again.replayed
        or again[0].id != first[0].id
        or with_otid != [first[0].seq_id]
        or len(stored) != 7
    ):
        raise DemoFailed(
            f"req-2 sent twice: replayed={again.replayed}, stored as {with_otid}, {len(stored)} messages"
        )
    print(
        f"      checked: {len(stored)} messages in the thread, one of them with otid req-2",
        file=out,
    )


def _chat_line(message: Message) -> str:
    text: object
    if isinstance(message, UserMessage):
        who, text = "user", message.content
    elif isinstance(message, AssistantMessage):
        who, text = "assistant", message.content
    elif isinstance(message, ReasoningMessage):
        who, text = "reasoning", message.reasoning
    elif isinstance(message, ToolCallMessage):
        who, text = "tool call", f"{message.tool_call.name}({message.tool_call.arguments})"
    elif isinstance(message, ToolReturnMessage):
        who, text = "tool", message.tool_return
    else:
        who, text = message.message_type.removesuffix("_message"), ""
    return f"  #{message.seq_id:<3} {who:<10} {text}"


# Scene 3: a worker killed mid-append, and its job run again.


def _job(thread: Thread, doomed: _DiesBeforeReading | None = None) -> tuple[int, int]:
    """A job as a queue would hand it out: a user message and a turn of JOB_REPLIES replies, one
    append each. Every message has an otid made from the job, so running the job again is safe.
    Returns (appends replayed, appends stored)."""
    replayed = stored = 0

    def append(message: Message, number: int) -> None:
        nonlocal replayed, stored
        if doomed is not None and number == KILLED_AFTER:
            doomed.doomed = True
        result = thread.append(message, turn_id="job-7")
        replayed += result.replayed
        stored += not result.replayed

    append(
        UserMessage(content="Summarise the incident reports of last week.", otid="job-7-user"), 0
    )
    thread.start_turn("job-7")
    for n in range(1, JOB_REPLIES + 1):
        append(
            AssistantMessage(
                content=f"Report {n}: " + " ".join(random.Random(n).choices(WORDS, k=20)),
                otid=f"job-7-reply-{n}",
            ),
            n,
        )
    thread.finish_turn("job-7")
    return replayed, stored


class _DiesBeforeReading(redis.Redis):
    """A client that, once `doomed`, waits for the server's reply to its next command, tells
    the demo, and waits to be killed without reading it."""

    doomed = False
    ready: Event  # set by _doomed_worker, before any command

    def parse_response(self, connection: Any, command_name: Any, **options: Any) -> Any:
        if self.doomed:
            connection.can_read(timeout=30)  # the server ran the append and answered
            self.ready.set()
            time.sleep(60)
        # redis-py leaves parse_response unannotated.
        return super().parse_response(connection, command_name, **options)  # type: ignore[no-untyped-call]


def _doomed_worker(url: str, namespace: str, ready: Event) -> None:
    client = _DiesBeforeReading.from_url(url)
    assert isinstance(client, _DiesBeforeReading)  # from_url makes its class's client
    client.ready = ready
    _job(MessageStore(client, demo_config(namespace)).thread(JOB_THREAD), client)


def killed_worker_scene(options: DemoOptions, thread: Thread, out: IO[str]) -> None:
    print("\n3. A worker killed mid-append, then its job run again (thread job)", file=out)
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    worker = context.Process(
        target=_doomed_worker, args=(options.url, options.namespace, ready), daemon=True
    )
    worker.start()
    while not ready.wait(0.05):
        if not worker.is_alive():
            raise DemoFailed(
                f"the worker ended before its reply {KILLED_AFTER} (exit code {worker.exitcode})"
            )
    assert worker.pid is not None  # started
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(10)
    print(
        f"      worker {worker.pid} runs job-7: a user message, then a turn of {JOB_REPLIES} replies,"
        " one append each",
        file=out,
    )
    print(
        f"      killed (SIGKILL) after the server stored reply {KILLED_AFTER}, before the worker read"
        " the answer",
        file=out,
    )
    before = thread.stats()
    turn = thread.snapshot().turn
    print(
        f"      on the server: {before.stored_messages} messages, turn job-7 {turn.outcome if turn else '-'}",
        file=out,
    )
    replayed, stored = _job(thread)
    print(
        f"      job-7 run again, as a queue redelivers it: {replayed} appends replayed (nothing written),"
        f" {stored} stored",
        file=out,
    )
    messages = list(thread.iter())
    otids = [m.otid for m in messages]
    sequences = [m.seq_id for m in messages]
    result = thread.finish_turn("job-7")
    expected = 1 + JOB_REPLIES
    if (
        before.stored_messages != KILLED_AFTER + 1
        or replayed != KILLED_AFTER + 1
        or len(set(otids)) != len(otids)
        or len(otids) != expected
        or sequences != list(range(1, expected + 1))
        or result.reply_count != JOB_REPLIES
    ):
        raise DemoFailed(
            f"job-7 run twice: {len(otids)} messages, {len(set(otids))} otids, "
            f"{result.reply_count} replies counted"
        )
    print(
        f"      checked: {len(messages)} messages, each otid once, #1..#{expected} gap-free,"
        f" turn job-7 {result.outcome} with {result.reply_count} replies",
        file=out,
    )
