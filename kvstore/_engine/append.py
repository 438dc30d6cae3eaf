"""The writes of a conversation: append (and its replay), start_turn and finish_turn."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .. import errors
from ..messages import Message
from ..models import AppendResult, TurnOutcome, TurnResult
from .operation import TURN_OUTCOMES, Operation, ThreadRef, read_back_failed, write
from .prepare import PreparedMessage, check_token, prepare_batch, within_media_budget
from .reads import fetch_sequences
from .replies import AppendReply, FinishTurnReply, StartTurnReply
from .scripts import SCRIPTS
from .tool_pairs import batch_pairs


def append(
    thread: ThreadRef,
    messages: Message | dict[str, Any] | Iterable[Message | dict[str, Any]],
    turn_id: str | None,
    lease: int = 0,
    tokens: Any = None,
) -> Operation[AppendResult]:
    """`lease`: the caller's lease of the turn (thread.hold_turn), refused once another worker
    holds it; 0 for none. `tokens`: the caller's token count of each message (None: the store's
    counter counts them)."""

    def send(items: list[PreparedMessage]) -> Operation:
        pairs = (
            batch_pairs([item.message for item in items])
            if thread.config.history_checks == "strict"
            else ""
        )
        args = SCRIPTS["append"].args(
            limits=thread.limits(),
            turn_id=turn_id or "",
            lease=lease if turn_id else 0,
            pairs=pairs,
            messages=[
                (i.message.id, i.message.otid or "", i.media, i.tokens, i.record) for i in items
            ],
        )
        try:
            return AppendReply.decode(
                (yield from write(thread, SCRIPTS["append"], args)), len(items)
            )
        except errors.OutcomeUnknown as unknown:
            # The ids the client made are the call's token: re-sending these messages is safe.
            unknown.messages = [item.message for item in items]
            raise

    prepared = prepare_batch(thread.config, messages, turn_id, tokens, thread.count_tokens)
    reply, prepared = yield from within_media_budget(prepared, turn_id, send)
    if reply.stored:
        first = reply.first_sequence
        return AppendResult(
            [_with_sequence(item.message, first + i) for i, item in enumerate(prepared)]
        )
    return (yield from _replayed(thread, prepared, reply))


def _replayed(
    thread: ThreadRef, prepared: list[PreparedMessage], reply: AppendReply
) -> Operation[AppendResult]:
    """Every message was already stored: a replay returns what the first call stored."""
    sequences = [replayed.sequence for replayed in reply.replayed]
    try:
        found = yield from fetch_sequences(thread, sequences, missing_ok=True)
    except errors.ServerError as exc:
        raise read_back_failed("append", [item.message for item in prepared], exc) from exc
    by_sequence = {m.seq_id: m for m in found}
    stored = []
    for item, replayed in zip(prepared, reply.replayed, strict=True):
        message = by_sequence.get(replayed.sequence)
        if message is None:
            # Stored, then deleted by retention before this read: named by its stored id and
            # sequence, with the content as sent.
            stored_id = replayed.id or item.message.id
            message = _with_sequence(
                item.message.model_copy(update={"id": stored_id}), replayed.sequence
            )
        stored.append(message)
    return AppendResult(stored, replayed=True)


def _with_sequence(message: Message, sequence: int) -> Message:
    """Sets seq_id on a copy the store made itself (no second copy, no re-validation)."""
    message.__dict__["seq_id"] = sequence
    return message


def start_turn(thread: ThreadRef, turn_id: str) -> Operation[int]:
    check_token("turn_id", turn_id)
    reply = yield from write(
        thread,
        SCRIPTS["start_turn"],
        SCRIPTS["start_turn"].args(
            limits=thread.limits(), turn_id=turn_id, mode="start", call_id=""
        ),
    )
    return StartTurnReply.decode(reply).reply_start


def finish_turn(
    thread: ThreadRef, turn_id: str, outcome: TurnOutcome, lease: int = 0
) -> Operation[TurnResult]:
    check_token("turn_id", turn_id)
    if outcome not in TURN_OUTCOMES:
        raise errors.InvalidMessage(f"outcome {outcome!r} is not one of {', '.join(TURN_OUTCOMES)}")
    reply = FinishTurnReply.decode(
        (
            yield from write(
                thread,
                SCRIPTS["finish_turn"],
                SCRIPTS["finish_turn"].args(
                    limits=thread.limits(), turn_id=turn_id, lease=lease, outcome=outcome
                ),
            )
        )
    )
    return TurnResult(
        turn_id=turn_id,
        outcome=reply.outcome,
        reply_count=reply.reply_count,
        first_sequence=reply.first_sequence,
        last_sequence=reply.last_sequence,
    )
