"""The `kvstore` command line."""

from __future__ import annotations

import argparse
import sys
import uuid

from . import errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvstore", description="Chat and agent conversations in Redis or Valkey.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run worker processes holding chats on shared threads")
    demo.add_argument("--url", help="a Redis/Valkey URL; without it the embedded Valkey server runs")
    demo.add_argument("--workers", type=int, default=4)
    demo.add_argument("--threads", type=int, default=8)
    demo.add_argument("--turns", type=int, default=400, help="turns per worker")
    demo.add_argument("--data-dir", default=".kvstore-data", help="embedded server data directory")

    server = commands.add_parser("server", help="run the embedded Valkey server in the foreground")
    server.add_argument("--data-dir", default=".kvstore-data")
    server.add_argument("--port", type=int, default=None)

    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args)
        return _server(args)
    except errors.KVStoreError as exc:
        print(f"kvstore: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _demo(args: argparse.Namespace) -> int:
    from ._demo import DemoOptions, run_demo
    from ._embedded import EmbeddedServer

    namespace = f"demo-{uuid.uuid4().hex[:8]}"
    if args.url:
        _check_reachable(args.url)
        return run_demo(DemoOptions(args.url, namespace, args.workers, args.threads, args.turns))
    with EmbeddedServer(args.data_dir) as embedded:
        print(f"embedded Valkey on {embedded.url}, data in {embedded.data_dir} (AOF on)")
        return run_demo(DemoOptions(embedded.url, namespace, args.workers, args.threads, args.turns))


def _server(args: argparse.Namespace) -> int:
    from ._embedded import EmbeddedServer

    embedded = EmbeddedServer(args.data_dir, args.port).start()
    print(f"embedded Valkey listening on {embedded.url} (data in {embedded.data_dir}); Ctrl-C stops it", flush=True)
    try:
        embedded.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        embedded.stop()
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
