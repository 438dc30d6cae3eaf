"""The operator's surface: what `kvstore inspect`, `export`, `import`, `migrate`, `health` and
`preload` need beyond the public API, on a sync :class:`~kvstore.MessageStore` or a client.

Each call takes the store and a thread id (and, keyword only, the thread's ``owner``: an owned
thread's keys are its owner's) and runs the engine's operations on the store's own client; none
of them knows how a thread is laid out (kvstore/_engine/layout/ does).

Inspecting
    :func:`presence` (a :class:`Presence`: is the thread there, is it in layout 1),
    :func:`containers` (a :class:`Containers`: meta's fields, the window, the counts of chunks
    and oversized messages), :func:`chunk_entries` and :func:`oversized_entries` (every index
    member, a :class:`ChunkEntry` or :class:`LargeEntry`, in order, read a page at a time), and
    :func:`layout_1_threads` and :func:`unmigrated_threads` (SCAN for the threads not yet
    migrated: needs +scan); :data:`CURRENT_LAYOUT`, the layout every write leaves.

Backing up and restoring (docs/LAYOUT.md, "Backup and restore")
    :func:`backup_state` (a thread's state apart from its messages), :func:`pages` (every kept
    message, a page at a time), :func:`stored_tokens` (the stored count of each message),
    :func:`stored_ids`, :func:`check_restore_target`, :func:`restore_run` (after
    :func:`restore_runs` cut the messages) and :func:`restore_state`, with the types a backup
    is made of: :class:`BackupState`, :class:`TurnRecord`, :class:`BackedUpMessage`; and
    :func:`restore_incarnation`, the thread's incarnation a restore's calls pass (``born=``) so
    that none writes into a thread deleted, erased or made again since its first step.

Checking input
    :func:`check_thread_id`, :func:`checked_tokens`, :func:`check_token` (a message id, otid
    or turn id as append takes it), :func:`check_restorable` (a message as the store's limits
    take it), :func:`check_title` and :func:`check_metadata` (an owned thread's title and
    metadata as ``set_info`` takes them), :data:`LEADING_SYSTEM_LIMIT` (the most messages a
    kept prompt holds).

The server
    :func:`health` / :func:`health_async` read the server's settings kvstore's guarantees depend
    on (a :class:`HealthReport`; also ``store.health()``); :func:`preload_library` and
    :func:`preload_scripts` load kvstore's function library and scripts as an admin user, for
    deployments whose application user may not load scripts (FUNCTION LOAD, EVAL).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import redis

from . import errors
from ._engine.backup import BackedUpMessage, BackupState, restore_runs
from ._engine.backup import backup_state as _backup_state
from ._engine.backup import check_restore_target as _check_restore_target
from ._engine.backup import restore_incarnation as _restore_incarnation
from ._engine.backup import restore_run as _restore_run
from ._engine.backup import restore_state as _restore_state
from ._engine.backup import stored_ids as _stored_ids
from ._engine.health import health, health_async
from ._engine.health_report import HealthReport
from ._engine.layout import CURRENT, survey
from ._engine.layout.formats import ChunkEntry, LargeEntry, TurnRecord
from ._engine.layout.keys import (
    check_thread_id,
    legacy_pattern,
    meta_pattern,
    thread_of_legacy_key,
    thread_of_meta_key,
)
from ._engine.layout.survey import Containers, Presence
from ._engine.operation import ThreadRef
from ._engine.owners import check_metadata, check_title
from ._engine.pages import pages as _pages
from ._engine.prepare import PreparedMessage, check_token
from ._engine.reads import stored_tokens as _stored_tokens
from ._engine.scripts import LIBRARY, SCRIPTS
from ._engine.system_prompt import LEADING_SYSTEM_LIMIT as _LEADING_SYSTEM_LIMIT
from ._engine.tokens import checked_tokens
from .models import MessagesPage

if TYPE_CHECKING:
    from .store import MessageStore

__all__ = [
    "CURRENT_LAYOUT",
    "LEADING_SYSTEM_LIMIT",
    "BackedUpMessage",
    "BackupState",
    "ChunkEntry",
    "Containers",
    "HealthReport",
    "LargeEntry",
    "Presence",
    "TurnRecord",
    "backup_state",
    "check_metadata",
    "check_restorable",
    "check_restore_target",
    "check_thread_id",
    "check_title",
    "check_token",
    "checked_tokens",
    "chunk_entries",
    "containers",
    "health",
    "health_async",
    "layout_1_threads",
    "oversized_entries",
    "pages",
    "preload_library",
    "preload_scripts",
    "presence",
    "restore_incarnation",
    "restore_run",
    "restore_runs",
    "restore_state",
    "stored_ids",
    "stored_tokens",
    "unmigrated_threads",
]


CURRENT_LAYOUT = CURRENT
"""The layout every write leaves a thread in: `kvstore migrate` moves older threads to it."""

LEADING_SYSTEM_LIMIT = _LEADING_SYSTEM_LIMIT
"""The most system messages a thread's kept prompt holds (a restore refuses more)."""


def check_restorable(store: MessageStore, message: Any, tokens: int | None, what: str) -> None:
    """Refuses a message the store's limits would refuse in an append (InvalidMessage,
    MessageTooLarge …), before a restore writes anything; `what` names it in the error."""
    PreparedMessage.of(store.config, message, None, None, what, tokens)


def _ref(store: MessageStore, thread_id: str, owner: str | None = None) -> ThreadRef:
    return ThreadRef.of(store.config, thread_id, owner=owner)


def presence(store: MessageStore, thread_id: str, *, owner: str | None = None) -> Presence:
    """Whether the thread has a meta hash, and whether it holds a layout-1 legacy hash."""
    found: Presence = store.run(survey.presence(_ref(store, thread_id, owner)))
    return found


def containers(store: MessageStore, thread_id: str, *, owner: str | None = None) -> Containers:
    """The thread's meta fields, window and container counts, in one round trip."""
    found: Containers = store.run(survey.containers(_ref(store, thread_id, owner)))
    return found


def chunk_entries(
    store: MessageStore, thread_id: str, *, owner: str | None = None
) -> Iterator[ChunkEntry]:
    """Every chunk index member of the thread, oldest first, read a page at a time."""
    return survey.entries(store.run, _ref(store, thread_id, owner), oversized=False)


def oversized_entries(
    store: MessageStore, thread_id: str, *, owner: str | None = None
) -> Iterator[LargeEntry]:
    """Every oversized message's index member, oldest first, read a page at a time."""
    return survey.entries(store.run, _ref(store, thread_id, owner), oversized=True)


def layout_1_threads(store: MessageStore) -> list[str]:
    """Thread ids of the namespace that still hold a layout-1 legacy hash (SCAN, no KEYS).

    The operator's path: SCAN needs +scan, which the app user's ACL does not grant (it would list
    every namespace's keys): PermissionDenied then.
    """
    namespace = store.config.namespace
    keys = _scan(store, legacy_pattern(namespace))
    return sorted(thread_of_legacy_key(namespace, key) for key in keys)


def unmigrated_threads(store: MessageStore) -> list[str]:
    """Thread ids of the namespace that `migrate` has work on: a layout-1 legacy hash, or not in
    the current layout, or a window left (SCAN, no KEYS; then one read per thread found)."""
    namespace = store.config.namespace
    found = {
        thread_of_legacy_key(namespace, key) for key in _scan(store, legacy_pattern(namespace))
    }
    found.update(
        thread_of_meta_key(namespace, key) for key in _scan(store, meta_pattern(namespace))
    )
    return sorted(t for t in found if not presence(store, t).current)


def _scan(store: MessageStore, pattern: str) -> list[Any]:
    try:
        return list(store.client.scan_iter(match=pattern, count=1000))
    except redis.exceptions.NoPermissionError:
        raise errors.PermissionDenied(
            "finding the threads to migrate needs SCAN, which this user may not run: name the"
            " threads (kvstore migrate THREAD ... or --threads-from FILE), or run it as an admin"
            " user with +scan"
        ) from None


def backup_state(store: MessageStore, thread_id: str, *, owner: str | None = None) -> BackupState:
    """The thread's state apart from its messages (LayoutError for a layout-1 thread)."""
    state: BackupState = store.run(_backup_state(_ref(store, thread_id, owner)))
    return state


def pages(
    store: MessageStore, thread_id: str, *, owner: str | None = None
) -> Iterator[MessagesPage]:
    """Every kept message of the thread, oldest first, a page at a time."""
    return store.stream(_pages(_ref(store, thread_id, owner)))


def stored_tokens(
    store: MessageStore, thread_id: str, sequences: list[int], *, owner: str | None = None
) -> dict[int, int]:
    """The stored token count of each of these sequences that is stored."""
    counts: dict[int, int] = store.run(_stored_tokens(_ref(store, thread_id, owner), sequences))
    return counts


def stored_ids(
    store: MessageStore, thread_id: str, ids: list[str], *, owner: str | None = None
) -> dict[str, int]:
    """Which of `ids` the thread holds, with their sequences."""
    found: dict[str, int] = store.run(_stored_ids(_ref(store, thread_id, owner), ids))
    return found


def check_restore_target(
    store: MessageStore, thread_id: str, first: BackedUpMessage, *, owner: str | None = None
) -> None:
    """RestoreConflict unless the thread is empty or a partial restore of this backup."""
    store.run(_check_restore_target(_ref(store, thread_id, owner), first))


def restore_incarnation(
    store: MessageStore, thread_id: str, *, owner: str | None = None, mid_restore: bool = False
) -> str | None:
    """The thread's incarnation, for a restore's calls to pass as ``born``: read before the
    first run, the thread's (None: no thread yet, read it again after the first run with
    `mid_restore`; '': a thread made before kvstore kept it, which is not checked). With
    `mid_restore`, RestoreConflict unless the thread is mid-restore (deleted, its owner erased
    or made again since that run)."""
    born: str | None = store.run(_restore_incarnation(_ref(store, thread_id, owner), mid_restore))
    return born


def restore_run(
    store: MessageStore,
    thread_id: str,
    run: list[BackedUpMessage],
    *,
    owner: str | None = None,
    born: str = "",
) -> tuple[int, int]:
    """Restores one run of restore_runs at its sequences: (restored now, already stored).
    `born` (restore_incarnation's; '' for any): RestoreConflict, nothing written, when the
    thread is another incarnation."""
    restored: tuple[int, int] = store.run(_restore_run(_ref(store, thread_id, owner), run, born))
    return restored


def restore_state(
    store: MessageStore,
    thread_id: str,
    state: BackupState,
    *,
    owner: str | None = None,
    born: str = "",
) -> None:
    """Sets the thread's state as the backup recorded it; the restore's last step. `born` as
    for restore_run: a thread of another incarnation is refused (RestoreConflict), never
    finished."""
    store.run(_restore_state(_ref(store, thread_id, owner), state, born=born))


def preload_library(client: Any) -> str | None:
    """Loads kvstore's function library (FUNCTION LOAD); returns its name, or None where the
    server knows no functions (its stores use the EVAL path).

    For deployments whose application user may not run FUNCTION LOAD: an operator runs this as
    an admin user once per kvstore version (the name carries the digest of its source) and after
    a FUNCTION FLUSH or a restart that lost the data. Functions are saved with the data (RDB,
    AOF) and replicated, so a restart with persistence and a failover keep them.
    """
    try:
        name = client.function_load(LIBRARY.source)
    except redis.exceptions.NoPermissionError as exc:
        raise errors.PermissionDenied(
            f"this user may not load kvstore's function library: {exc}"
        ) from None
    except redis.ResponseError as exc:
        if "already exists" in str(exc):
            return LIBRARY.name
        if str(exc).lower().startswith("unknown"):
            return None
        raise
    name = name.decode() if isinstance(name, bytes) else str(name)
    if name != LIBRARY.name:
        raise errors.ServerError(
            f"the server loaded the library as {name}, kvstore named it {LIBRARY.name}"
        )
    return name


def preload_scripts(client: Any) -> dict[str, str]:
    """Loads every kvstore script into the server's script cache; returns name -> SHA.

    The EVAL path's scripts (scripting="eval", cluster clients, servers without functions), for
    deployments whose application user may not run EVAL: an operator runs this as an admin user
    after every server start, failover or SCRIPT FLUSH (the cache is neither persisted nor
    replicated). On a cluster, run it against every primary. The SHAs are
    kvstore._engine.scripts.SCRIPTS[name].sha.
    """
    loaded: dict[str, str] = {}
    for name, script in SCRIPTS.items():
        sha = client.script_load(script.source)
        sha = sha.decode() if isinstance(sha, bytes) else str(sha)
        if sha != script.sha:
            raise errors.ServerError(
                f"the server hashed {name}.lua to {sha}, kvstore to {script.sha}"
            )
        loaded[name] = sha
    return loaded
