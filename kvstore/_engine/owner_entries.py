"""An owner's directory entries as the client reads them (docs/OWNERS.md): a listing's rows,
an owned thread's entry (``Thread.info``) and the owner fields of its stats, all from the
directory's values as lua/includes/owner.lua writes them.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .. import errors
from ..models import ThreadInfo
from .layout.keys import OwnerKeys
from .operation import Batch, Operation, ThreadRef
from .text import text as _text


def number(value: Any, what: str) -> int:
    """A score or count the directory replied (a score of a whole number of ms comes as its
    digits; anything else is RecordError)."""
    if value in (None, b"", ""):
        return 0
    try:
        try:
            return int(value)
        except ValueError:
            return int(float(value))
    except (ValueError, OverflowError):  # inf has no int
        raise errors.RecordError(f"{what} holds {value!r:.80}, not a number") from None


def entry_fields(owner: str, fields: list[Any]) -> dict[str, Any]:
    """A ThreadInfo's fields from owner_list.lua's five values of a thread (id, activity,
    creation, info, counts); a page validates them all in one call. The common reply (bytes,
    whole numbers) is read straight; anything else by _checked_record, which names what is
    wrong."""
    thread_id, activity, created, info, record = fields
    try:
        # "messages:bytes:tokens:deadline:fingerprint" (lua/includes/owner.lua)
        messages, stored, tokens, _ = record.split(b":", 3)
        row = {
            "thread_id": thread_id.decode(),
            "owner": owner,
            "title": None,
            "metadata": {},
            "created_at": int(created or 0),
            "last_activity_at": int(activity or 0),
            "messages": int(messages),
            "stored_bytes": int(stored),
            "tokens": int(tokens),
        }
    except (AttributeError, TypeError, ValueError, UnicodeDecodeError):
        return _checked_record(owner, fields)
    if info:
        row["title"], row["metadata"] = _info(row["thread_id"], info)
    return row


def _info(thread_id: str, info: Any) -> tuple[Any, Any]:
    """The title and metadata of a thread's info JSON; RecordError when it is not that."""
    try:
        decoded = json.loads(info)
    except ValueError:
        decoded = None
    if not isinstance(decoded, dict):
        raise errors.RecordError(f"the directory's info of thread {thread_id!r} is not JSON")
    title, metadata = decoded.get("title"), decoded.get("metadata") or {}
    if not (title is None or isinstance(title, str)) or not isinstance(metadata, dict):
        raise errors.RecordError(f"the directory's info of thread {thread_id!r} is malformed")
    return title, metadata


def _checked_record(owner: str, fields: list[Any]) -> dict[str, Any]:
    """entry_fields' fields from values of any shape the server may reply (str, a score with a
    fraction), or RecordError."""
    thread_id, activity, created, info, record = fields
    thread_id = _text(thread_id, "an owner's directory entry")
    title, metadata = _info(thread_id, info) if info else (None, {})
    counts: list[Any] = (
        record.split(b":" if isinstance(record, bytes) else ":", 4) if record else []
    )
    if len(counts) < 4:
        raise errors.RecordError(f"the directory's counts of thread {thread_id!r} are malformed")
    what = "an owner's thread record"
    return {
        "thread_id": thread_id,
        "owner": owner,
        "title": title,
        "metadata": metadata,
        "created_at": number(created, "a thread's creation time"),
        "last_activity_at": number(activity, "a thread's last activity"),
        "messages": number(counts[0], what),
        "stored_bytes": number(counts[1], what),
        "tokens": number(counts[2], what),
    }


def _expired(record: Any, meta_exists: Any) -> bool:
    """Whether a thread's directory record is of a thread whose keys expired: it had a deadline,
    its meta is gone, and it was written (its record has meta's fingerprint) or, listed by
    set_info alone, its deadline passed (by this machine's clock: a listing, which drops it too,
    goes by the server's)."""
    parts = _text(record).split(":", 4)
    if meta_exists or len(parts) < 4:
        return False
    deadline = number(parts[3], "an owner's thread record")
    written = len(parts) == 5 and parts[4] != ""
    return deadline > 0 and (written or deadline <= time.time() * 1000)


def directory_reads(thread: ThreadRef) -> list[tuple[Any, ...]]:
    """The reads of an owned thread's entry in its owner's directory (its last activity, its
    creation, its info, its counts, and whether its meta is there), for a Batch; none for a
    thread without an owner."""
    if thread.owner is None:
        return []
    keys = OwnerKeys.of(thread.config.namespace, thread.owner)
    tid = thread.thread_id
    return [
        ("ZSCORE", keys.recent, tid),
        ("ZSCORE", keys.created, tid),
        ("HGET", keys.info, tid),
        ("HGET", keys.usage, f"t:{tid}"),
        ("EXISTS", thread.keys.meta),
    ]


def directory_entry(thread: ThreadRef, replies: list[Any]) -> ThreadInfo | None:
    """The ThreadInfo from directory_reads' replies; None when the thread is not listed (or its
    keys expired)."""
    if thread.owner is None or not replies:
        return None
    activity, created, info, record, meta_exists = replies
    if record is None or _expired(record, meta_exists):
        return None
    try:
        return ThreadInfo.model_validate(
            entry_fields(thread.owner, [thread.thread_id, activity, created, info, record])
        )
    except ValueError as error:  # a title or metadata value no set_info writes
        raise errors.RecordError(
            f"the directory of {thread.owner!r} holds a malformed entry of"
            f" {thread.thread_id!r}: {error}"
        ) from None


def owned_stats(thread: ThreadRef, replies: list[Any]) -> dict[str, Any]:
    """ThreadStats' owner fields from directory_reads' replies (none without an owner)."""
    if thread.owner is None:
        return {}
    entry = directory_entry(thread, replies)
    if entry is None:
        return {"owner": thread.owner}
    return {
        "owner": thread.owner,
        "title": entry.title,
        "metadata": entry.metadata,
        "created_at": entry.created_at or None,
        "last_activity_at": entry.last_activity_at or None,
    }


def thread_info(thread: ThreadRef) -> Operation[ThreadInfo | None]:
    """An owned thread's entry in its owner's directory; None when it is not listed (or the
    thread has no owner, or its keys expired)."""
    if thread.owner is None:
        return None
    replies = yield Batch(directory_reads(thread))
    return directory_entry(thread, replies)
