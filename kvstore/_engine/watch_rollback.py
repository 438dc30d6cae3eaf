"""A watcher's check of the history it delivered, after its slot's primary changed.

A failover may promote a replica that had not received the old primary's newest writes, which a
watcher had already delivered (Redis and Valkey replicate asynchronously; under
``durability="default"`` those writes were acknowledged, under ``"replicated"`` they were not).
The promoted replica then holds fewer events, or other messages at the sequences delivered, and
its event stream's ids (``<count>-<sequence>``) say nothing of which: they grow the same way on
both sides. So the watcher keeps the ids of the messages it delivered last (``Delivered``,
bounded), and after a recovery compares them with what the thread holds: the first sequence
whose message is another, or gone, is where it pages the thread again from
(event_stream.py: _Watching.resync).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from ..messages import Message

RECENT = 1000
"""The delivered messages a watcher remembers (sequence, id): a failover takes back the tail
its replica had not received, far fewer than this at any rate a server replicates at."""


class Delivered:
    """The newest RECENT messages a watcher delivered, oldest first."""

    def __init__(self) -> None:
        self._recent: deque[tuple[int, str]] = deque(maxlen=RECENT)

    def add(self, messages: Iterable[Message]) -> None:
        for message in messages:
            if message.seq_id is None or message.id is None:
                continue
            while self._recent and self._recent[-1][0] >= message.seq_id:
                self._recent.pop()  # delivered again after a resync: the newer one counts
            self._recent.append((message.seq_id, message.id))

    @property
    def oldest(self) -> int | None:
        """The oldest remembered sequence (None: none remembered)."""
        return self._recent[0][0] if self._recent else None

    def first_changed(self, stored: Iterable[Message], last_seq: int) -> int | None:
        """The first remembered sequence whose message the thread no longer holds as delivered:
        another message there, or none where the thread ends (`last_seq`) before it. A sequence
        missing below `last_seq` was removed since (retention, a removed turn), not taken back."""
        now = {m.seq_id: m.id for m in stored}
        for sequence, message_id in self._recent:
            if sequence > last_seq:
                return sequence
            held = now.get(sequence)
            if held is not None and held != message_id:
                return sequence
        return None

    def forget_from(self, sequence: int) -> None:
        while self._recent and self._recent[-1][0] >= sequence:
            self._recent.pop()
