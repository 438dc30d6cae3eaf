"""The sans-IO core: every operation as a generator of requests.

An operation yields :class:`Eval` (one script call) or :class:`Batch` (native commands sent in
one round trip) and receives the reply; it returns the result. The sync and async stores are
executors that drive these generators over a client, so both share one implementation of every
operation: keys and arguments are built in the core, replies are parsed there (a writing
script's reply is decoded by name in kvstore/_engine/wire.py). Here: the writes; the rest by
concern in requests.py, prepare.py, reads.py, pages.py, plan.py and views.py, named here too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from .. import errors
from ..messages import CompactionStats, Message
from ..models import AppendResult, TurnOutcome, TurnResult
from .keys import ThreadKeys
from .pages import gathering, list_page, pages
from .prepare import PreparedMessage, check_token, fit_media, prepare_batch, stored_date
from .reads import fetch_sequences, get, get_by_otid, locate_records
from .record import salvage
from .requests import (
    DELETE_STEP,
    ITER_PAGE,
    MAX_LIMIT,
    REMOVE_TURN_STEP,
    SNAPSHOT_SIZE,
    TURN_OUTCOMES,
    Batch,
    Cursor,
    Eval,
    Operation,
    ThreadRef,
    delete_steps,
    finishing_deletes,
    read_back_failed,
    write,
)
from .scripts import SCRIPTS
from .views import context, snapshot, stats
from .wire import (
    AppendReply,
    CompactReply,
    FinishTurnReply,
    MigrateReply,
    RemoveTurnReply,
    ReplaceReply,
    RetainReply,
    StartTurnReply,
)

log = logging.getLogger("kvstore")


log = logging.getLogger("kvstore")


# --------------------------------------------------------------------------------- append


def _with_sequence(message: Message, sequence: int) -> Message:
    """Sets seq_id on a copy the store made itself (no second copy, no re-validation)."""
    message.__dict__["seq_id"] = sequence
    return message


def append(
    thread: ThreadRef, messages: Message | dict | Iterable[Message | dict], turn_id: str | None
) -> Operation:
    prepared = prepare_batch(thread.config, messages, turn_id)
    while True:
        args: list[Any] = [*thread.limits(), turn_id or "", len(prepared)]
        for item in prepared:
            args += (item.message.id, item.message.otid or "", item.media, item.record)
        try:
            reply = AppendReply.decode((yield from write(thread, SCRIPTS["append"], args)))
        except errors.InlineMediaBudget as over:
            prepared = fit_media(prepared, over.available, turn_id)
            continue
        except errors.OutcomeUnknown as unknown:
            # The ids the client made are the call's token: re-sending these messages is safe.
            unknown.messages = [item.message for item in prepared]
            raise
        break
    if reply.stored:
        first = reply.first_sequence
        return AppendResult([_with_sequence(item.message, first + i) for i, item in enumerate(prepared)])
    # Every message was already stored: a replay returns what the first call stored.
    sequences = [replayed.sequence for replayed in reply.replayed]
    try:
        found = yield from fetch_sequences(thread, sequences, missing_ok=True)
    except errors.ServerError as exc:
        raise read_back_failed("append", [item.message for item in prepared], exc) from exc
    by_sequence = {m.seq_id: m for m in found}
    stored = []
    for item, replayed in zip(prepared, reply.replayed):
        message = by_sequence.get(replayed.sequence)
        if message is None:
            # Stored, then deleted by retention before this read: named by its stored id and
            # sequence, with the content as sent.
            stored_id = replayed.id or item.message.id
            message = _with_sequence(item.message.model_copy(update={"id": stored_id}), replayed.sequence)
        stored.append(message)
    return AppendResult(stored, replayed=True)


# ---------------------------------------------------------------------------------- turns


def start_turn(thread: ThreadRef, turn_id: str) -> Operation:
    check_token("turn_id", turn_id)
    reply = yield from write(thread, SCRIPTS["start_turn"], (*thread.limits(), turn_id))
    return StartTurnReply.decode(reply).reply_start


def finish_turn(thread: ThreadRef, turn_id: str, outcome: TurnOutcome) -> Operation:
    check_token("turn_id", turn_id)
    if outcome not in TURN_OUTCOMES:
        raise errors.InvalidMessage(f"outcome {outcome!r} is not one of {', '.join(TURN_OUTCOMES)}")
    reply = FinishTurnReply.decode(
        (yield from write(thread, SCRIPTS["finish_turn"], (*thread.limits(), turn_id, outcome)))
    )
    return TurnResult(
        turn_id=turn_id,
        outcome=reply.outcome,
        reply_count=reply.reply_count,
        first_sequence=reply.first_sequence,
        last_sequence=reply.last_sequence,
    )


# ------------------------------------------------------------------------------ lifecycle


def compact(
    thread: ThreadRef, summary: str, last_sequence: int, stats: CompactionStats | dict | None = None
) -> Operation:
    if isinstance(last_sequence, bool) or not isinstance(last_sequence, int) or last_sequence < 1:
        raise errors.InvalidSummaryRange(f"last_sequence must be a positive int, got {last_sequence!r}")
    message = {"message_type": "summary_message", "summary": summary, "compaction_stats": stats}
    (item,) = prepare_batch(thread.config, message, None)
    while True:
        args = [*thread.limits(), last_sequence, item.message.id, item.message.otid or "", item.media, item.record]
        try:
            reply = CompactReply.decode((yield from write(thread, SCRIPTS["compact"], args)))
        except errors.InlineMediaBudget as over:
            (item,) = fit_media([item], over.available, None)
            continue
        break
    # A replay runs retention again: the first call's caller may not have finished it.
    deleted = reply.chunks_deleted if reply.stored else thread.config.max_chunks_per_call
    try:
        # Each call deletes at most max_chunks_per_call chunks; go on while that cap was reached.
        while deleted >= thread.config.max_chunks_per_call:
            retained = yield Eval(SCRIPTS["retain"], thread.script_keys, thread.limits())
            deleted = RetainReply.decode(retained).chunks_deleted
        if not reply.stored:
            found = yield from fetch_sequences(thread, [reply.summary_sequence])
            return found[0]
    except errors.OutcomeUnknown as unknown:
        unknown.messages = [item.message]
        raise
    except errors.ServerError as exc:
        raise read_back_failed("compact", [item.message], exc) from exc
    return item.message.model_copy(update={"seq_id": reply.summary_sequence})


def replace(thread: ThreadRef, message_id: str, message: Message | dict) -> Operation:
    if not isinstance(message_id, str) or not message_id:
        raise errors.InvalidCursor(f"message id must be a non-empty str, got {message_id!r}")
    incoming = PreparedMessage.of(thread.config, message, None).message
    yield from migrate(thread)
    found = yield from locate_records(thread, "id", [message_id])
    if not found:
        raise errors.MessageNotFound(f"no stored message has id {message_id!r}")
    # The original is not decoded, so an unreadable one can be replaced too: what a lenient read
    # of its record tells is kept (docs/RELIABILITY.md, "One bad record").
    original = salvage(found[0][1])

    def keep(body: dict[str, Any]) -> None:
        # Same id and sequence; the otid stays the original's (the otid map is not changed).
        body["id"] = message_id
        body.pop("otid", None)
        if original.otid is not None:
            body["otid"] = original.otid
        body.setdefault("date", original.date or stored_date())

    item = PreparedMessage.of(thread.config, incoming, original.turn_id, keep)
    while True:
        args = [*thread.limits(), message_id, item.media, item.record]
        try:
            reply = ReplaceReply.decode((yield Eval(SCRIPTS["replace"], thread.script_keys, args)))
        except errors.InlineMediaBudget as over:
            (item,) = fit_media([item], over.available, original.turn_id)
            continue
        return item.message.model_copy(update={"seq_id": reply.sequence})


def remove_turn(thread: ThreadRef, turn_id: str) -> Operation:
    check_token("turn_id", turn_id)
    yield from migrate(thread)
    removed = 0
    while True:
        reply = RemoveTurnReply.decode((yield Eval(
            SCRIPTS["remove_turn"], thread.script_keys, (*thread.limits(), turn_id, REMOVE_TURN_STEP)
        )))
        removed += reply.removed
        if reply.remaining == 0:
            return removed


def delete(thread: ThreadRef) -> Operation:
    """Removes every key of the thread, DELETE_STEP chunks per call.

    The first call tombstones the thread (lua/delete.lua): if the caller stops between calls,
    the thread reads as empty and the next delete, or write, finishes the job."""
    yield from delete_steps(thread.script_keys, "start")


def migrate(thread: ThreadRef, max_calls: int | None = None) -> Operation:
    """Moves a layout-1 thread into chunks, one bounded call at a time; returns the calls made.

    Stops when the thread is in layout 2 or after `max_calls` calls (None: until done).
    """
    calls = 0
    while max_calls is None or calls < max_calls:
        step = MigrateReply.decode((yield Eval(SCRIPTS["migrate"], thread.script_keys, thread.limits())))
        calls += 1
        if step.layout == 2:
            if step.fields_left:
                log.warning(
                    "thread %s is in layout 2; %d legacy fields that are not sequences were not"
                    " migrated and stay in %s",
                    thread.keys.meta, step.fields_left, thread.keys.legacy,
                )
            break
    return calls
