"""The typed errors kvstore raises.

Every error a caller can act on is a subclass of :class:`KVStoreError`, and carries the HTTP
status a web backend should answer with (``http_status``). Lua scripts fail with
``KVS_<CODE> <detail>``; one table, :data:`kvstore._engine.scripts.ERROR_CODES`, maps each code to one
class here (docs/LAYOUT.md, "Errors").
"""

from __future__ import annotations

from typing import Any


class KVStoreError(Exception):
    """Base class of every error kvstore raises on purpose.

    ``http_status`` is the status a web backend should answer when the error reaches its
    handler; every class sets its own (docs/API.md, "Errors and HTTP statuses", gives the
    reasons). One handler covers them all::

        @app.exception_handler(KVStoreError)
        async def kvstore_error(request, exc):
            return JSONResponse({"detail": str(exc)}, status_code=exc.http_status)
    """

    http_status = 500

    @classmethod
    def _from_script(cls, detail: str) -> KVStoreError:
        """The error of a script's ``KVS_<CODE> <detail>`` reply; a class that carries a value
        the script sends first in the detail reads it here."""
        return cls(detail)


class ConfigError(KVStoreError, ValueError):
    """A StoreConfig value is out of range or inconsistent."""

    http_status = 500


class InvalidThreadId(KVStoreError, ValueError):
    """A thread id is empty, too long, or holds characters that could break its key tag."""

    http_status = 400


class InvalidOwnerId(KVStoreError, ValueError):
    """An owner id is empty, too long, or holds characters a thread id may not hold."""

    http_status = 400


class QuotaExceeded(KVStoreError):
    """A write would pass its owner's quota of threads or of messages a minute
    (``store.set_owner_quota``); nothing was written. Try again later, or raise the quota."""

    http_status = 429


class StorageQuotaExceeded(QuotaExceeded):
    """A write would pass its owner's quota of stored bytes; nothing was written. Delete or
    compact some of the owner's threads, or raise the quota."""

    http_status = 413


class OwnerErasing(KVStoreError):
    """The thread's owner is being erased (``store.erase_owner``): writes are refused until
    the erasure finishes; nothing was written."""

    http_status = 409


class InvalidMessage(KVStoreError, ValueError):
    """A message failed validation (wraps pydantic's ValidationError, naming the field)."""

    http_status = 422


class RoleBasedMessage(InvalidMessage):
    """A role-based chat message (OpenAI's ``{"role": "user", "content": "hi"}``) was given where
    a kvstore message is expected; kvstore messages name their type in ``message_type``.
    ``kvstore.convert.from_chat_completions(...)`` converts chat messages."""

    http_status = 422


class UnknownField(InvalidMessage):
    """A message holds fields kvstore does not know, and the store was made with
    ``StoreConfig(unknown_fields="refuse")``; nothing was written. `fields` lists their paths
    (``content[0].colour``), each with a hint (a known field it may be a misspelling of)."""

    http_status = 422

    fields: list[str] = []  # noqa: RUF012 (replaced, never mutated, by the raiser)


class InvalidCursor(KVStoreError, ValueError):
    """A paging cursor or limit is malformed or out of range."""

    http_status = 400


class InlineMediaTooLarge(InvalidMessage):
    """One inline media part is larger than ``max_inline_part_bytes``."""

    http_status = 413


class InlineMediaBudget(KVStoreError):
    """The thread's inline media budget has `available` bytes left.

    The store handles it itself (it replaces the incoming message's own inline parts and sends
    the call again); it reaches callers only through the low-level core.
    """

    http_status = 413

    def __init__(self, available: int) -> None:
        super().__init__(f"{available} bytes of inline media are left in the thread")
        self.available = available

    @classmethod
    def _from_script(cls, detail: str) -> InlineMediaBudget:
        return cls(int(detail.split(" ", 1)[0]))


class ThreadDeleting(KVStoreError):
    """A write met a thread that an interrupted ``delete()`` left half-deleted; nothing was written.

    The store handles it itself (it finishes the deletion and sends the write again, to the now
    empty thread); it reaches callers only through the low-level core.
    """

    http_status = 409


class MessageTooLarge(KVStoreError, ValueError):
    """One encoded message is larger than ``max_message_bytes``; nothing was written."""

    http_status = 413


class BatchTooLarge(KVStoreError, ValueError):
    """One append call carries more messages or bytes than a single call may move."""

    http_status = 413


class RecordError(KVStoreError):
    """A stored record could not be decoded (malformed bytes, nesting bomb, unknown version, an
    invalid message); `sequence` is the record's sequence. Page reads skip such a record and list
    it in ``MessagesPage.unreadable``; ``get`` of it raises this."""

    http_status = 500

    sequence: int | None = None


class OtidConflict(KVStoreError):
    """A batch mixes stored and new otids (or its otids are all stored and its messages without
    one are new), or repeats an otid (:class:`OtidRepeated`); nothing was written.

    A mix is part of a batch already stored: ``get_by_otid`` finds those messages; send the
    others alone."""

    http_status = 409


class OtidRepeated(OtidConflict):
    """One otid appears twice in the batch; nothing was written. The batch itself is wrong: no
    state of the thread makes it valid."""

    http_status = 422


class DuplicateMessageId(KVStoreError):
    """A message id given by the caller is already stored in the thread while others of the
    batch are not, or the batch repeats an id (:class:`MessageIdRepeated`); nothing was written.

    (A batch whose ids are all stored is a replay, not refused.)"""

    http_status = 409


class MessageIdRepeated(DuplicateMessageId):
    """One message id appears twice in the batch; nothing was written. The batch itself is
    wrong: no state of the thread makes it valid."""

    http_status = 422


class InvalidSummaryRange(KVStoreError, ValueError):
    """``compact``'s `last_sequence` is not one the summary may cover; nothing was written.

    It must be a positive int no later than the thread's last sequence, and not before the
    current summary's last sequence: summaries only move forward. Another compaction that
    reached further first refuses this one (read ``stats().summary_last_sequence``), and so
    does a tool call just after the current summary's range whose answer comes after
    `last_sequence` (moving back to keep the pair whole leaves nothing new to summarize:
    summarize through the answer)."""

    http_status = 409


class MessageNotFound(KVStoreError, LookupError):
    """No stored message has that id (or it was deleted by retention)."""

    http_status = 404


class CursorExpired(MessageNotFound):
    """A paging cursor names a message that is no longer stored, and retention has deleted
    messages: it may have been one of them. `deleted_before_sequence` is the oldest kept
    sequence; page on with a sequence cursor (``MessagesPage.next_cursor``), which never expires.
    """

    http_status = 410

    def __init__(self, message: str, deleted_before_sequence: int) -> None:
        super().__init__(message)
        self.deleted_before_sequence = deleted_before_sequence

    @classmethod
    def _from_script(cls, detail: str) -> CursorExpired:
        deleted_before, _, message = detail.partition(" ")
        return cls(message, int(deleted_before))


class TurnNotFound(KVStoreError, LookupError):
    """No turn with that id is open in the thread."""

    http_status = 404


class TurnFinished(KVStoreError):
    """The turn was finished: its result is recorded and it takes no new message; nothing was
    written. (A retried append of a message already stored is a replay, not refused.)"""

    http_status = 409


class TurnFenced(KVStoreError):
    """Another worker holds the turn now (a newer lease, from ``thread.hold_turn``): this
    producer's delta or message for it was refused and nothing was written. The producer should
    stop working on the turn."""

    http_status = 409


class HistoryConflict(KVStoreError):
    """With ``StoreConfig(history_checks="strict")``: the write would break the thread's tool
    call pairs (an answer to a call or approval request that is not open, a replacement that
    changes what a message opens or answers, a turn removal that would orphan a later answer).
    Nothing was written; the detail names the message and the call."""

    http_status = 409


class OutcomeUnknown(KVStoreError):
    """The write may or may not have happened: the call may have reached the server, and what
    followed failed (the connection, or a read of the call's result).

    For an append (and a compact), `messages` holds the messages exactly as sent, with the ids
    the client gave them; append also set those ids on the caller's own messages. Re-sending
    `messages`, or the same message objects, or the same messages with the same otids, stores
    nothing twice.

    For a hold_turn or a publish, `call_id` is the call's id: the same call again with
    ``call_id=`` that id holds or publishes once, and answers what the first run answered.
    """

    http_status = 503

    # kvstore.messages.Message objects (not imported here: kvstore.messages imports this module).
    messages: list[Any] | None = None
    call_id: str | None = None


class NotDurable(KVStoreError):
    """The write happened, but the durability the store asks for was not confirmed in time.

    The data is on the server; it may be lost if the server (or, for "replicated", the primary)
    fails before it is fsynced or replicated. Re-sending the same call stores nothing twice.
    """

    http_status = 503


class LayoutError(KVStoreError):
    """The thread's keys hold something kvstore did not write (wrong type, unknown layout)."""

    http_status = 500


class MalformedChunk(RecordError, LayoutError):
    """A chunk's manifest does not frame its records (a line that does not parse, or sizes that
    do not add up to the records): the thread's keys hold something kvstore did not write, so it
    is a :class:`LayoutError` as much as a :class:`RecordError`, and either catches it."""

    http_status = 500


class DataDirInUse(KVStoreError):
    """Another process owns the embedded server's data dir (see kvstore/cli/server.py)."""

    http_status = 500


class MigrationPending(LayoutError):
    """A layout-1 thread must take migration steps before this call can run.

    Writes that give a message a sequence wait for the scan that finds the thread's legacy range
    (docs/LAYOUT.md); the store runs the steps and sends the call again itself.
    """

    http_status = 503


class PermissionDenied(KVStoreError):
    """The server refused a command for this user (ACL)."""

    http_status = 500


class ServerError(KVStoreError):
    """The server answered with an error kvstore does not know how to name, or could not be
    reached for a read."""

    http_status = 502


class ConnectionFailed(ServerError):
    """No connection to the server could be used, so the call was never sent: the connection
    was refused or timed out while opening, or the client's connection pool had none free.
    Nothing was written; the call may be sent again as it is."""

    http_status = 503


class SourceChanged(KVStoreError):
    """A source session is not what an earlier import stored from it: it was cleared and
    refilled, edited or cut since, or the thread holds messages that are not the session's.
    Nothing of the session was written. Import it into a fresh thread id (``thread_id=``, or
    the CLI's ``--namespace``), or delete the thread to import the session as it is now."""

    http_status = 409


class RestoreConflict(KVStoreError):
    """A restore met a thread that holds other messages where the backup puts its own (a
    sequence taken, an id or otid stored at another sequence, sequences past the backup's
    last): nothing was written. Restore into an empty thread, or into the one this backup was
    partly restored into."""

    http_status = 409


class BackupIncomplete(InvalidMessage):
    """A backup file that does not prove it is whole: its end line (the count and checksum of
    every line before it) is missing or does not match the file, or lines follow it. The restore
    was not finished (the thread refuses writes: ``RestoreIncomplete``); import the whole file to
    finish it."""

    http_status = 422


class RestoreIncomplete(KVStoreError):
    """A write met a thread whose restore (``kvstore import``, or a fork) has not finished:
    nothing was written. Run the same import or fork again to finish it (or ``delete()`` the
    thread); only its last step makes the thread writable."""

    http_status = 409
