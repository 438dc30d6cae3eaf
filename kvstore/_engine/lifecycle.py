"""The writes that change what a thread already holds: compact, replace, remove_turn, delete
and migrate (a thread of an older layout into the current one)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from .. import errors
from ..messages import CompactionStats, Message, SummaryMessage
from .bounds import check_sequence
from .failures import lost_connection, read_of_wrong_type
from .operation import (
    REMOVE_TURN_STEP,
    Batch,
    Eval,
    Operation,
    ThreadRef,
    delete_steps,
    event_limits,
    migrate_step,
    read_back_failed,
    write,
)
from .pages import list_page
from .prepare import PreparedMessage, check_token, prepare_batch, stored_date, within_media_budget
from .reads import fetch_sequences, locate_records
from .record import salvage
from .replies import CompactReply, RemoveTurnReply, ReplaceReply, RetainReply, stored_int
from .scripts import SCRIPTS
from .text import sendable
from .tokens import checked_tokens
from .tool_pairs import (
    PAIR_LOOKBACK,
    answered_ids,
    history_pairs,
    opened_ids,
    orphans,
)

log = logging.getLogger("kvstore")


def compact(
    thread: ThreadRef,
    summary: str,
    last_sequence: int,
    stats: CompactionStats | dict[str, Any] | None = None,
    tokens: int | None = None,
    moved: int | None = None,
) -> Operation[SummaryMessage]:
    check_sequence(last_sequence, "last_sequence", errors.InvalidSummaryRange, low=1)
    if isinstance(summary, str) and not sendable(summary):  # its id is made before it is checked
        raise errors.InvalidMessage("summary must be text UTF-8 can carry (no lone surrogate)")
    message = {
        "message_type": "summary_message",
        "summary": summary,
        "compaction_stats": stats,
        "id": summary_id(thread, summary, last_sequence),
    }
    prepared = prepare_batch(
        thread.config, message, None, None if tokens is None else [tokens], thread.count_tokens
    )
    boundary, why = yield from _summary_boundary(thread, last_sequence, prepared[0], moved)

    def send(items: list[PreparedMessage]) -> Operation:
        (item,) = items
        args = SCRIPTS["compact"].args(
            limits=thread.limits(),
            summary_last=boundary,
            asked=last_sequence,
            id=item.message.id,
            otid=item.message.otid or "",
            media=item.media,
            tokens=item.tokens,
            record=item.record,
        )
        return _sent_compact(thread, args, why)

    reply, (item,) = yield from within_media_budget(prepared, None, send)
    # A replay runs retention again: the first call's caller may not have finished it.
    deleted = reply.chunks_deleted if reply.stored else thread.config.max_chunks_per_call
    try:
        # Each call deletes at most max_chunks_per_call chunks; go on while that cap was reached.
        while deleted >= thread.config.max_chunks_per_call:
            retain = SCRIPTS["retain"].args(limits=thread.limits())
            retained = yield Eval(SCRIPTS["retain"], thread.script_keys, retain)
            deleted = RetainReply.decode(retained).chunks_deleted
        if not reply.stored:
            replayed: SummaryMessage = yield from _replayed_summary(
                thread, reply.summary_sequence, str(item.message.id)
            )
            return replayed
    except errors.OutcomeUnknown as unknown:
        unknown.messages = [item.message]
        raise
    except errors.ServerError as exc:
        raise read_back_failed("compact", [item.message], exc) from exc
    stored = item.message.model_copy(update={"seq_id": reply.summary_sequence})
    assert isinstance(stored, SummaryMessage)  # prepared from a summary_message above
    return stored


def _sent_compact(thread: ThreadRef, args: tuple[Any, ...], why: str) -> Operation[CompactReply]:
    """lua/compact.lua's reply; a refusal the pair rule led to names the pair (`why`)."""
    try:
        return CompactReply.decode((yield from write(thread, SCRIPTS["compact"], args)))
    except errors.InvalidSummaryRange as exc:
        if not why:
            raise
        raise errors.InvalidSummaryRange(f"{exc} ({why})") from None


def _replayed_summary(
    thread: ThreadRef, sequence: int, summary_id: str
) -> Operation[SummaryMessage]:
    """The summary a compaction's first call stored, as stored now (lua/compact.lua refuses a
    replay of one a replace withdrew), unless a replace made it another type since: its id,
    made from the range and text, is taken (docs/HISTORY.md, "Replacing the summary")."""
    found = yield from fetch_sequences(thread, [sequence])
    if not found or not isinstance(found[0], SummaryMessage):
        raise errors.DuplicateMessageId(
            f"compact: this summary's id {summary_id!r} names a stored message that is not the"
            " thread's summary now (it was replaced); nothing was written: compact with another"
            " text or range"
        )
    return found[0]


def _summary_boundary(
    thread: ThreadRef, last_sequence: int, item: PreparedMessage, moved: int | None
) -> Operation:
    """The summary's last sequence, moved back before a call whose answer comes after it
    (pair_boundary); a failed read is what a failed write's caller gets. `moved`: where a caller
    keeping its own messages whole moved it back already (kvstore.integrations.langchain), not
    taken into the current summary's range (for calls that summary covers)."""
    try:
        if moved is not None and moved < last_sequence:
            (current,) = yield Batch([("HGET", thread.keys.meta, "summary_last")])
            if moved >= stored_int(current or 0, "meta field summary_last"):
                last_sequence = moved
        return (yield from pair_boundary(thread, last_sequence))
    except errors.ServerError as exc:
        if read_of_wrong_type(exc):
            # A write refuses a key of the wrong type as LayoutError, before any write.
            raise errors.LayoutError(
                f"compact: a key of the thread holds another type than kvstore keeps there: {exc}"
            ) from exc
        if not lost_connection(exc):
            raise
        # Bytes of this compact reached a socket: a write's caller gets what any write whose
        # connection fails after sending gets (nothing was written here, so a re-send is safe).
        unknown = errors.OutcomeUnknown(
            f"compact: the connection failed while it read the thread ({exc}); re-send it"
        )
        unknown.messages = [item.message]
        raise unknown from exc


# Summary ids: uuid5 of (thread, last_sequence, summary) in this namespace.
_SUMMARY_IDS = uuid.UUID("8c1d2f4a-6b3e-4d7a-9e15-2a7f0c9b3d68")


def summary_id(thread: ThreadRef, summary: str, last_sequence: int) -> str:
    """The id of the summary a compaction stores: the same for the same thread, range and text,
    so that the call sent again (OutcomeUnknown says to) is a replay of its first run, found by
    its id even after another compaction went further."""
    return f"message-{uuid.uuid5(_SUMMARY_IDS, f'{thread.keys.meta}{chr(0)}{last_sequence}{chr(0)}{summary}')}"


def replace(
    thread: ThreadRef, message_id: str, message: Message | dict[str, Any], tokens: int | None = None
) -> Operation[Message]:
    if not isinstance(message_id, str) or not message_id or not sendable(message_id):
        raise errors.InvalidCursor(f"message id must be a non-empty str, got {message_id!r}")
    if tokens is not None:
        checked_tokens(tokens, "the replacement")
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

    def send(items: list[PreparedMessage]) -> Operation:
        (item,) = items
        pairs = history_pairs(item.message) if thread.config.history_checks == "strict" else ""
        args = SCRIPTS["replace"].args(
            limits=thread.limits(),
            id=message_id,
            media=item.media,
            tokens=item.tokens,
            record=item.record,
            pairs=pairs,
            summary=int(item.message.message_type == "summary_message"),
        )
        return ReplaceReply.decode((yield Eval(SCRIPTS["replace"], thread.script_keys, args)))

    prepared = [
        PreparedMessage.of(
            thread.config,
            incoming,
            original.turn_id,
            keep,
            "the replacement",
            tokens,
            thread.count_tokens,
        )
    ]
    reply, (item,) = yield from within_media_budget(prepared, original.turn_id, send)
    return item.message.model_copy(update={"seq_id": reply.sequence})


def remove_turn(thread: ThreadRef, turn_id: str) -> Operation[int]:
    check_token("turn_id", turn_id)
    yield from migrate(thread)
    removed = 0
    while True:
        reply = RemoveTurnReply.decode(
            (
                yield Eval(
                    SCRIPTS["remove_turn"],
                    thread.script_keys,
                    SCRIPTS["remove_turn"].args(
                        limits=thread.limits(), turn_id=turn_id, max_messages=REMOVE_TURN_STEP
                    ),
                )
            )
        )
        removed += reply.removed
        if reply.remaining == 0:
            return removed


def delete(thread: ThreadRef) -> Operation[None]:
    """Removes every key of the thread, DELETE_STEP chunks per call.

    The first call tombstones the thread (lua/delete.lua): if the caller stops between calls,
    the thread reads as empty and the next delete, or write, finishes the job."""
    yield from delete_steps(thread.script_keys, "start", event_limits(thread.config))


def migrate(thread: ThreadRef, max_calls: int | None = None) -> Operation[int]:
    """Moves a thread to the current layout, one bounded call at a time; returns the calls made.

    A layout-1 thread's legacy hash moves into chunks (it is then in layout 2); a layout-2
    thread becomes layout 3 and its window drains into closed chunks. Stops when the thread is in
    the current layout with an empty window (a missing thread: at once), or after `max_calls`
    calls (None: until done). Each call is one step: stopped anywhere and run again, it goes on
    from where the thread is.
    """
    calls = 0
    while max_calls is None or calls < max_calls:
        step = yield from migrate_step(thread)
        calls += 1
        if step.done:
            if step.fields_left:
                log.warning(
                    "thread %s is in layout %d; %d legacy fields that are not sequences were not"
                    " migrated and stay in %s",
                    thread.keys.meta,
                    step.layout,
                    step.fields_left,
                    thread.keys.legacy,
                )
            break
    return calls


# How many moves back a compaction's boundary may make to keep pairs whole (each move reads two
# pages of PAIR_LOOKBACK messages); past it the boundary stays where the last move put it.
MAX_BOUNDARY_MOVES = 4


def pair_boundary(thread: ThreadRef, last_sequence: int) -> Operation[tuple[int, str]]:
    """`last_sequence`, moved back before a tool call (or approval request) whose answer comes
    after it, so that the summary never covers half of a pair (docs/HISTORY.md), and what made
    the last move ('' for none). Only the PAIR_LOOKBACK messages on either side of the boundary
    are read. A call the current summary covers does not move it (that pair is split already,
    and context() mends it); a call just after that summary's range leaves the boundary on it,
    where lua/compact.lua tells a replay from a summary that cannot be stored."""
    current: int | None = None  # the current summary's last sequence, read at the first move
    why = ""
    for _ in range(MAX_BOUNDARY_MOVES):
        after = yield from list_page(thread, after=last_sequence, limit=PAIR_LOOKBACK, order="asc")
        answers = {i: m.seq_id for m in orphans(after.messages) for i in answered_ids(m)}
        if not answers:
            break
        before = yield from list_page(
            thread, after=last_sequence + 1, limit=PAIR_LOOKBACK, order="desc"
        )
        if current is None:
            (summary_last,) = yield Batch([("HGET", thread.keys.meta, "summary_last")])
            current = stored_int(summary_last or 0, "meta field summary_last")
        openers = {
            m.seq_id: answers[i]
            for m in before.messages
            for i in opened_ids(m)
            if i in answers and m.seq_id is not None and m.seq_id > current
        }
        if not openers:
            break  # the calls are covered already, or no longer stored (or never were)
        opener = min(openers)
        why = f"the tool call at sequence {opener} is answered at {openers[opener]}"
        if opener <= 1:
            raise errors.InvalidSummaryRange(
                f"last_sequence {last_sequence} splits a tool call from its answer, and the call is the"
                " thread's first message: there is nothing before it to summarize"
            )
        last_sequence = opener - 1
        if last_sequence <= current:
            break  # nothing after the current summary is left before the call
    return last_sequence, why
