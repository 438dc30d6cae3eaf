"""Threads that belong to an owner (docs/OWNERS.md): the listing, a thread's title and metadata,
the owner's usage and quotas, and its erasure.

An owned thread lives in its owner's hash slot, beside the owner's directory (OwnerKeys), so
every write keeps the directory right in its own atomic step (lua/includes/owner.lua wraps every
writing script). The operations here are the owner's own scripts: lua/owner_*.lua.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from .. import errors
from ..config import StoreConfig
from ..models import ErasureReceipt, OwnerUsage, ThreadsPage
from .layout.keys import OwnerKeys, check_owner_id, check_thread_id
from .lifecycle import delete
from .operation import MAX_LIMIT, Batch, Eval, Operation, ThreadRef
from .owner_entries import entry_fields, number
from .replies import stored_int
from .scripts import SCRIPTS
from .text import sendable
from .text import text as _text

ListOrder = Literal["recent", "created"]

MAX_TITLE_LENGTH = 200
MAX_METADATA_KEYS = 16
MAX_METADATA_KEY_LENGTH = 64
MAX_METADATA_VALUE_LENGTH = 512
# The most threads one listing call looks at: a filtered page may come back short.
MAX_EXAMINED = 1000
# The most threads one erasure step names.
ERASE_STEP = 16


def check_title(title: Any) -> str:
    """`title` if a thread can carry it (a str of at most 200 characters), else InvalidMessage."""
    if not isinstance(title, str) or len(title) > MAX_TITLE_LENGTH or not sendable(title):
        raise errors.InvalidMessage(
            f"a thread's title must be a str of at most {MAX_TITLE_LENGTH} characters"
            " (UTF-8: no lone surrogate)"
        )
    return title


def check_metadata(metadata: Any) -> str:
    """`metadata` as the JSON object the directory stores, if it is a small map of str to str
    (at most 16 keys of 1-64 characters, values of at most 512), else InvalidMessage."""
    if not isinstance(metadata, Mapping) or len(metadata) > MAX_METADATA_KEYS:
        raise errors.InvalidMessage(
            f"a thread's metadata must be a mapping of at most {MAX_METADATA_KEYS} keys"
        )
    for key, value in metadata.items():
        if (
            not isinstance(key, str)
            or not 1 <= len(key) <= MAX_METADATA_KEY_LENGTH
            or not sendable(key)
        ):
            raise errors.InvalidMessage(
                f"metadata key {key!r:.80} must be a str of 1-{MAX_METADATA_KEY_LENGTH} characters"
                " (UTF-8: no lone surrogate)"
            )
        if (
            not isinstance(value, str)
            or len(value) > MAX_METADATA_VALUE_LENGTH
            or not sendable(value)
        ):
            raise errors.InvalidMessage(
                f"metadata value of {key!r} must be a str of at most"
                f" {MAX_METADATA_VALUE_LENGTH} characters (UTF-8: no lone surrogate)"
            )
    # Lua's JSON encoder writes an empty table as {}, so an empty map round-trips as one.
    return json.dumps(dict(metadata), ensure_ascii=False, separators=(",", ":"))


def _owner_keys(config: StoreConfig, owner: str) -> tuple[str, ...]:
    return OwnerKeys.of(config.namespace, owner).script_keys()


# A cursor's score: the ms time of a thread's activity or creation, as its digits.
_SCORE = re.compile(r"[0-9]{1,16}")


def _cursor(order: str, after: Any) -> tuple[str, str]:
    """The score and thread id of a next_cursor of a listing in `order`, else InvalidCursor."""
    if after is None:
        return "", ""
    if not isinstance(after, str):
        raise errors.InvalidCursor("a threads cursor is the str a page's next_cursor gave")
    kind, _, rest = after.partition(":")
    score, _, thread_id = rest.partition(":")
    try:
        check_thread_id(thread_id)
    except errors.InvalidThreadId:
        thread_id = ""
    if kind != order or not _SCORE.fullmatch(score) or int(score) > 2**53 or not thread_id:
        raise errors.InvalidCursor(
            f"cursor {after!r:.80} is not a next_cursor of a listing in order {order!r}"
        )
    return str(int(score)), thread_id


def _where(where: Any) -> tuple[str, str]:
    """The metadata key and value of a listing's filter ("", "" for none), else InvalidMessage."""
    if where is None:
        return "", ""
    if not isinstance(where, Mapping):
        raise errors.InvalidMessage(
            f"where= is a mapping of one metadata key to its value, not {type(where).__name__}"
        )
    if not where:
        return "", ""
    if len(where) != 1:
        raise errors.InvalidMessage("where= names one metadata key and its value")
    check_metadata(where)
    ((key, value),) = where.items()
    return key, value


def listing(
    owner: Any, order: Any = "recent", after: Any = None, limit: Any = 50, where: Any = None
) -> dict[str, Any]:
    """owner_list.lua's arguments of a listing, every one checked before anything is sent:
    InvalidOwnerId, InvalidCursor (order, after, limit) or InvalidMessage (where)."""
    check_owner_id(owner)
    if not isinstance(order, str) or order not in ("recent", "created"):
        raise errors.InvalidCursor(f"order must be 'recent' or 'created', not {order!r:.80}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise errors.InvalidCursor(f"limit must be an int of 1-{MAX_LIMIT}, not {limit!r:.80}")
    where_key, where_value = _where(where)
    score, thread_id = _cursor(order, after)
    return {
        "order": order,
        "after_score": score,
        "after_id": thread_id,
        "limit": limit,
        "where_key": where_key,
        "where_value": where_value,
        "max_examined": MAX_EXAMINED,
    }


def list_threads(
    config: StoreConfig,
    owner: str,
    order: ListOrder = "recent",
    after: str | None = None,
    limit: int = 50,
    where: Mapping[str, str] | None = None,
) -> Operation[ThreadsPage]:
    """A page of `owner`'s threads, most recent activity (or newest made) first."""
    arguments = listing(owner, order, after, limit, where)
    reply = yield Eval(
        SCRIPTS["owner_list"], _owner_keys(config, owner), SCRIPTS["owner_list"].args(**arguments)
    )
    if not isinstance(reply, list) or len(reply) < 2 or (len(reply) - 2) % 5:
        raise errors.ServerError(f"script owner_list.lua replied {reply!r:.200}")
    threads = [entry_fields(owner, reply[i : i + 5]) for i in range(2, len(reply), 5)]
    next_score = _text(reply[0])
    cursor = None
    if next_score:
        cursor = f"{order}:{number(next_score, 'a cursor score')}:{_text(reply[1])}"
    try:
        return ThreadsPage.model_validate({"threads": threads, "next_cursor": cursor})
    except ValueError as error:  # a title or metadata value no set_info writes
        raise errors.RecordError(
            f"the directory of {owner!r} holds a malformed entry: {error}"
        ) from None


def set_info(
    thread: ThreadRef, title: str | None = None, metadata: Mapping[str, str] | None = None
) -> Operation[bool]:
    """Sets an owned thread's title and/or metadata; lists it if it was not listed yet. True
    when this call listed it."""
    if thread.owner is None:
        raise errors.InvalidMessage("only a thread with an owner has a title and metadata")
    metadata_json = check_metadata(metadata) if metadata is not None else ""
    reply = yield Eval(
        SCRIPTS["owner_info"],
        _owner_keys(thread.config, thread.owner),
        SCRIPTS["owner_info"].args(
            thread_id=thread.thread_id,
            title_set=0 if title is None else 1,
            title="" if title is None else check_title(title),
            metadata_set=0 if metadata is None else 1,
            metadata=metadata_json,
            ttl_ms=(thread.config.thread_ttl or 0) * 1000,
        ),
    )
    return bool(reply == 1)


def _usage(owner: str, reply: Any) -> OwnerUsage:
    if not isinstance(reply, list) or len(reply) != 8:
        raise errors.ServerError(f"script owner_usage.lua replied {reply!r:.200}")
    values = [stored_int(v, "an owner's usage") for v in reply]
    return OwnerUsage(
        owner=owner,
        threads=values[0],
        messages=values[1],
        stored_bytes=values[2],
        tokens=values[3],
        max_threads=values[4] or None,
        max_bytes=values[5] or None,
        max_messages_per_minute=values[6] or None,
        erasing=bool(values[7]),
    )


def owner_usage(
    config: StoreConfig, owner: str, quotas: tuple[int, int, int] | None = None
) -> Operation[OwnerUsage]:
    """The owner's usage and quotas; with `quotas` (threads, bytes, messages a minute; 0 none,
    -1 keep), sets them first."""
    script = SCRIPTS["owner_usage"]
    mode, (threads, stored, per_minute) = ("quota", quotas) if quotas else ("read", (-1, -1, -1))
    reply = yield Eval(
        script,
        _owner_keys(config, owner),
        script.args(mode=mode, max_threads=threads, max_bytes=stored, max_per_minute=per_minute),
    )
    return _usage(owner, reply)


def quota_value(value: int | None, what: str) -> int:
    """A quota as owner_usage.lua takes it: 0 for none."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**53:
        raise errors.ConfigError(f"{what} must be a positive int, or None for no quota")
    return value


def erase_owner(
    config: StoreConfig, owner: str, count_tokens: Any = None
) -> Operation[ErasureReceipt]:
    """Deletes every thread of `owner` and then the owner's own keys, in bounded steps; stopped
    anywhere and run again, it goes on. Returns the receipt of the whole erasure."""
    script = SCRIPTS["owner_erase"]
    keys = _owner_keys(config, owner)
    while True:
        reply = yield Eval(script, keys, script.args(step=ERASE_STEP))
        if not isinstance(reply, list) or len(reply) < 3:
            raise errors.ServerError(f"script owner_erase.lua replied {reply!r:.200}")
        done, threads, messages = (stored_int(v, "an erasure's count") for v in reply[:3])
        if done:
            return ErasureReceipt(owner=owner, threads=threads, messages=messages)
        for thread_id in reply[3:]:
            try:
                thread = ThreadRef.of(config, _text(thread_id), count_tokens, owner)
            except (errors.InvalidThreadId, errors.RecordError):
                # Something else wrote it (not even UTF-8, perhaps), and no thread's keys can
                # carry it: only the entry goes.
                yield Batch(_entry_removal(keys, thread_id))
                continue
            yield from delete(thread)


def _entry_removal(keys: tuple[str, ...], entry: bytes | str) -> list[tuple[Any, ...]]:
    """The commands that take `entry` out of an owner's directory (`keys`: recent, created,
    info, usage): its index members, its info and its usage record."""
    recent, created, info, usage = keys
    record = b"t:" + entry if isinstance(entry, bytes) else "t:" + entry
    return [
        ("ZREM", recent, entry),
        ("ZREM", created, entry),
        ("HDEL", info, entry),
        ("HDEL", usage, record),
    ]
