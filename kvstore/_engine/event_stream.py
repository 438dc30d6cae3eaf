"""The sans-IO reader of a thread's event stream: watch, its cursors, and its catch-up.

Every writing script adds its event to the thread's stream in the same atomic step
(lua/includes/events.lua; docs/EVENTS.md). :func:`watch` is the sans-IO reader of that stream:
it yields :class:`ReadStream` (a blocking XREAD, sent on the watcher's own connection),
:class:`Run` (a core operation, run by the store: the native reads of the messages an event
names, and pages of stored messages) and :class:`Emit` (an event for the caller), so the sync
and the async watcher share all of it.

Resuming is exact because event n is followed by event n + 1 (the stream's ids count the
thread's events): a watcher that reads anything else after n knows the stream lost events, and
pages the stored messages from the sequence its cursor names, then goes on with the stream.
Counts start again in a thread made again under the id, so cursors and events also name the
thread's incarnation (meta `born`): the watcher of a thread that is gone never goes on into
another.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, cast

from .. import errors
from ..events import (
    Compacted,
    Delta,
    MessageReplaced,
    MessagesAdded,
    ThreadDeleted,
    ThreadEvent,
    TurnFinished,
    TurnRemoved,
    TurnStarted,
)
from ..messages import parse_message
from ..models import TurnOutcome
from .held_turns import expire_turn_quietly
from .layout.reader import decode, fetch, just_appended
from .operation import ITER_PAGE, Operation, ThreadRef
from .pages import list_page
from .reads import fetch_sequences
from .stream_replies import AfterRecovery
from .text import text as _text
from .watch_cursors import after_id, event_cursor, parse_cursor
from .watch_rollback import RECENT, Delivered
from .watch_state import (
    NO_BORN,
    State,
    Turns,
    event_int,
    id_numbers,
    read_born,
    read_state,
    stored_before,
)

# Events one XREAD returns at most.
READ_COUNT = 100


# ----------------------------------------------------------------------------- watching


@dataclass(frozen=True, slots=True)
class ReadStream:
    """XREAD BLOCK `block_ms` COUNT `count` STREAMS `key` `after`: the watcher's connection sends
    it; the reply is the entries, [(id, {field: value})], empty when the block timed out."""

    key: str
    after: str
    count: int
    block_ms: int


@dataclass(frozen=True, slots=True)
class Run:
    """A core operation for the store to run; the reply is its result."""

    operation: Operation


@dataclass(frozen=True, slots=True)
class Emit:
    """An event for the watcher's caller."""

    event: ThreadEvent


WatchStep = Generator[ReadStream | Run | Emit, Any, None]


class _Gone(Exception):
    """The thread the watcher follows is gone: another thread holds its id, or none does."""


def _check(incarnation: str | None, born: bytes | str | None) -> None:
    """Raises _Gone unless meta's `born` (read after a read of the thread) is the watched
    thread's: incarnations never come back, so the read before was of the watched thread."""
    if incarnation is None:
        return
    current = (born.decode() if isinstance(born, bytes) else born) if born is not None else NO_BORN
    if current != incarnation:
        raise _Gone


def watch(
    thread: ThreadRef, after: int | str | None, block_ms: int, messages: bool = True
) -> WatchStep:
    """The events of the thread after `after`, forever (until the thread is deleted).
    `messages`: read the Messages an event names (False: its ids and sequences only)."""
    if not thread.config.events:
        raise errors.ConfigError("watch() needs StoreConfig(events=True)")
    start, born = parse_cursor(after)
    state = yield Run(read_state(thread))
    if born is not None and state.incarnation != born:
        # The thread the cursor names is gone (another holds its id now, or none does).
        yield Emit(ThreadDeleted(str(after)))
        return
    # incarnation: the thread's this watcher follows (None until it reads the first event of a
    # thread that had none). n: the last event delivered (the next must be n + 1); caught_up:
    # messages through this sequence were delivered by paging, so an 'added' event at or before
    # it is skipped, and so is a 'compacted' one whose summary is (a replacement is not: the
    # page may have read the message before it). last_s: the thread's last sequence at event n (every message up to it was
    # delivered, or came before the watch began). A sequence an event shows stored before it
    # past both (a fork, a restore, a migration store with no event) is paged first.
    watching = _Watching(thread, state.incarnation, messages)
    try:
        yield from watching.run(start, state, block_ms)
    except _Gone:
        yield Emit(ThreadDeleted(watching.cursor()))


class _Watching:
    def __init__(self, thread: ThreadRef, incarnation: str | None, messages: bool) -> None:
        self.thread, self.incarnation, self.messages = thread, incarnation, messages
        self.n = self.last_s = self.caught_up = 0
        self.lease_checked: tuple[Turns, float] | None = None  # (turns, no end before this)
        self.busy_check = 0.0  # when a busy thread's leases are looked at next (monotonic)
        self.delivered = Delivered()

    def cursor(self) -> str:
        return event_cursor(f"{self.n}-{self.last_s}", self.incarnation)

    def lease_may_have_ended(self, turns: Turns | None) -> bool:
        """Whether a lease of `turns` (None: the turns last asked about) may have ended since this
        watcher last asked: a lease only moves later, so not before the time it had left then
        (a hold resets this: only a hold, with its event, adds a turn to end)."""
        checked = self.lease_checked
        if checked is None:
            return True
        return (turns is not None and checked[0] != turns) or time.monotonic() >= checked[1]

    def run(self, start: tuple[int, int] | int | None, state: State, block_ms: int) -> WatchStep:
        thread = self.thread
        if start is None:
            self.n, self.last_s = state.position()
            # What the thread holds came before the watch, with an event or not (a fork's).
            self.last_s = max(self.last_s, state.last_seq)
        elif isinstance(start, int):
            self.n, self.caught_up = yield from self.catch_up(start, state)
            self.last_s = self.caught_up
        else:  # an event's: a paged one's messages may have events after n (it read them live)
            self.n, self.last_s = start
            self.caught_up = self.last_s
        while True:
            entries = yield ReadStream(thread.keys.events, after_id(self.n), READ_COUNT, block_ms)
            if isinstance(entries, AfterRecovery) and (yield from self.resync()):
                continue  # read again after the events of the thread as it is now
            if not entries:
                yield from self.quiet()
            elif time.monotonic() >= self.busy_check and self.lease_may_have_ended(None):
                # Other writers keep the thread from being quiet: its dead turns end all the same.
                self.busy_check = time.monotonic() + block_ms / 1000
                yield from self.end_dead_turns((yield Run(read_state(thread))))
            for entry_id, raw in entries:
                fields = {(k.decode() if isinstance(k, bytes) else k): v for k, v in raw.items()}
                tag = fields.get("g")
                if tag is not None:
                    # An event of another thread of the id: this watcher's thread is gone. (An
                    # event without one was written by an older version: taken as it comes.)
                    if self.incarnation is None:
                        self.incarnation = _text(tag)
                    _check(self.incarnation, tag)
                entry_n, entry_s = id_numbers(entry_id)
                if entry_n != self.n + 1:
                    # Events n + 1 .. entry_n - 1 are gone (trimmed, or the stream expired): page
                    # the stored messages from the last sequence delivered, then read on.
                    self.n, self.caught_up = yield from self.catch_up(
                        max(self.last_s, self.caught_up)
                    )
                    break
                if stored_before(fields, entry_s) > self.known:
                    # Messages stored with no event (a fork, a restore) before this event: paged
                    # first; the event then brings only what the pages did not.
                    _, self.caught_up = yield from self.catch_up(self.known, None, self.n)
                self.n, self.last_s = entry_n, entry_s
                event = yield from self.event(
                    event_cursor(f"{entry_n}-{entry_s}", self.incarnation), fields
                )
                if isinstance(event, MessagesAdded):
                    self.delivered.add(event.messages)
                if event is not None:
                    yield Emit(event)
                if isinstance(event, ThreadDeleted):
                    return

    @property
    def known(self) -> int:
        """Every message up to this sequence was delivered, or came before the watch began."""
        return max(self.last_s, self.caught_up)

    def quiet(self) -> Generator[Any, Any, None]:
        """After block_ms with no event: the thread is gone if another holds its id, or if its
        event count went back (deleted, or expired, since this watcher's cursor); messages whose
        events the stream lost, or stored with no event (a fork, a restore), since the last one
        delivered are paged; the open turn is finished if its lease ended."""
        thread = self.thread
        state = yield Run(read_state(thread))
        _check(self.incarnation, state.born)
        if state.count < self.n:
            yield from self.resync(state)
            return
        if state.count > self.n and (state.oldest is None or state.oldest[0] > self.n + 1):
            # Events after n went with the stream (idle past its age, or trimmed) and no write
            # made it again: XREAD would wait for the next one. Page what they stored.
            self.n, self.caught_up = yield from self.catch_up(self.known, state)
        elif state.count == self.n and state.last_seq > self.known:
            if self.incarnation is None:
                # Made by a fork or a restore, which add no event: this watcher follows it now,
                # so a thread made again under the id later ends the watch.
                self.incarnation = state.born
            _, self.caught_up = yield from self.catch_up(self.known, state, self.n)
        yield from self.end_dead_turns(state)

    def end_dead_turns(self, state: State) -> Generator[Any, Any, None]:
        """A producer that died mid-turn renews no lease: its turn ends here, and so do the held
        turns a newer one superseded."""
        turns = state.turns_to_end
        if turns is None:
            # None to end: a turn started since comes with its event, or within a lease's time.
            self.lease_checked = ((None, None), time.monotonic() + self.thread.config.turn_lease)
        elif self.lease_may_have_ended(turns):
            left = yield Run(expire_turn_quietly(self.thread, state.open_turn))
            self.lease_checked = (turns, time.monotonic() + left)

    def resync(self, state: State | None = None) -> Generator[Any, Any, bool]:
        """After the slot's primary changed, or the thread counts fewer events than were
        delivered: pages the thread again from the first delivered message it no longer holds
        (a failover took it back: watch_rollback.py), so the consumer gets each sequence from
        there as it is now; True if it did. A thread without an incarnation (written by an
        older version) whose count went back cannot be told from one deleted since: gone."""
        state = state or (yield Run(read_state(self.thread)))
        _check(self.incarnation, state.born)
        if state.count < self.n and self.incarnation in (None, NO_BORN):
            raise _Gone
        changed = None
        if self.delivered.oldest is not None:
            held = yield Run(
                list_page(self.thread, self.delivered.oldest - 1, None, RECENT, "asc", None)
            )
            changed = self.delivered.first_changed(held.messages, state.last_seq)
        if changed is None:
            if state.count >= self.n:
                return False
            changed = min(self.last_s, state.last_seq) + 1
        self.delivered.forget_from(changed)
        self.n, self.caught_up = yield from self.catch_up(changed - 1, state)
        self.last_s = self.caught_up
        return True

    def catch_up(
        self, sequence: int, state: State | None = None, event: int | None = None
    ) -> Generator[Any, Any, tuple[int, int]]:
        """Pages the stored messages after `sequence` (as MessagesAdded, paged), then says where
        the stream goes on: returns (the event to read after, the last sequence paged). A page's
        cursor names the event the watcher reads on after (`event` when it goes on with the one
        it holds), so a watch resumed from it misses no later event.

        Where the stream goes on is read first (`state`, read before the call, or now): after
        the events counted then, or after those it lost already. Every event up to there was
        made, so every message it stored was stored, before the first page read: paging gets
        each one, whatever is written or trimmed while it pages. Events lost after that read
        are a gap the watcher sees in the stream, and it pages again. Each page is checked to
        be of the watched thread (meta's `born`, read after it)."""
        thread = self.thread
        if state is None:
            state = yield Run(read_state(thread))
        _check(self.incarnation, state.born)
        resume = max(state.count, state.oldest[0] - 1) if state.oldest else state.count
        last = sequence
        while True:
            page = yield Run(list_page(thread, after=last, limit=ITER_PAGE, order="asc"))
            if page.messages:
                _check(self.incarnation, (yield Run(read_born(thread))))
                self.delivered.add(page.messages)
                first_seq, last = page.messages[0].seq_id, page.messages[-1].seq_id
                yield Emit(
                    MessagesAdded(
                        event_cursor(
                            f"{resume if event is None else event}-{last}", self.incarnation
                        ),
                        list(page.messages),
                        first_seq,
                        last,
                        paged=True,
                        message_ids=tuple(m.id for m in page.messages),
                    )
                )
            if not page.has_more:
                # Every message up to the thread's last sequence then is paged, or was deleted.
                return resume, max(last, state.last_seq)

    def event(self, cursor: str, fields: dict[str, Any]) -> Generator[Any, Any, ThreadEvent | None]:
        thread, caught_up, incarnation = self.thread, self.caught_up, self.incarnation
        kind = _text(fields.get("k"))
        a, b = event_int(fields.get("a")), event_int(fields.get("b"))
        turn_id = _text(fields.get("t")) or None
        if kind == "added":
            if b <= caught_up:
                return None
            found = (
                (yield Run(_new_messages(thread, max(a, caught_up + 1), b, incarnation)))
                if self.messages
                else []
            )
            # The event names its messages by sequence; their ids come with them (an event
            # written before this version also lists them: i).
            listed = fields.get("i")
            ids = tuple(_text(listed).split(" ")) if listed else tuple(m.id for m in found)
            return MessagesAdded(cursor, found, a, b, turn_id, message_ids=ids)
        if kind == "delta":
            message = parse_message(fields["d"])
            return Delta(cursor, turn_id or "", message, event_int(fields.get("l")))
        if kind == "turn_started":
            self.lease_checked = None  # a hold: the turn may have a lease now, or a new one
            return TurnStarted(cursor, turn_id or "", a, event_int(fields.get("l")))
        if kind == "turn_finished":
            return TurnFinished(
                cursor,
                turn_id or "",
                # Only finish_turn.lua writes the event, with one of the four outcomes.
                cast(TurnOutcome, _text(fields.get("o"))),
                event_int(fields.get("n")),
                a or None,
                b or None,
            )
        if kind == "replaced":
            found = yield Run(_checked_sequences(thread, [a], incarnation))
            return MessageReplaced(cursor, _text(fields.get("i")), a, found[0] if found else None)
        if kind == "turn_removed":
            return TurnRemoved(
                cursor, turn_id or "", event_int(fields.get("n")), event_int(fields.get("r")) == 0
            )
        if kind == "compacted":
            if a <= caught_up:
                # Its summary (stored at a) came in a page: delivered once, as a paged message.
                return None
            found = yield Run(_checked_sequences(thread, [a], incarnation))
            return Compacted(cursor, found[0] if found else None, a, b)
        if kind == "deleted":
            return ThreadDeleted(cursor)
        return None  # a kind this version does not know: skipped


def _new_messages(thread: ThreadRef, first: int, last: int, incarnation: str | None) -> Operation:
    """Messages first..last, just stored: one native read of where new messages are (a record's
    sequence never changes hands, so what is found there is theirs); when some already moved on
    (rollover, retention, remove_turn), the reads of any sequence. Either is checked to be of
    the watched thread (meta's `born`, read after it, in the same round trip)."""
    found = yield from fetch(
        thread, just_appended(first, last), [("HGET", thread.keys.meta, "born")]
    )
    _check(incarnation, found.checks[0])
    if len(found.records) == last - first + 1:
        return decode(thread, list(found.records.items()))
    return (yield from _checked_sequences(thread, list(range(first, last + 1)), incarnation))


def _checked_sequences(
    thread: ThreadRef, sequences: list[int], incarnation: str | None
) -> Operation:
    found = list((yield from fetch_sequences(thread, sequences, missing_ok=True)))
    _check(incarnation, (yield from read_born(thread)))
    return found
