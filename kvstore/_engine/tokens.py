"""Token counts: the rule for a message without a count (a token per 4 bytes of its record), and
the checks a count given by the caller or by the store's counter must pass."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeGuard

import msgpack

from .. import errors
from ..messages import Message
from .bounds import MAX_MESSAGE_TOKENS, bounded
from .layout.formats import record_tokens
from .record import encode_record

TokenCounter = Callable[[Message], int]
"""The store's tokenizer (MessageStore(count_tokens=...)): a message's token count."""


def estimated_tokens(message: Message) -> int:
    """The documented rule for a message without a counter: a token per 4 bytes of its record
    (msgpack of its JSON without ``None`` fields and without ``seq_id``; no turn id), rounded
    up. A message counts the same before and after it is stored."""
    return record_tokens(len(encode_record(message)))


def default_tokens(record: bytes, turn_id: str | None) -> int:
    """estimated_tokens of a message from the record the store made of it: its length without
    the turn id the record carries (the one msgpack value the store adds after the message)."""
    if turn_id is None:
        return record_tokens(len(record))
    return record_tokens(len(record) - len(msgpack.packb(turn_id, use_bin_type=True)))


def _is_count(tokens: object) -> TypeGuard[int]:
    return bounded(tokens, 0, MAX_MESSAGE_TOKENS)


def checked_tokens(tokens: object, what: str) -> int:
    """`tokens` when it is an int from 0 to MAX_MESSAGE_TOKENS, else InvalidMessage naming `what`."""
    if not _is_count(tokens):
        raise errors.InvalidMessage(
            f"the token count of {what} is {tokens!r:.80}: it must be an int from 0 to {MAX_MESSAGE_TOKENS}"
        )
    return tokens


def counted(counter: TokenCounter, message: Message, what: str) -> int:
    """What `counter` gives for `message`, else InvalidMessage naming `what` when that is not an
    int from 0 to MAX_MESSAGE_TOKENS."""
    tokens = counter(message)
    if not _is_count(tokens):
        raise errors.InvalidMessage(
            f"the token counter gave {tokens!r:.80} for {what}: it must give an int from 0 to {MAX_MESSAGE_TOKENS}"
        )
    return tokens
