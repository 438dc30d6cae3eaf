"""The idempotent turn: a client's request and the turn that answers it, one per otid, however
often the request is sent (docs/EVENTS.md, "The idempotent turn").

The client gives each send an otid and sends it again on a retry. The request message is stored
with it (a retry is a replay), and the turn that answers it is named after it, so a retry finds
the same turn: finished, it answers the stored result; open (its producer died, or is slow), the
retry holds it and its earlier producer is fenced (TurnFenced) from then on.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from . import errors
from ._engine.operation import MAX_TOKEN_LENGTH
from .events import TurnLease
from .messages import Message, parse_message
from .models import TurnResult

_PREFIX = "turn-"


@dataclass(frozen=True, slots=True)
class RequestTurn:
    """What ``thread.hold_turn_for(request)`` returns: the stored request and its turn.

    ``lease`` is the caller's to produce the answer with (pass it where a turn id goes, then
    ``finish_turn(lease)``), None when the turn was finished by an earlier send of the request:
    then ``result`` is the turn's stored result and the caller answers it as it is (its
    replies: ``thread.list(turn_id=turn.turn_id)``). ``taken_over``: an earlier send held the
    turn and did not finish it; its producer is fenced now, and this one starts the answer
    again (messages it appends with the otids the first one used are replays).

    Example::

        turn = thread.hold_turn_for(UserMessage(content="hi", otid=client_otid))
        if turn.lease is not None:
            thread.append(AssistantMessage(content="hello"), turn_id=turn.lease)
            result = thread.finish_turn(turn.lease)
        else:
            result = turn.result
    """

    turn_id: str
    request: Message
    lease: TurnLease | None = None
    result: TurnResult | None = None

    @property
    def taken_over(self) -> bool:
        """Whether an earlier send of the request held the turn first (this lease fences it)."""
        return self.lease is not None and self.lease.lease > 1


def request_turn_id(otid: str) -> str:
    """The turn id a request with `otid` is answered in: ``turn-<otid>`` (``turn-`` and the
    otid's SHA-256 for an otid too long for a turn id).

    Example: ``request_turn_id("send-1")`` is ``"turn-send-1"``."""
    if len(_PREFIX) + len(otid) <= MAX_TOKEN_LENGTH:
        return _PREFIX + otid
    return _PREFIX + hashlib.sha256(otid.encode()).hexdigest()


def request_of(request: Message | dict[str, Any]) -> tuple[Message, str, str]:
    """The request as a message, its otid and the turn id the otid names; InvalidMessage before
    anything is sent for a request without an otid."""
    message = parse_message(request)
    otid = getattr(message, "otid", None)
    if not otid or not isinstance(otid, str):
        raise errors.InvalidMessage(
            "the request needs an otid: the client's id for this send, sent again on a retry,"
            " which makes the retry the same turn"
        )
    return message, otid, request_turn_id(otid)


def hold_request_turn(thread: Any, request: Message | dict[str, Any]) -> RequestTurn:
    """Thread.hold_turn_for: store the request, then hold its turn (or read its result)."""
    message, otid, turn_id = request_of(request)
    try:
        stored = thread.append(message, turn_id=turn_id)[0]
        return RequestTurn(turn_id, stored, lease=thread.hold_turn(turn_id))
    except errors.TurnFinished:
        # Finishing a finished turn is a read: the result its first finish recorded.
        return RequestTurn(turn_id, thread.get_by_otid(otid), result=thread.finish_turn(turn_id))


async def hold_request_turn_async(thread: Any, request: Message | dict[str, Any]) -> RequestTurn:
    """AsyncThread.hold_turn_for: the awaited :func:`hold_request_turn`."""
    message, otid, turn_id = request_of(request)
    try:
        stored = (await thread.append(message, turn_id=turn_id))[0]
        return RequestTurn(turn_id, stored, lease=await thread.hold_turn(turn_id))
    except errors.TurnFinished:
        return RequestTurn(
            turn_id,
            await thread.get_by_otid(otid),
            result=await thread.finish_turn(turn_id),
        )
