"""Messages made ready to send, before any request: every limit is checked here.

:class:`PreparedMessage` carries one message through validation and encoding
(kvstore/_engine/record.py), the per-message limits and the thread's inline-media budget;
:func:`prepare_batch` prepares a call's messages, filling their ids and dates;
:func:`within_media_budget` sends them again, their inline parts replaced, when the thread's
budget refuses them. Also the checks of ids and turn ids, and the new ids and dates.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from .. import errors
from ..config import StoreConfig
from ..messages import (
    BaseMessage,
    Message,
    check_inline_parts,
    inline_media_bytes,
    strip_inline_media,
    unknown_fields,
)
from .operation import MAX_TOKEN_LENGTH, Operation, Result
from .record import encode_message
from .text import sendable
from .tokens import TokenCounter, checked_tokens, counted, default_tokens


@dataclass(frozen=True, slots=True)
class PreparedMessage:
    """One message ready to send: as stored (validated; ids and dates filled), its record, its
    inline media bytes (what the thread's budget counts) and its token count: the caller's, else
    what `counter` gave, else the default rule's (tokens.py: estimated_tokens, from the record),
    counted again by whichever counted it if its inline parts are replaced."""

    message: Message
    record: bytes
    media: int
    tokens: int
    counter: TokenCounter | None = None
    counted: bool = False

    @classmethod
    def of(
        cls,
        config: StoreConfig,
        message: Message | dict[str, Any],
        turn_id: str | None,
        edit: Callable[[dict[str, Any]], None] | None = None,
        what: str = "the message",
        tokens: int | None = None,
        counter: TokenCounter | None = None,
    ) -> PreparedMessage:
        """`message` validated and encoded (record.py: encode_message, after `edit` on its
        dump), its limits checked; unknown fields refused if the config says so. Its token count
        is `tokens` when given, else `counter`'s, else the default rule's."""
        stored, record = encode_message(message, turn_id, edit)
        if config.unknown_fields == "refuse":
            _refuse_unknown_fields(stored, what)
        media = check_inline_parts(stored, config.max_inline_part_bytes)
        if len(record) > config.max_message_bytes:
            raise errors.MessageTooLarge(
                f"{what} ({stored.message_type}) encodes to {len(record)} bytes;"
                f" max_message_bytes is {config.max_message_bytes}"
            )
        if tokens is not None:
            return cls(stored, record, media, tokens)
        if counter is not None:
            return cls(stored, record, media, counted(counter, stored, what), counter, True)
        # The default rule from the record just made: no second encoding on the append path.
        return cls(stored, record, media, default_tokens(record, turn_id), None, True)

    def fitted(self, available: int, turn_id: str | None) -> PreparedMessage:
        """This message with its inline parts replaced, first to last, until its media fits
        `available` bytes; itself when it fits already."""
        if self.media <= available:
            return self
        message, record = encode_message(
            strip_inline_media(self.message, self.media - available), turn_id
        )
        tokens = self.tokens
        if self.counted:
            tokens = (
                counted(self.counter, message, "the message")
                if self.counter
                else default_tokens(record, turn_id)
            )
        return PreparedMessage(
            message, record, inline_media_bytes(message), tokens, self.counter, self.counted
        )


def given_tokens(tokens: Any, count: int) -> list[int | None]:
    """The caller's token counts of a batch of `count` messages: None (none given) or one int
    >= 0 per message; InvalidMessage otherwise, before anything is sent."""
    if tokens is None:
        return [None] * count
    if isinstance(tokens, (str, bytes, dict)) or not isinstance(tokens, Iterable):
        raise errors.InvalidMessage(
            f"tokens must be a list of ints, one per message, not {type(tokens).__name__}"
        )
    counts = list(tokens)
    if len(counts) != count:
        raise errors.InvalidMessage(
            f"tokens lists {len(counts)} counts for {count} messages: give one per message"
        )
    return [checked_tokens(value, f"message {position}") for position, value in enumerate(counts)]


def fit_media(
    items: list[PreparedMessage], available: int, turn_id: str | None
) -> list[PreparedMessage]:
    """Replaces the batch's own inline parts, first to last, until it fits `available` bytes."""
    fitted = []
    for item in items:
        item = item.fitted(available, turn_id)
        available -= item.media
        fitted.append(item)
    return fitted


def within_media_budget(
    items: list[PreparedMessage],
    turn_id: str | None,
    send: Callable[[list[PreparedMessage]], Operation[Result]],
) -> Operation[tuple[Result, list[PreparedMessage]]]:
    """Runs `send(items)`; returns its result and the items it sent.

    A thread whose inline-media budget has less room than the items carry refuses the call
    before writing (InlineMediaBudget, with the room left): it is sent again with the items
    fitted to that room.
    """
    while True:
        try:
            return (yield from send(items)), items
        except errors.InlineMediaBudget as over:
            items = fit_media(items, over.available, turn_id)


def prepare_batch(
    config: StoreConfig,
    messages: Message | dict[str, Any] | Iterable[Message | dict[str, Any]],
    turn_id: str | None,
    tokens: Any = None,
    counter: TokenCounter | None = None,
) -> list[PreparedMessage]:
    """Validates what it encodes, fills ids and dates, counts tokens (the caller's `tokens`, one
    per message, else `counter`'s, else estimated_tokens); every limit is enforced here, before
    the socket."""
    if isinstance(messages, BaseMessage) and tokens is None:
        # One message model, the common append: the steps below without the batch's lists.
        if turn_id is not None:
            check_token("turn_id", turn_id)
        item = PreparedMessage.of(
            config, messages, turn_id, _stamper(stored_date()), "message 0", None, counter
        )
        _check_batch_bytes(config, len(item.record))
        _give_id(messages, item.message.id)
        return [item]
    # One message may come as JSON text too (parse_message takes it); never as its characters.
    if isinstance(messages, (dict, BaseModel, str, bytes, bytearray)) or not isinstance(
        messages, Iterable
    ):
        messages = [messages]
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            tokens = [tokens]
    given = list(messages)
    _check_batch_count(config, given)
    _check_each_object_once(given)
    counts = given_tokens(tokens, len(given))
    if turn_id is not None:
        check_token("turn_id", turn_id)
    stamp = _stamper(stored_date())
    prepared = [
        PreparedMessage.of(
            config, message, turn_id, stamp, f"message {position}", counts[position], counter
        )
        for position, message in enumerate(given)
    ]
    _check_batch_bytes(config, sum(len(item.record) for item in prepared))
    # The ids are the call's token: the caller's own messages carry them from now on, so that
    # sending the same messages again after any interruption is a replay.
    for original, item in zip(given, prepared, strict=True):
        _give_id(original, item.message.id)
    return prepared


def _stamper(now: str) -> Callable[[dict[str, Any]], None]:
    """What prepare_batch does to each message's dump: its id (checked, or a new one), its otid
    checked, its date (`now`) when it has none."""

    def stamp(body: dict[str, Any]) -> None:
        # On the dump that is stored; the caller's own message gets only the id (_give_id).
        if "id" in body:
            check_token("message id", body["id"])
        else:
            body["id"] = _new_message_id()
        if "otid" in body:
            check_token("otid", body["otid"])
        body.setdefault("date", now)

    return stamp


def _check_batch_bytes(config: StoreConfig, total: int) -> None:
    if total > config.max_batch_bytes:
        raise errors.BatchTooLarge(
            f"the batch encodes to {total} bytes; max_batch_bytes is {config.max_batch_bytes}"
        )


def _refuse_unknown_fields(message: Message, what: str) -> None:
    found = unknown_fields(message)
    if found:
        items = [f"{path} ({hint})" for path, hint in found.items()]
        shown = "; ".join(items[:5]) + (f"; and {len(items) - 5} more" if len(items) > 5 else "")
        error = errors.UnknownField(
            f"{what} ({message.message_type}) holds fields kvstore does not know: {shown}."
            ' The store refuses them (StoreConfig(unknown_fields="refuse"));'
            ' with "keep", the default, they are stored'
        )
        error.fields = list(found)
        error.errors = []  # type: ignore[attr-defined]  # same surface as other InvalidMessage
        raise error


def _check_each_object_once(batch: list[Any]) -> None:
    """A message object (a model or a dict) appears once in a batch: the store gives the
    caller's object the id of its message, so that sending it again is a replay, and one
    object cannot hold the ids of two messages."""
    seen: dict[int, int] = {}
    for position, message in enumerate(batch):
        if isinstance(message, (BaseModel, dict)):
            first = seen.setdefault(id(message), position)
            if first != position:
                raise errors.MessageIdRepeated(
                    f"message {position} is the same object as message {first}: an object holds"
                    " the id of one message (pass a copy: message.model_copy(), dict(message))"
                )


def _check_batch_count(config: StoreConfig, batch: list[Any]) -> None:
    if not batch:
        raise errors.InvalidMessage("append needs at least one message")
    if len(batch) > config.max_batch_messages:
        raise errors.BatchTooLarge(
            f"{len(batch)} messages in one call; at most {config.max_batch_messages}"
        )


def _give_id(original: Any, message_id: str | None) -> None:
    """Sets the id the store made on the caller's message (a model or a dict) that had none."""
    if isinstance(original, BaseModel):
        if original.__dict__.get("id") is None:
            # A valid id by construction: no re-validation (validate_assignment) needed.
            original.__dict__["id"] = message_id
            original.__pydantic_fields_set__.add("id")
    elif isinstance(original, dict) and original.get("id") is None:
        original["id"] = message_id


def check_token(kind: str, value: str) -> None:
    """Refuses an id, otid or turn id the scripts cannot take as one ARGV field."""
    if not isinstance(value, str):
        raise errors.InvalidMessage(f"{kind} must be a str, not {type(value).__name__}")
    if not value or len(value) > MAX_TOKEN_LENGTH or any(c in value for c in "\t\n\r\0"):
        raise errors.InvalidMessage(
            f"{kind} {value[:80]!r} must be 1-{MAX_TOKEN_LENGTH} characters without tabs,"
            " newlines or NUL"
        )
    if not sendable(value):  # a lone surrogate: no UTF-8 text for the server
        raise errors.InvalidMessage(f"{kind} {value[:80]!r} is not valid Unicode")


def _new_message_id() -> str:
    """`message-<uuid4>`, built straight from random bytes (uuid.uuid4() is slower)."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"message-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def stored_date() -> str:
    """The time as a stored date: ISO 8601 in UTC, as pydantic dumps it (isoformat is the fast way)."""
    return datetime.now(UTC).isoformat()[:-6] + "Z"
