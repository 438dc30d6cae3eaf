"""The sans-IO core: every operation as a generator of requests; the engine's one entry point.

An operation yields :class:`Eval` (one script call) or :class:`Batch` (native commands sent in
one round trip) and receives the reply; it returns the result. The sync and async stores are
executors that drive these generators over a client, so both share one implementation of every
operation: keys and arguments are built in the core, replies are parsed there (a writing
script's reply is decoded by name in kvstore/_engine/replies.py).

The operations live by concern; this module names them for the rest of the code:

- operation.py: the requests, ThreadRef, shared limits, the writing-script call, finishing_deletes
- prepare.py: PreparedMessage, prepare_batch, fit_media: every limit, before the socket
- append.py: append, start_turn, finish_turn
- layout/: the stored layout (keys, formats, the page plans, the one container reader, where
  records are decoded), asked by every read below
- reads.py: messages by sequence, id or otid; the consistent read (read_range)
- pages.py: list_page and its walk, list_dicts (the same page as dicts), the one page loop
  (pages)
- budget.py: a budgeted context planned from stored token counts
- views.py: stats, snapshot, the history part of context
- system_prompt.py: context (the thread's leading system messages, then views.py's)
- lifecycle.py: compact, replace, remove_turn, delete, migrate
- fork.py: fork (a new thread holding a thread's history up to a message)
- backup.py: backup_state, restore_run(s), restore_state: a thread's backup and its restore
- held_turns.py: hold_turn, renew_turn, expire_turn, publish; event_stream.py: watch
"""

from .append import append, finish_turn, start_turn
from .backup import (
    BackedUpMessage,
    BackupState,
    backup_state,
    check_restore_target,
    restore_run,
    restore_runs,
    restore_state,
    stored_ids,
)
from .event_stream import watch
from .fork import fork
from .held_turns import expire_turn, hold_turn, publish, renew_turn
from .layout.formats import TurnRecord
from .layout.keys import ThreadKeys
from .lifecycle import compact, delete, migrate, remove_turn, replace
from .operation import (
    DELETE_STEP,
    ITER_PAGE,
    MAX_LIMIT,
    SNAPSHOT_SIZE,
    Batch,
    Cursor,
    Eval,
    Operation,
    ThreadRef,
    finishing_deletes,
)
from .pages import DictsPage, gathering, list_dicts, list_page, pages
from .prepare import PreparedMessage, fit_media, prepare_batch
from .reads import fetch_sequences, get, get_by_otid, stored_tokens
from .system_prompt import context, context_dicts
from .views import snapshot, stats

__all__ = [
    "DELETE_STEP",
    "ITER_PAGE",
    "MAX_LIMIT",
    "SNAPSHOT_SIZE",
    "BackedUpMessage",
    "BackupState",
    "Batch",
    "Cursor",
    "DictsPage",
    "Eval",
    "Operation",
    "PreparedMessage",
    "ThreadKeys",
    "ThreadRef",
    "TurnRecord",
    "append",
    "backup_state",
    "check_restore_target",
    "compact",
    "context",
    "context_dicts",
    "delete",
    "expire_turn",
    "fetch_sequences",
    "finish_turn",
    "finishing_deletes",
    "fit_media",
    "fork",
    "gathering",
    "get",
    "get_by_otid",
    "hold_turn",
    "list_dicts",
    "list_page",
    "migrate",
    "pages",
    "prepare_batch",
    "publish",
    "remove_turn",
    "renew_turn",
    "replace",
    "restore_run",
    "restore_runs",
    "restore_state",
    "snapshot",
    "start_turn",
    "stats",
    "stored_ids",
    "stored_tokens",
    "watch",
]
