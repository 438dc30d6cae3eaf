"""The `kvstore` command line."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import IO, Any, Literal, TypeVar

import redis

from .. import errors
from . import owners
from .parser import DATA_DIR, build_parser, check_values


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so an embedded server this command started is stopped too.
    signal.signal(signal.SIGTERM, _terminate)
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Guarded(sys.stdout), _Guarded(sys.stderr)
    try:
        return _run(args)
    except _ReaderGone as gone:
        # `kvstore inspect ... | head`: end as a tool cut by SIGPIPE does, without a word (what
        # is still buffered goes nowhere, not into a traceback at exit).
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), gone.stream.fileno())
        return 128 + signal.SIGPIPE
    finally:
        sys.stdout, sys.stderr = streams


def _run(args: argparse.Namespace) -> int:
    try:
        check_values(args)
        if args.command == "demo":
            return _demo(args)
        if args.command == "server":
            return _server(args)
        if args.command == "import-from":
            return _import_from(args)
        return _store_command(args)
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


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class _ReaderGone(Exception):
    """A standard stream's reader went away (a closed pipe), as opposed to a socket's EPIPE."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__("the reader of a standard stream went away")
        self.stream = stream


class _Guarded:
    """A standard stream, with a closed pipe raised as _ReaderGone (every command prints
    through it: print() writes to sys.stdout and sys.stderr as they are when it runs)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise _ReaderGone(self._stream) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise _ReaderGone(self._stream) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _store_command(args: argparse.Namespace) -> int:
    from .commands import open_store

    threads = _named_threads(args) if args.command == "migrate" else None  # checked first
    owners.check(args)  # an owner command's owner, cursor and limit, before a server starts
    # The parser's choices are StoreConfig's; a command without the option has its default.
    checks: Literal["off", "strict"] = getattr(args, "history_checks", "off")
    with open_store(args.url, args.namespace, args.data_dir, history_checks=checks) as store:
        if args.command == "export" and args.format == "langchain":
            return _export_langchain(store, args)
        if args.command == "migrate":
            return _migrate(store, threads)
        return _STORE_COMMANDS[args.command](store, args)


def _inspect(store: Any, args: argparse.Namespace) -> int:
    from .commands import inspect

    inspect(store, args.thread, chunks=args.chunks, owner=args.owner)
    return 0


def _export_langchain(store: Any, args: argparse.Namespace) -> int:
    from .import_from import export_langchain

    written, left_out = _export_to(
        args, lambda out: export_langchain(store, args.thread, out, args.owner)
    )
    skipped = (
        f"; {left_out} left out (reasoning, events, approvals: no LangChain type)"
        if left_out
        else ""
    )
    to_file = f" to {args.output}" if args.output not in (None, "-") else ""
    print(f"exported {written} LangChain messages{to_file}{skipped}", file=sys.stderr)
    return 0


def _export(store: Any, args: argparse.Namespace) -> int:
    from . import backup

    count = _export_to(
        args,
        lambda out: backup.export(
            store, args.thread, out, every=args.progress_every, owner=args.owner
        ),
    )
    if args.output not in (None, "-"):
        print(f"exported {count} messages to {args.output}", file=sys.stderr)
    return 0


_Written = TypeVar("_Written")


def _export_to(args: argparse.Namespace, write: Callable[[IO[str]], _Written]) -> _Written:
    """`write(out)` to standard output (no -o, or -o -) or to -o's file, which it replaces
    whole or not at all: an export that fails leaves a good backup there as it was."""
    from .commands import replaced_file

    try:
        if args.output in (None, "-"):
            written = write(sys.stdout)
            sys.stdout.flush()
            return written
        with replaced_file(args.output) as out:
            return write(out)
    except KeyboardInterrupt:
        print(
            f"kvstore: export of {args.thread} interrupted: {_cut_short(args.output)}",
            file=sys.stderr,
            flush=True,
        )
        raise


def _cut_short(output: str | None) -> str:
    """What an interrupted export left at its output."""
    if output in (None, "-") or (os.path.exists(output) and not os.path.isfile(output)):
        return "the backup is incomplete"  # a stream, written as it went
    return f"{output} is left as it was" if os.path.exists(output) else "no file was written"


def _import(store: Any, args: argparse.Namespace) -> int:
    from . import backup

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
                owner=args.owner,
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
                    owner=args.owner,
                )
    except KeyboardInterrupt:
        unknown = (
            f"; the {progress.sending} being sent may or may not be" if progress.sending else ""
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
    return 0


def _fork(store: Any, args: argparse.Namespace) -> int:
    at: str | int = int(args.at) if args.at.isascii() and args.at.isdigit() else args.at
    forked = store.thread(args.thread, owner=args.owner).fork(args.new_thread, at=at)
    stats = forked.stats()
    print(
        f"forked {args.thread} at sequence {stats.fork_sequence} into {args.new_thread}:"
        f" {stats.stored_messages} messages",
        file=sys.stderr,
    )
    return 0


def _migrate(store: Any, threads: list[str] | None) -> int:
    from . import commands

    if threads is None:
        commands.migrate_all(store)
    else:
        commands.migrate_named(store, threads)
    return 0


def _health(store: Any, args: argparse.Namespace) -> int:
    report = store.health()
    print(report.model_dump_json(indent=2) if args.json else report)
    return 2 if report.warnings else 3 if report.unchecked else 0


def _preload_scripts(store: Any, args: argparse.Namespace) -> int:
    from ..admin import preload_library, preload_scripts

    library = preload_library(store.client)
    print(
        f"library {library}"
        if library
        else "library: none (the server has no functions; its stores use EVAL)"
    )
    for name, sha in preload_scripts(store.client).items():
        print(f"{sha}  {name}")
    return 0


_STORE_COMMANDS: dict[str, Callable[..., int]] = {
    "inspect": _inspect,
    "export": _export,
    "import": _import,
    "fork": _fork,
    "health": _health,
    "preload-scripts": _preload_scripts,
} | owners.COMMANDS


def _import_from(args: argparse.Namespace) -> int:
    from ..config import StoreConfig
    from ..store import MessageStore
    from .commands import connect
    from .import_from import checked_renames, import_from, read_renames

    renames = checked_renames(read_renames(args.rename, args.rename_file))  # before connecting
    source = connect(args.url)
    target = connect(args.to_url) if args.to_url is not None else source
    try:
        store = MessageStore(
            target,
            StoreConfig(
                namespace=args.namespace,
                history_checks=args.history_checks,
                thread_ttl=args.thread_ttl,
            ),
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
            renames=renames,
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
    """The message lines of a regular file (the progress total of a plain import), or None:
    those that are not blank, the last one counted with or without its newline (as the
    import reads them, so that its progress ends at N/N)."""
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as lines:
        return sum(1 for line in lines if line.strip())


def _named_threads(args: argparse.Namespace) -> list[str] | None:
    """The threads `migrate` names, or None to find them with SCAN."""
    from . import commands

    if not args.threads and args.threads_from is None:
        return None
    threads = commands.thread_ids_from(args.threads)
    if args.threads_from is not None:
        threads += commands.thread_ids_in(args.threads_from)
    return threads


def _demo(args: argparse.Namespace) -> int:
    from .commands import connect, shown_url
    from .demo import DemoOptions, run_demo
    from .server import data_dir_server

    namespace = "demo"
    if args.url is not None:
        connect(args.url).close()  # an unreachable server refused before the demo starts
        print(f"server at {shown_url(args.url)}", flush=True)
        reach = f"--namespace {namespace} --url {shown_url(args.url)}"
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
            # Without reuse the server is this process's own, started.
            assert server.embedded is not None and server.embedded.process is not None
            server.embedded.process.wait()
    except PortInUse as exc:
        raise errors.ConfigError(
            f"{exc}; give another with --port, or --port 0 for any free one"
        ) from None
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
