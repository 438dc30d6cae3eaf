"""What every operation of the core is made of: its requests and what they share.

An operation is a generator that yields :class:`Eval` (one script call) or :class:`Batch` (native
commands sent in one round trip) and receives the reply; a typed error is thrown into it
instead. Here too: :class:`ThreadRef`, the limits and sizes the operations share, the writing
script call (:func:`write`, which takes a layout-1 thread's migration steps first) and the
finishing of an interrupted delete() (:func:`finishing_deletes`), which every operation runs in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from typing_extensions import TypeVar  # a default (PEP 696) before Python 3.13

from .. import errors
from ..config import StoreConfig
from ..messages import Message
from .layout.keys import OwnerKeys, ThreadKeys
from .replies import DeleteReply, MigrateReply, stored_int
from .scripts import SCRIPTS, Script


@dataclass(frozen=True, slots=True)
class Eval:
    script: Script
    keys: Sequence[str]
    args: Sequence[Any]  # ARGV as sent: Script.args builds it from the arguments by name

    def named(self) -> dict[str, Any]:
        """The call's arguments by name (script_args.py: ScriptArgs.decode)."""
        return self.script.arguments.decode(self.args)


@dataclass(frozen=True, slots=True)
class Batch:
    commands: Sequence[tuple[Any, ...]]


Result = TypeVar("Result", default=Any)
# A core operation: yields requests, takes their replies, returns its result.
Operation = Generator[Eval | Batch, Any, Result]

Cursor = str | int | None

MAX_LIMIT = 1000
# Messages per page of iter().
ITER_PAGE = 200
SNAPSHOT_SIZE = 200
# Chunks one page plan names at most; a page needing more plans again from where it stopped.
PLAN_MAX_CHUNKS = 64
# A read whose containers changed under it (rollover, deletion) is re-planned this many times.
MAX_READ_ATTEMPTS = 20
# A read with a consistent fallback (lua/read_range.lua: page walks, context) tries this many
# times optimistically first.
OPTIMISTIC_READS = 3
MAX_TOKEN_LENGTH = 256
TURN_OUTCOMES = ("completed", "steered", "cancelled", "failed")
# The most messages one remove_turn call retracts; larger turns take several calls.
REMOVE_TURN_STEP = 500
# The most chunks one delete call removes.
DELETE_STEP = 256


@dataclass(frozen=True, slots=True)
class ThreadRef:
    """What every operation needs to know about its thread, computed once per thread handle."""

    config: StoreConfig
    keys: ThreadKeys
    # KEYS[1..14] of every script (lua/includes/layout.lua), and an owned thread's owner's keys
    # as KEYS[15..18] (lua/includes/owner.lua)
    script_keys: tuple[str, ...]
    limits_args: str  # the `limits` argument of every writing script: the values joined by ':'
    # The store's token counter (MessageStore(count_tokens=...)); None: estimated_tokens.
    count_tokens: Any = None
    thread_id: str = ""
    owner: str | None = None  # the thread's owner (docs/OWNERS.md); None: a thread of its own
    # What the last reads of this thread learnt, for the next to read ahead (layout/v3.py's
    # newest page, budget.py's context, system_start.py's start). A hint only: every read checks
    # what it read ahead. A store's handles of one thread share its ThreadRef (Executor._thread_ref).
    hints: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(
        cls,
        config: StoreConfig,
        thread_id: str,
        count_tokens: Any = None,
        owner: str | None = None,
    ) -> ThreadRef:
        keys = ThreadKeys.of(config.namespace, thread_id, owner)
        retained = config.retained_message_limit
        # In the order of script_args.py's LIMIT_NAMES (lua/includes/args.lua: read_limits).
        limits = (
            config.window_size,
            config.chunk_size,
            config.chunk_max_bytes,
            config.max_chunks_per_call,
            config.max_bytes_per_call,
            config.max_message_bytes,
            config.max_inline_media_bytes,
            -1 if retained is None else retained,
            (config.thread_ttl or 0) * 1000,
            *event_limits(config),
            1 if config.history_checks == "strict" else 0,
            config.turn_lease * 1000,
        )
        # Sent as one argument, the values joined by ':' (the server parses a key's limits once).
        limits_key = ":".join(map(str, limits))
        script_keys = tuple(getattr(keys, field.name) for field in dataclasses.fields(keys))
        if owner is not None:
            script_keys += OwnerKeys.of(config.namespace, owner).script_keys()
        return cls(config, keys, script_keys, limits_key, count_tokens, thread_id, owner)

    def limits(self) -> str:
        """The `limits` argument of every writing script: script_args.py's LIMIT_NAMES' values
        joined by ':'."""
        return self.limits_args


def event_limits(config: StoreConfig) -> tuple[int, int]:
    """The event stream's cap and life (lua/includes/events.lua): (0, 0) when events are off."""
    if not config.events:
        return (0, 0)
    return (config.events_max_len, config.events_max_age * 1000)


def int_or_zero(value: Any) -> int:
    """A number the server replied, or 0 for a field or key that is not there."""
    return stored_int(value, "a stored number") if value is not None else 0


class ChangedUnderReads(errors.ServerError):
    """Every optimistic attempt of a read met the thread changing under it: a read with a
    consistent fallback catches it and reads in one step instead."""


def changed_under_reads() -> errors.ServerError:
    """What a read raises when every attempt met the thread changing under it."""
    return ChangedUnderReads("the thread changed under every read attempt; try again")


# --------------------------------------------------------------------------------- writes


def write(thread: ThreadRef, script: Script, args: Sequence[Any]) -> Operation:
    """Calls a writing script. A layout-1 thread refuses it, before writing, while the scan for
    its legacy range runs (MigrationPending): the scan steps run, and the call is sent again."""
    while True:
        try:
            return (yield Eval(script, thread.script_keys, args))
        except errors.MigrationPending:
            while True:
                step = yield from migrate_step(thread)
                if step.layout == 2 or not step.scanning:
                    break


def migrate_step(thread: ThreadRef) -> Operation:
    """One bounded call of lua/migrate.lua."""
    return MigrateReply.decode(
        (
            yield Eval(
                SCRIPTS["migrate"],
                thread.script_keys,
                SCRIPTS["migrate"].args(limits=thread.limits()),
            )
        )
    )


def read_back_failed(name: str, sent: list[Message], exc: Exception) -> errors.OutcomeUnknown:
    """The server or the connection failed after the write was sent: the caller gets the
    messages as sent, to re-send. (An error about the thread itself, such as LayoutError, is
    raised as it is.)"""
    unknown = errors.OutcomeUnknown(
        f"{name}: the call reached the server but what followed it failed ({exc}). Re-send the"
        " same call (same message ids or otids): nothing is stored twice."
    )
    unknown.messages = sent
    return unknown


# -------------------------------------------------------------------------------- deletes


def delete_steps(
    script_keys: Sequence[str], mode: Literal["start", "continue"], events: tuple[int, int] = (0, 0)
) -> Operation:
    """Calls lua/delete.lua, DELETE_STEP chunks at a time, until the thread is gone; the call
    that tombstones it adds its 'deleted' event under the `events` limits."""
    while not DeleteReply.decode(
        (
            yield Eval(
                SCRIPTS["delete"],
                script_keys,
                SCRIPTS["delete"].args(
                    max_chunks=DELETE_STEP,
                    mode=mode,
                    events_len=events[0],
                    events_age_ms=events[1],
                ),
            )
        )
    ).done:
        mode = "continue"


# A write refused because its thread is being deleted is sent again, after finishing the
# deletion, at most this many times in a row.
MAX_DELETE_REFUSALS = 10


def finishing_deletes(operation: Operation) -> Operation:
    """Drives `operation`, finishing any interrupted delete() one of its writes runs into.

    A writing script refuses a thread being deleted before it writes anything (KVS_DELETING):
    the deletion is finished here, never started (a thread another caller wrote meanwhile is left
    alone), and the refused call is sent again, to the now-empty thread. The executors run every
    operation through this, so no operation handles it itself."""
    try:
        request = next(operation)
        refusals = 0
        while True:
            try:
                reply = yield request
            except errors.ThreadDeleting as refused:
                # Another caller may delete the thread again in between; a bounded number of
                # times, so that no call waits on a thread deleted in a loop.
                refusals += 1
                if refusals > MAX_DELETE_REFUSALS:
                    raise errors.ServerError(
                        f"the thread was being deleted each of the {MAX_DELETE_REFUSALS} times its"
                        " deletion was finished and the call sent again; nothing was written"
                    ) from refused
                # KVS_DELETING is a script's refusal: the refused request is an Eval.
                assert isinstance(request, Eval)
                yield from delete_steps(request.keys, "continue")
                continue
            except errors.KVStoreError as exc:
                request = operation.throw(exc)
            else:
                request = operation.send(reply)
            refusals = 0
    except StopIteration as done:
        return done.value


def riding(
    operation: Operation[Result], extra: Sequence[tuple[Any, ...]]
) -> Operation[tuple[Result, list[Any]]]:
    """Drives `operation`, sending the `extra` commands in its first Batch (a round trip saved;
    alone after it when it sends none). Returns its result and the extra commands' replies.
    Errors thrown in go to `operation`, as finishing_deletes passes them."""
    ridden: list[Any] | None = None
    try:
        request = next(operation)
        while True:
            commands = None
            if ridden is None and isinstance(request, Batch):
                commands = list(request.commands)
                request = Batch([*commands, *extra])
            try:
                reply = yield request
            except errors.KVStoreError as exc:
                request = operation.throw(exc)
                continue
            if commands is not None:
                reply, ridden = list(reply[: len(commands)]), list(reply[len(commands) :])
            request = operation.send(reply)
    except StopIteration as done:
        if ridden is None:
            ridden = list((yield Batch(list(extra))))
        return done.value, ridden
