"""Every Redis key kvstore uses is named here, and only here.

A thread's keys share one Redis Cluster hash tag, ``{<thread id>}``, under the store's namespace,
so a thread lives in one slot and every script touches one slot. A thread that belongs to an
owner lives in its owner's slot instead (``{#<owner>}``), beside the owner's directory: its
listing, usage and quotas (docs/OWNERS.md). docs/LAYOUT.md describes what each key holds; this
module and that page must say the same thing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import InvalidOwnerId, InvalidThreadId

MAX_THREAD_ID_LENGTH = 200

# Letters, digits and a few separators. Braces are excluded so an id can never open or close
# the hash tag; whitespace, glob characters (* ? [ ]) and backslashes are excluded so keys stay
# printable and safe to use in SCAN patterns and ACL key patterns.
_THREAD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]*")


def check_thread_id(thread_id: str) -> str:
    """`thread_id` if it can name a thread's keys (1-200 of the characters below, starting with
    a letter or digit), else InvalidThreadId."""
    if not isinstance(thread_id, str):
        raise InvalidThreadId(f"thread id must be a str, not {type(thread_id).__name__}")
    if not 1 <= len(thread_id) <= MAX_THREAD_ID_LENGTH:
        raise InvalidThreadId(
            f"thread id must be 1-{MAX_THREAD_ID_LENGTH} characters long, got {len(thread_id)}"
        )
    if not _THREAD_ID.fullmatch(thread_id):
        raise InvalidThreadId(
            f"thread id {thread_id!r} may hold only letters, digits and . _ : @ / + = -,"
            " and must start with a letter or digit"
        )
    return thread_id


def check_owner_id(owner: str) -> str:
    """`owner` if it can name an owner's hash tag (the characters and length of a thread id),
    else InvalidOwnerId."""
    try:
        return check_thread_id(owner)
    except InvalidThreadId as error:
        raise InvalidOwnerId(str(error).replace("thread id", "owner id")) from None


def legacy_pattern(namespace: str) -> str:
    """The SCAN pattern of every layout-1 legacy hash of a namespace."""
    return f"{namespace}:{{*}}:messages"


def thread_of_legacy_key(namespace: str, key: bytes | str) -> str:
    """The thread id of a legacy hash's key (one legacy_pattern matched)."""
    text = key.decode() if isinstance(key, bytes) else key
    return text[len(f"{namespace}:{{") : text.rindex("}:messages")]


def meta_pattern(namespace: str) -> str:
    """The SCAN pattern of every thread's meta hash of a namespace (layouts 2 and 3)."""
    return f"{namespace}:{{*}}:meta"


def thread_of_meta_key(namespace: str, key: bytes | str) -> str:
    """The thread id of a meta hash's key (one meta_pattern matched)."""
    text = key.decode() if isinstance(key, bytes) else key
    return text[len(f"{namespace}:{{") : text.rindex("}:meta")]


@dataclass(frozen=True, slots=True)
class ThreadKeys:
    """The keys of one thread. ``chunk_prefix`` + first sequence names a chunk."""

    meta: str
    window: str
    window_side: str
    chunk_index: str
    large_index: str
    ids: str
    otids: str
    turns: str
    legacy: str
    chunk_prefix: str
    events: str
    pairs: str
    open_data: str
    open_manifest: str

    @classmethod
    def of(cls, namespace: str, thread_id: str, owner: str | None = None) -> ThreadKeys:
        check_thread_id(thread_id)
        if owner is None:
            base = f"{namespace}:{{{thread_id}}}:"
        else:
            # '|' is in no thread id, so the owner's threads' key sets are disjoint, and none
            # is named like the owner's own keys (OwnerKeys: no '|').
            base = f"{OwnerKeys.of(namespace, owner).prefix}{thread_id}|"
        return cls(
            meta=base + "meta",
            window=base + "window",
            window_side=base + "wside",
            chunk_index=base + "chunks",
            large_index=base + "large",
            ids=base + "ids",
            otids=base + "otids",
            turns=base + "turns",
            legacy=base + "messages",
            chunk_prefix=base + "chunk:",
            events=base + "events",
            pairs=base + "pairs",
            open_data=base + "open:d",
            open_manifest=base + "open:m",
        )

    def chunk(self, first_sequence: int) -> str:
        """A layout-2 chunk: one hash (`_m` its manifest, `d` its records)."""
        return f"{self.chunk_prefix}{first_sequence}"

    def chunk_data(self, first_sequence: int) -> str:
        """A layout-3 chunk's records: one string (its manifest is chunk_manifest's)."""
        return f"{self.chunk_prefix}{first_sequence}:d"

    def chunk_manifest(self, first_sequence: int) -> str:
        """A layout-3 chunk's manifest: one string, a line per message."""
        return f"{self.chunk_prefix}{first_sequence}:m"

    @property
    def prompt_manifest(self) -> str:
        """The kept system prompt's manifest (lua/includes/prompt.lua), a chunk's format."""
        return f"{self.chunk_prefix}prompt:m"

    @property
    def prompt_data(self) -> str:
        """The kept system prompt's records."""
        return f"{self.chunk_prefix}prompt:d"

    def chunk_keys(self, first_sequence: int) -> tuple[str, str, str]:
        """Every key a chunk starting at `first_sequence` may have, in either layout."""
        return (
            self.chunk(first_sequence),
            self.chunk_data(first_sequence),
            self.chunk_manifest(first_sequence),
        )

    def fixed(self) -> tuple[str, ...]:
        """Every key whose name does not depend on the thread's contents."""
        return (
            self.meta,
            self.window,
            self.window_side,
            self.chunk_index,
            self.large_index,
            self.ids,
            self.otids,
            self.turns,
            self.legacy,
            self.events,
            self.pairs,
            self.open_data,
            self.open_manifest,
        )


@dataclass(frozen=True, slots=True)
class OwnerKeys:
    """The keys of an owner's directory, in the owner's hash tag ``{#<owner>}`` ('#' is in no
    thread id, so no unowned thread shares the tag). Its threads' keys are ``prefix`` + the
    thread id + ``|`` + part (ThreadKeys.of)."""

    prefix: str
    recent: str  # sorted set: thread id -> last activity (ms)
    created: str  # sorted set: thread id -> creation time (ms)
    info: str  # hash: thread id -> the thread's title and metadata (JSON)
    usage: str  # hash: totals, quotas, and per thread "t:<id>" -> its counts (docs/OWNERS.md)

    @classmethod
    def of(cls, namespace: str, owner: str) -> OwnerKeys:
        prefix = f"{namespace}:{{#{check_owner_id(owner)}}}:"
        return cls(prefix, prefix + "recent", prefix + "created", prefix + "info", prefix + "usage")

    def script_keys(self) -> tuple[str, str, str, str]:
        """KEYS[15..18] of a thread's script, KEYS[1..4] of an owner's (lua/includes/owner.lua)."""
        return (self.recent, self.created, self.info, self.usage)

    def pattern(self) -> str:
        """The SCAN pattern of every key of the owner and its threads (an owner id holds no
        glob characters)."""
        return self.prefix + "*"
