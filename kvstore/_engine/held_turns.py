"""Held turns and their deltas: hold_turn (start a turn under a lease), renew_turn and
expire_turn (the lease's heartbeat and end), publish (a delta on the thread's event stream), and
what they share: the call id that makes a re-sent call a replay, and a delta's encoding
(docs/EVENTS.md)."""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any

from .. import errors
from ..events import TurnLease
from ..messages import AssistantMessage, Message, parse_message
from .bounds import check_lease
from .operation import Operation, ThreadRef, write
from .prepare import check_token
from .scripts import SCRIPTS

# The largest delta publish() sends.
MAX_DELTA_BYTES = 1024 * 1024


def new_call_id(call_id: str | None) -> str:
    """The id of one hold_turn or publish call: the caller's (to retry a call across processes
    or interruptions), else one made here, before the first send, so that a re-send of the same
    command (redis-py's retry) is a replay (lua/includes/turns.lua, recorded_call)."""
    if call_id is None:
        return os.urandom(8).hex()
    check_token("call_id", call_id)
    return call_id


def hold_turn(thread: ThreadRef, turn_id: str, call_id: str | None = None) -> Operation[TurnLease]:
    check_token("turn_id", turn_id)
    call_id = new_call_id(call_id)
    try:
        reply = yield from write(
            thread,
            SCRIPTS["start_turn"],
            SCRIPTS["start_turn"].args(
                limits=thread.limits(), turn_id=turn_id, mode="hold", call_id=call_id
            ),
        )
    except errors.OutcomeUnknown as unknown:
        unknown.call_id = call_id  # the caller's token to send the call again
        raise
    start, lease = reply
    return TurnLease(turn_id=turn_id, lease=int(lease), reply_start=int(start))


def renew_turn(thread: ThreadRef, lease: TurnLease) -> Operation[None]:
    """A held turn's heartbeat: its lease lasts the store's turn_lease again from now."""
    check_token("turn_id", lease.turn_id)
    yield from write(
        thread,
        SCRIPTS["renew_turn"],
        SCRIPTS["renew_turn"].args(
            limits=thread.limits(), turn_id=lease.turn_id, lease=check_lease(lease.lease)
        ),
    )


def expire_turn(thread: ThreadRef, turn_id: str | None = None) -> Operation[str | None]:
    """Finishes the turn (the thread's current one for None) as abandoned if its lease ended;
    returns its outcome after the call ("open" while not held or its lease has time left), None
    when the thread has no turn. Each held turn a newer one superseded is finished so too."""
    outcome, _left = yield from lease_left(thread, turn_id)
    return outcome or None


def lease_left(thread: ThreadRef, turn_id: str | None = None) -> Operation[tuple[str, float]]:
    """expire_turn's call: the turn's outcome after it ('' for no turn) and the seconds before
    a lease it left open could end, the turn's or a superseded turn's (inf for none)."""
    if turn_id is not None:
        check_token("turn_id", turn_id)
    outcome, left, older_left = yield from write(
        thread,
        SCRIPTS["renew_turn"],
        SCRIPTS["renew_turn"].args(limits=thread.limits(), turn_id=turn_id or "", lease=0),
    )
    # -1: no lease bounds the turn (or none is open); 0: it is finished.
    seconds = min((int(ms) / 1000 for ms in (left, older_left) if int(ms) > 0), default=math.inf)
    return (outcome.decode() if isinstance(outcome, bytes) else str(outcome)), seconds


def expire_turn_quietly(thread: ThreadRef, turn_id: str | None) -> Operation[float]:
    """A watcher's expire_turn: finishes the turn (the current one for None) and each held turn
    a newer one superseded as abandoned if its lease ended (the event then reaches every
    watcher); returns the seconds before a lease still open could end (inf for none). A watcher
    that may not write, or a thread being deleted or restored, leaves it to another call."""
    with contextlib.suppress(
        errors.PermissionDenied, errors.ThreadDeleting, errors.RestoreIncomplete
    ):
        _outcome, left = yield from lease_left(thread, turn_id)
        return left
    return 0.0


def encode_delta(delta: Message | dict[str, Any] | str) -> bytes:
    """A delta as the stream keeps it: the message's JSON in the list API's shape."""
    if isinstance(delta, str):
        delta = AssistantMessage(content=delta)
    message = parse_message(delta)
    try:
        data = message.model_dump_json(exclude_none=True).encode()
    except ValueError as error:  # a lone surrogate in its text: no JSON for it
        raise errors.InvalidMessage(f"a delta cannot be encoded: {error}") from None
    if len(data) > MAX_DELTA_BYTES:
        raise errors.MessageTooLarge(
            f"a delta is {len(data)} bytes encoded; at most {MAX_DELTA_BYTES}"
        )
    return data


def publish(
    thread: ThreadRef,
    turn: str | TurnLease,
    delta: Message | dict[str, Any] | str,
    call_id: str | None = None,
) -> Operation[str]:
    if not thread.config.events:
        raise errors.ConfigError(
            "publish() needs StoreConfig(events=True): deltas travel on the event stream"
        )
    turn_id, lease = (
        (turn.turn_id, check_lease(turn.lease)) if isinstance(turn, TurnLease) else (turn, 0)
    )
    check_token("turn_id", turn_id)
    data = encode_delta(delta)
    call_id = new_call_id(call_id)
    try:
        reply = yield from write(
            thread,
            SCRIPTS["publish"],
            SCRIPTS["publish"].args(
                limits=thread.limits(), turn_id=turn_id, lease=lease, delta=data, call_id=call_id
            ),
        )
    except errors.OutcomeUnknown as unknown:
        unknown.call_id = call_id  # the caller's token to send the call again
        raise
    return reply.decode() if isinstance(reply, bytes) else str(reply)
