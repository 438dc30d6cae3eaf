"""Server time per append and per page, from INFO commandstats, against native baselines.

    python -m benchmarks.server_cost [--quick] [--url URL] [--json PATH]

The server is single-threaded and shared by every client, so its time per operation is what
bounds a deployment's throughput. On each server, over many calls of each:

- kvstore's append (one FCALL of its function, or one EVALSHA with scripting="eval"; one append
  in 32 also moves a chunk, so this is the amortized cost) against the bare 4-write script
  (HINCRBY, HSET, ZADD, HSET with the same record bytes, by EVALSHA);
- kvstore's newest page of 50 (native reads only) and an older page of 50 from a sequence
  cursor (the plan's native reads plus the native fetch of the chunks it names) against one native
  HMGET of 50 fields of 1 KB records, and the JSON list's LRANGE -50 -1; for information, the same
  older page from an id cursor (planned by the page_plan script).

An FCALL's or EVALSHA's usec covers the commands its script runs (they are also counted under
their own names); so a script request is charged that time, and a pipeline of native commands the
sum of its commands. Replayed requests are sent as the executor sends them. The same loops also report the server process's CPU time (INFO cpu,
user + sys, which includes reading and writing sockets) per call, for information.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis

from kvstore import MessageStore, StoreConfig, UserMessage

from ._common import (
    BARE_SCRIPT,
    Fixture,
    MessagePool,
    bare_keys,
    collect_per_server,
    fill_thread,
    log,
    new_messages,
    send_script,
    standalone_main,
)
from ._cost import replayed, slowlog_appends, timed
from ._cost_render import ratios, render
from ._engine import Batch, ChunkEntry, Eval, encode_record, record

PAGE = 50


@dataclass(frozen=True)
class Params:
    messages: int  # in the measured thread
    calls: int  # per operation
    warmup: int
    cold_threads: int  # threads (and hashes) the cold newest page and HMGET go round
    cold_messages: int  # in each of them


DEFAULT = Params(messages=10_000, calls=3000, warmup=200, cold_threads=256, cold_messages=200)
QUICK = Params(messages=2_000, calls=500, warmup=50, cold_threads=64, cold_messages=120)


class Recorder(MessageStore):
    """A store that also keeps every request its operations send, to replay them one by one."""

    def __init__(self, client: redis.Redis, config: StoreConfig) -> None:
        super().__init__(client, config)
        self.requests: list[Eval | Batch] = []
        record(self, self.requests.append)


class Cost(Fixture):
    """The threads, the baselines' keys and the recorded page requests of one run on one server."""

    params: Params
    store: Recorder

    def __init__(self, url: str, params: Params, own: bool) -> None:
        super().__init__(url, params, own, Recorder)
        self.thread = self.store.thread("cost")
        self.quiet_config = StoreConfig(namespace=self.ns, events=False)
        self.quiet = MessageStore(self.client, self.quiet_config).thread("cost-quiet")
        self.cold = [self.store.thread(f"cold-{i}") for i in range(params.cold_threads)]
        self.script_keys = bare_keys(f"{self.ns}:{{bare}}")
        self.hmget_key = f"{self.ns}:{{native}}:hash"
        self.cold_hashes = [f"{self.ns}:{{native-{i}}}:hash" for i in range(params.cold_threads)]
        self.list_key = f"{self.ns}:{{native}}:list"

    def setup(self) -> None:
        """The threads, then the baselines with the bytes of one of its records."""
        fill_thread(self.thread, self.config, self.texts, self.params.messages)
        fill_thread(self.quiet, self.quiet_config, self.texts, self.params.messages)
        for thread in self.cold:
            fill_thread(thread, self.config, self.texts, self.params.cold_messages)
        stamped = UserMessage(content=self.texts[0]).model_copy(
            update={"id": f"message-{uuid.uuid4()}", "date": datetime.now(UTC)}
        )
        self.blob = encode_record(stamped)
        self.sha = self.client.script_load(BARE_SCRIPT)
        pipe = self.client.pipeline(transaction=False)
        for key in [self.hmget_key, *self.cold_hashes]:
            pipe.hset(key, mapping={i: self.blob for i in range(1, 65)})
        pipe.rpush(self.list_key, *[stamped.to_json()] * 100)
        pipe.execute()

    def recorded(self, read: Callable[[], Any]) -> tuple[Any, list[Eval | Batch]]:
        """What `read` returns, and the requests it sent."""
        self.store.requests.clear()
        result = read()
        return result, list(self.store.requests)

    def page_requests(self) -> dict[str, list[list[Eval | Batch]]]:
        """The requests of the newest page (on the measured thread, and on each cold thread), of
        an older page and of the same from an id cursor. A page that does not read back as
        expected is left out (and said), not measured."""
        thread, middle = self.thread, self.params.messages // 2
        pages: dict[str, list[list[Eval | Batch]]] = {}
        newest_page, newest = self.recorded(lambda: thread.list(limit=PAGE, order="desc"))
        expected = list(range(self.params.messages, self.params.messages - PAGE, -1))
        _keep(pages, "newest_page", [newest], [m.seq_id for m in newest_page.messages], expected)
        older_page, older = self.recorded(
            lambda: thread.list(before=middle, limit=PAGE, order="desc")
        )
        # before=X with order="desc" is the page of the 50 messages newer than X, newest first.
        expected = list(range(middle + PAGE, middle, -1))
        _keep(pages, "older_page", [older], [m.seq_id for m in older_page.messages], expected)
        cursor = thread.list(after=middle - 1, limit=1).messages
        if cursor:
            by_id_page, by_id = self.recorded(
                lambda: thread.list(before=cursor[0].id, limit=PAGE, order="desc")
            )
            got = [m.seq_id for m in by_id_page.messages]
            _keep(pages, "older_page_by_id", [by_id], got, expected)
        else:
            log(f"  NOT MEASURED: older_page_by_id (no message after {middle - 1} listed)")
        cold, sequences = [], []
        for each in self.cold:
            page, requests = self.recorded(lambda t=each: t.list(limit=PAGE, order="desc"))
            cold.append(requests)
            sequences += [m.seq_id for m in page.messages]
        n = self.params.cold_messages
        expected = list(range(n, n - PAGE, -1)) * len(self.cold)
        if len({len(r) for r in cold}) != 1:
            log("  the cold threads' newest pages took different numbers of requests")
        else:
            _keep(pages, "newest_page_cold", cold, sequences, expected)
        return pages

    def replay(self, request: Eval | Batch) -> Callable[[int], Any]:
        """Sends `request` again as the executor sends it."""
        client = self.client
        if isinstance(request, Eval):
            return lambda _i: send_script(client, self.store, request)

        def pipeline(_i: int) -> Any:
            pipe = client.pipeline(transaction=False)
            for command in request.commands:
                pipe.execute_command(*command)
            return pipe.execute()

        return pipeline

    def warm_up(self, ids: list[str]) -> None:
        """The script cache and the allocator, before anything is measured."""
        n, client = self.params.calls, self.client
        for i, message in enumerate(new_messages(self.texts, 2 * self.params.warmup)):
            (self.thread if i % 2 else self.quiet).append(message)
            client.evalsha(self.sha, 4, *self.script_keys, ids[n + i // 2], self.blob)
        self.store.requests.clear()

    def measure(self, pages: dict[str, list[list[Eval | Batch]]]) -> dict[str, Any]:
        """Server time per call of each operation, after a warm-up."""
        client, thread, n = self.client, self.thread, self.params.calls
        sha, keys, blob = self.sha, self.script_keys, self.blob
        ids = [f"message-{uuid.uuid4()}" for _ in range(n + self.params.warmup)]
        log(f"  measuring {n:,} calls of each operation")
        self.warm_up(ids)
        self.pool = MessagePool(self.texts, 3 * n + 640)
        fields = list(range(1, PAGE + 1))
        hashes = self.cold_hashes
        return {
            "append": timed(client, n, lambda i: thread.append(self.pool.take()), scripted=True),
            "append_events_off": timed(
                client, n, lambda i: self.quiet.append(self.pool.take()), scripted=True
            ),
            "append_batch_10": timed(
                client, max(1, n // 10), lambda i: thread.append(self.pool.take(10)), scripted=True
            ),
            "bare_script": timed(
                client, n, lambda i: client.evalsha(sha, 4, *keys, ids[i], blob), scripted=True
            ),
            **{
                name: replayed(client, n, requests, self.replay, _scripted)
                for name, requests in pages.items()
            },
            "hmget_50": timed(
                client, n, lambda i: client.hmget(self.hmget_key, fields), scripted=False
            ),
            "hmget_50_cold": timed(
                client, n, lambda i: client.hmget(hashes[i % len(hashes)], fields), scripted=False
            ),
            "list_page": timed(
                client, n, lambda i: client.lrange(self.list_key, -PAGE, -1), scripted=False
            ),
        }

    def per_call(self) -> dict[str, Any] | None:
        """Each append's own server time (SLOWLOG), against the messages a chunk holds."""
        self.store.requests.clear()
        newest_chunk = self.client.zrange(self.thread.keys.chunk_index, -1, -1)[0]
        per_chunk = ChunkEntry.parse(newest_chunk).count
        return slowlog_appends(
            self.client, lambda i: self.thread.append(self.pool.take()), 640, per_chunk
        )

    def cleanup(self) -> None:
        for thread in [self.thread, self.quiet, *self.cold]:
            thread.delete()
        self.client.delete(*self.script_keys, self.hmget_key, self.list_key, *self.cold_hashes)


def _keep(
    pages: dict[str, list[list[Eval | Batch]]],
    name: str,
    requests: list[list[Eval | Batch]],
    got: list[int],
    expected: list[int],
) -> None:
    """Keeps a page's requests for measuring when it read the sequences expected."""
    if got == expected:
        pages[name] = requests
        return
    log(
        f"  NOT MEASURED: {name} read {len(got)} messages ({got[:3]}...), expected"
        f" {len(expected)} ({expected[:3]}...)"
    )


def _scripted(request: Eval | Batch) -> bool:
    return isinstance(request, Eval)


def run_server(url: str, params: Params, own: bool) -> dict[str, Any]:
    with Cost(url, params, own) as cost:
        log(
            f"{cost.version} at {url}: filling two {params.messages:,}-message threads and "
            f"{params.cold_threads} of {params.cold_messages}"
        )
        cost.setup()
        pages = cost.page_requests()
        results = cost.measure(pages)
        per_call = cost.per_call() if own else None
        shape = {
            name: [_describe(r, cost.store) for r in requests[0]]
            for name, requests in pages.items()
        }
        shape["append"] = "FCALL" if cost.store.functions else "EVALSHA"
    return {
        "server": cost.version,
        "messages": params.messages,
        "cold_threads": params.cold_threads,
        "record_bytes": len(cost.blob),
        "results": results,
        "requests": shape,
        "append_per_call": per_call,
        "ratios": ratios(results),
    }


def _describe(request: Eval | Batch, store: MessageStore) -> str:
    if isinstance(request, Eval):
        command = (
            ("FCALL" if request.script.writes else "FCALL_RO") if store.functions else "EVALSHA"
        )
        return f"{command} {request.script.name}"
    return "pipeline: " + ", ".join(str(c[0]) for c in request.commands)


def collect(args: argparse.Namespace) -> dict[str, Any]:
    params = QUICK if args.quick else DEFAULT
    return collect_per_server("server cost", args, params, run_server, render)


def main(argv: list[str] | None = None) -> int:
    return standalone_main("server_cost", __doc__, collect, argv)


if __name__ == "__main__":
    sys.exit(main())
