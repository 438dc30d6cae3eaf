"""StoreConfig: the sizes and limits of a store, checked once when it is made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .errors import ConfigError
from .limits import CONFIG_MAXIMA, check_namespace

KiB = 1024
"""Bytes in a kibibyte."""
MiB = 1024 * KiB
"""Bytes in a mebibyte, e.g. ``StoreConfig(chunk_max_bytes=2 * MiB)``."""


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Sizes and limits. Every store and every worker of a thread must use the same values.

    chunk_size / chunk_max_bytes: a chunk holds at most this many messages and record bytes
        (and at most 65,520 bytes of records, so it fills one allocator size class); the newest
        messages sit in the open chunk, which closes into a chunk when full; a message larger
        than chunk_max_bytes gets a chunk of its own.
    max_message_bytes: one encoded message larger than this is refused before the socket.
    window_size, max_chunks_per_call / max_bytes_per_call: the window a thread written by an
        older version (layout 2) may still hold, and the most one call moves out of it into
        chunks (docs/LAYOUT.md, its migration); max_chunks_per_call also bounds what retention
        deletes in one call.
    max_batch_messages / max_batch_bytes: the most one append call may carry.
    retained_message_limit: messages always kept after a compaction (None keeps everything).
    max_inline_part_bytes / max_inline_media_bytes: inline media limits (decoded bytes).
    thread_ttl: seconds an idle thread lives (None: forever).
    durability: what an acknowledged write waits for. "default": the server applied it (its
        persistence settings decide the rest). "fsync": also the server's AOF fsync (WAITAOF;
        Redis/Valkey >= 7.2 with appendonly on). "replicated": also `durability_replicas`
        replicas (WAIT). Waiting longer than `durability_timeout_ms` raises NotDurable.
    events: whether every write also adds its event to the thread's event stream, which
        thread.watch() reads (docs/EVENTS.md). False: no stream is written, watch() cannot be used.
    events_max_len: the stream keeps about the newest this many events (at least this many; it
        is trimmed in whole nodes of 100; with retained_message_limit lower, about that many, and
        none older than the oldest message kept). A watcher further behind pages the stored
        messages.
    events_max_age: without thread_ttl, the stream expires 1 to 1.5 times this many seconds after
        the thread's last event: how long an idle thread's watcher can resume from an event id.
        With thread_ttl, the stream expires with the thread.
    scripting: how the scripts are called (docs/LAYOUT.md, "Loading"). "functions": FCALL /
        FCALL_RO of kvstore's function library, loaded with FUNCTION LOAD when the server lacks
        it; a server without functions (older than Redis 7, or a proxy) and a cluster client
        use "eval" instead. "eval": EVALSHA of each script, sent with EVAL after NOSCRIPT.
    unknown_fields: what a message's fields that kvstore does not know become (a newer API's, or
        a misspelling; an attachment's own keys are never unknown). "keep": stored with the
        message, counted in its size, and read back where they were. "refuse": the message is
        refused with UnknownField naming each one (``content[0].colour``), before anything is
        sent (kvstore.messages.unknown_fields lists them).
    history_checks: "strict": every append is checked against the thread's open tool calls and
        approval requests in the same atomic step, and an answer to nothing open is refused with
        HistoryConflict (docs/HISTORY.md, "Checked updates"). Only threads whose every message
        was written with checks on are checked. "off" (the default): no check and no cost.
    turn_lease: seconds a held turn's lease lasts after its holder's last call under it
        (hold_turn, and each append, publish and renew_turn with the lease). A turn whose lease
        ended is finished as "abandoned" by the first call that meets it, and a watcher of a quiet
        thread sends that call: a producer that died mid-turn does not leave it open (docs/EVENTS.md,
        "Held turns").

    Raises ConfigError (a ValueError) naming the value when one is out of range (each int's
    largest is in docs/LAYOUT.md, "Number bounds") or the values are inconsistent; the namespace is 1-64 characters of letters, digits and ``. _ : -``.

    Example::

        config = StoreConfig(namespace="chat", retained_message_limit=5000, thread_ttl=30 * 86400)
        store = MessageStore.from_url("redis://localhost:6379/0", config=config)
    """

    namespace: str = "kv"
    window_size: int = 64
    chunk_size: int = 64
    chunk_max_bytes: int = 1 * MiB
    max_message_bytes: int = 16 * MiB
    max_chunks_per_call: int = 4
    max_bytes_per_call: int = 8 * MiB
    max_batch_messages: int = 500
    max_batch_bytes: int = 32 * MiB
    retained_message_limit: int | None = 1000
    max_inline_part_bytes: int = 5 * MiB
    max_inline_media_bytes: int = 20 * MiB
    thread_ttl: int | None = None
    durability: Literal["default", "fsync", "replicated"] = "default"
    durability_replicas: int = 1
    durability_timeout_ms: int = 1000
    scripting: Literal["functions", "eval"] = "functions"
    unknown_fields: Literal["keep", "refuse"] = "keep"
    events: bool = True
    events_max_len: int = 1000
    events_max_age: int = 3600
    history_checks: Literal["off", "strict"] = "off"
    turn_lease: int = 60

    def __post_init__(self) -> None:
        check_namespace(self.namespace)
        _positive(
            self,
            "window_size",
            "chunk_size",
            "chunk_max_bytes",
            "max_message_bytes",
            "max_chunks_per_call",
            "max_bytes_per_call",
            "max_batch_messages",
            "max_batch_bytes",
            "max_inline_part_bytes",
            "max_inline_media_bytes",
        )
        if self.max_bytes_per_call < self.chunk_max_bytes:
            raise ConfigError("max_bytes_per_call must be at least chunk_max_bytes")
        if self.max_inline_part_bytes > self.max_inline_media_bytes:
            raise ConfigError("max_inline_part_bytes must not exceed max_inline_media_bytes")
        if self.retained_message_limit is not None:
            _non_negative_int(self, "retained_message_limit")
        if self.thread_ttl is not None:
            _positive(self, "thread_ttl")
        if self.durability not in ("default", "fsync", "replicated"):
            raise ConfigError(
                f"durability must be 'default', 'fsync' or 'replicated', got {self.durability!r}"
            )
        _positive(
            self,
            "durability_replicas",
            "durability_timeout_ms",
            "events_max_len",
            "events_max_age",
            "turn_lease",
        )
        if not isinstance(self.events, bool):
            raise ConfigError(f"events must be True or False, got {self.events!r}")
        if self.scripting not in ("functions", "eval"):
            raise ConfigError(f"scripting must be 'functions' or 'eval', got {self.scripting!r}")
        if self.unknown_fields not in ("keep", "refuse"):
            raise ConfigError(
                f"unknown_fields must be 'keep' or 'refuse', got {self.unknown_fields!r}"
            )
        if self.history_checks not in ("off", "strict"):
            raise ConfigError(
                f"history_checks must be 'off' or 'strict', got {self.history_checks!r}"
            )


def _positive(config: StoreConfig, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{name} must be a positive int, got {value!r:.80}")
        _at_most(name, value)


def _non_negative_int(config: StoreConfig, name: str) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be a non-negative int or None, got {value!r:.80}")
    _at_most(name, value)


def _at_most(name: str, value: int) -> None:
    """Every int the scripts take has a largest value (kvstore/_engine/bounds.py)."""
    largest = CONFIG_MAXIMA[name]
    if value > largest:
        raise ConfigError(f"{name} is {value}; at most {_size(largest)}")


def _size(value: int) -> str:
    for unit, size in (("GiB", 1024 * MiB), ("MiB", MiB)):
        if value >= size and value % size == 0:
            return f"{value // size} {unit}"
    return str(value)
