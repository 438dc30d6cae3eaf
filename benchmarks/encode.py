"""Where an append's and a page's time goes: validation and encoding against the round trip.

    python -m benchmarks.encode [--quick] [--url URL] [--json PATH] [--profile]

Every step below is timed alone, interleaved round by round with the whole operations they are
part of, on a thread of 1,000 messages of ~1 KB:

- an append of one message: validating a message dict (``parse_message``), encoding a record
  (``encode_record``: pydantic's serializer, then ``msgpack.packb``), the whole client side
  (``kvstore._engine.core.prepare_batch``), a PING, the bare 4-write EVALSHA, kvstore's append script
  alone (arguments built before the clock starts), and ``thread.append``;
- a page of 50: the native read alone (the newest page's pipeline), unpacking 50 records,
  validating 50 message dicts in one call, ``kvstore._engine.record.decode_records`` (both), and
  ``thread.list(limit=50, order="desc")``; beside them the JSON list's ``json.loads`` of 50.

With ``--profile`` it also prints the functions where 2,000 appends and 500 pages spend their
time in the client (cProfile, own time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgpack

from kvstore import UserMessage
from kvstore.messages import MESSAGE_LIST_ADAPTER, parse_message

from ._common import (
    BARE_SCRIPT,
    TEXTS,
    Fixture,
    MessagePool,
    Variant,
    bare_keys,
    collect_per_server,
    fill_thread,
    log,
    measure,
    new_messages,
    ratio,
    render_ratios,
    send_script,
    standalone_main,
    summarize,
)
from ._engine import core, decode_records, encode_record, record, record_body, sent_command

PAGE = 50
MESSAGES = 1_000


@dataclass(frozen=True)
class Params:
    calls: int
    warmup: int


DEFAULT = Params(calls=2000, warmup=200)
QUICK = Params(calls=300, warmup=50)

# (group, name, label); the group's whole operation is the last of its rows.
ROWS = (
    ("append", "validate", "validate a message dict (parse_message)"),
    ("append", "serialize", "  pydantic serializer to_python(mode='json')"),
    ("append", "packb", "  msgpack.packb of the record"),
    ("append", "encode", "encode_record (serializer + packb)"),
    ("append", "prepare", "prepare_batch (copy, ids, date, encode, checks)"),
    ("append", "dict_packb", "msgpack.packb of the message dict (the floor)"),
    ("append", "client", "client side before the socket (prepare, args, command, packing)"),
    ("append", "pack", "  of which packing the command (its connection's pack_command)"),
    ("append", "ping", "PING round trip"),
    ("append", "bare", "bare 4-write EVALSHA round trip"),
    ("append", "script", "kvstore's append script alone (args pre-built)"),
    ("append", "append", "thread.append, whole"),
    ("page", "read", "native read alone (the newest page's pipeline)"),
    ("page", "unpack", "msgpack unpack of 50 records"),
    ("page", "validate_page", "validate 50 message dicts (one adapter call)"),
    ("page", "decode", "decode_records of 50 (unpack + validate)"),
    ("page", "json_loads", "JSON list: json.loads of 50 (for comparison)"),
    ("page", "page", "thread.list(limit=50, order='desc'), whole"),
)


class Encode(Fixture):
    """The threads, records and requests whose steps are timed, on one server."""

    params: Params

    def __init__(self, url: str, params: Params, own: bool) -> None:
        super().__init__(url, params, own)
        self.messages = [UserMessage(content=t) for t in self.texts]

    def setup(self) -> None:
        p, config = self.params, self.config
        self.thread = self.store.thread("encode")
        fill_thread(self.thread, config, self.texts, MESSAGES)
        self.read_thread = self.store.thread("encode-read")
        self.read_thread.append(new_messages(self.texts, 100))
        now = datetime.now(UTC)
        self.stamped = [
            m.model_copy(update={"id": f"message-{uuid.uuid4()}", "date": now})
            for m in self.messages
        ]
        self.dicts = [m.to_dict() for m in self.stamped]
        self.records = [encode_record(m) for m in self.stamped]
        # The newest page's requests, as the core sends them, and its records as decode_records
        # gets them (the stored bytes: a record is the message without its sequence).
        self.page_requests: list[Any] = []
        record(self.store, self.page_requests.append)
        newest = self.read_thread.list(limit=PAGE, order="desc").messages
        record(self.store, None)
        self.entries = [(m.seq_id, encode_record(m)) for m in newest]
        self.bodies = [record_body(seq, record) for seq, record in self.entries]
        self.json_texts = [
            m.to_json() for m in self.read_thread.list(limit=PAGE, order="desc").messages
        ]
        self.bare_sha = self.client.script_load(BARE_SCRIPT)
        self.bare_keys = bare_keys(f"{self.ns}:{{bare}}")
        # kvstore's script alone: requests built by the core, each with a fresh message id.
        self.script_requests = []
        ref = core.ThreadRef.of(config, "encode")
        for i in range(p.warmup + p.calls):
            operation = core.append(ref, new_messages(self.texts, 1, i), None)
            request = next(operation)
            operation.close()
            self.script_requests.append(request)

    def variants(self) -> list[Variant]:
        client, config, messages = self.client, self.config, self.messages
        state = {"append": 0, "script": 0, "bare": 0}
        pool = MessagePool(self.texts, 2 * (self.params.warmup + self.params.calls))
        serializer = self.stamped[0].__pydantic_serializer__

        def append() -> None:
            i = state["append"]
            state["append"] = i + 1
            self.thread.append(pool.take())

        def script() -> None:
            i = state["script"]
            state["script"] = i + 1
            send_script(client, self.store, self.script_requests[i])

        def bare() -> None:
            i = state["bare"]
            state["bare"] = i + 1
            client.evalsha(
                self.bare_sha, 4, *self.bare_keys, f"message-{i}", self.records[i % TEXTS]
            )

        read = self.page_read()
        connection, command, client_side = self.client_side(pool)

        body = serializer.to_python(self.stamped[0], mode="json", exclude_none=True)
        return [
            Variant("validate", "", lambda: parse_message(self.dicts[0])),
            Variant(
                "serialize",
                "",
                lambda: serializer.to_python(self.stamped[0], mode="json", exclude_none=True),
            ),
            Variant("packb", "", lambda: msgpack.packb([2, body], use_bin_type=True)),
            Variant("encode", "", lambda: encode_record(self.stamped[0])),
            Variant("prepare", "", lambda: core.prepare_batch(config, messages[0], None)),
            Variant("dict_packb", "", lambda: msgpack.packb(self.dicts[0])),
            Variant("client", "", client_side),
            Variant("pack", "", lambda: connection.pack_command(*command)),
            Variant("ping", "", client.ping),
            Variant("bare", "", bare),
            Variant("script", "", script),
            Variant("append", "", append),
            Variant("read", "", read),
            Variant("unpack", "", lambda: [msgpack.unpackb(r, raw=False) for _, r in self.entries]),
            Variant("validate_page", "", lambda: MESSAGE_LIST_ADAPTER.validate_python(self.bodies)),
            Variant("decode", "", lambda: decode_records(self.entries)),
            Variant("json_loads", "", lambda: [json.loads(t) for t in self.json_texts]),
            Variant("page", "", lambda: self.read_thread.list(limit=PAGE, order="desc")),
        ]

    def page_read(self) -> Callable[[], None]:
        """The newest page's requests, sent as the core sends them."""
        client = self.client

        def read() -> None:
            for request in self.page_requests:
                if isinstance(request, core.Eval):
                    send_script(client, self.store, request)
                    continue
                pipe = client.pipeline(transaction=False)
                for command in request.commands:
                    pipe.execute_command(*command)
                pipe.execute()

        return read

    def client_side(self, pool: MessagePool) -> tuple[Any, tuple[Any, ...], Callable[[], None]]:
        """A connection to pack with, an append's command, and an append's work before the
        socket: the core up to its request, the command the executor sends, packed."""
        ref = core.ThreadRef.of(self.config, "encode")
        connection = self.client.connection_pool.get_connection()
        self.client.connection_pool.release(connection)
        command = sent_command(self.store, self.script_requests[0])

        def client_side() -> None:
            operation = core.append(ref, pool.take(), None)
            request = next(operation)
            operation.close()
            connection.pack_command(*sent_command(self.store, request))

        return connection, command, client_side

    def cleanup(self) -> None:
        self.thread.delete()
        self.read_thread.delete()
        self.client.delete(*self.bare_keys)

    def profile(self) -> str:
        out = io.StringIO()
        profiler = cProfile.Profile()
        profiler.enable()
        for message in new_messages(self.texts, 2000):
            self.thread.append(message)
        for _ in range(500):
            self.read_thread.list(limit=PAGE, order="desc")
        profiler.disable()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(20)
        return out.getvalue()


# (name, label, numerator, what it less, denominator) of each share, all for information.
SHARES = (
    (
        "client_share_append",
        "append: client side (append - script alone) / append",
        "append",
        "script",
        "append",
    ),
    (
        "client_vs_packb",
        "append: client side before the socket / msgpack.packb of the message dict",
        "client",
        None,
        "dict_packb",
    ),
    (
        "client_vs_bare",
        "append: client side before the socket / bare EVALSHA round trip",
        "client",
        None,
        "bare",
    ),
    ("prepare_share_append", "append: prepare_batch / append", "prepare", None, "append"),
    (
        "encode_vs_roundtrip",
        "append: encode_record / bare EVALSHA round trip",
        "encode",
        None,
        "bare",
    ),
    ("decode_share_page", "page: decode_records / whole page", "decode", None, "page"),
    ("validate_share_page", "page: validation alone / whole page", "validate_page", None, "page"),
    ("read_share_page", "page: native read round trip / whole page", "read", None, "page"),
)


def run_server(url: str, params: Params, own: bool, profile: bool) -> dict[str, Any]:
    with Encode(url, params, own) as bench:
        log(
            f"{bench.version}: a {MESSAGES:,}-message thread; {params.calls:,} calls of each step, interleaved"
        )
        bench.setup()
        samples = measure(bench.variants(), params.calls, params.warmup)
        profiled = bench.profile() if profile else None
    steps = {name: summarize(samples[name]) for name in samples}
    med = {k: v["median_us"] for k, v in steps.items()}
    ratios = [
        ratio(name, label, (med[top] - med[less] if less else med[top]) / med[bottom], None)
        for name, label, top, less, bottom in SHARES
    ]
    return {
        "server": bench.version,
        "steps": steps,
        "ratios": ratios,
        "profile": profiled,
        "per_message_us": {
            "encode": med["encode"],
            "decode": med["decode"] / PAGE,
            "unpack": med["unpack"] / PAGE,
            "validate": med["validate_page"] / PAGE,
        },
    }


def render(result: dict[str, Any]) -> str:
    steps = result["steps"]
    lines = [
        f"== {result['server']} ==",
        "",
        f"{'step (µs)':<52} {'median':>8} {'p99':>9} {'of whole':>9}",
    ]
    for group in ("append", "page"):
        whole = steps[group]["median_us"]
        for g, name, label in ROWS:
            if g != group:
                continue
            s = steps[name]
            share = f"{100 * s['median_us'] / whole:.0f} %" if name != group else ""
            lines.append(f"{label:<52} {s['median_us']:>8.1f} {s['p99_us']:>9.1f} {share:>9}")
        lines.append("")
    per = result["per_message_us"]
    lines.append(
        f"per message: encode {per['encode']:.1f} µs; decode {per['decode']:.2f} µs "
        f"(unpack {per['unpack']:.2f} + validate {per['validate']:.2f})"
    )
    a = steps["append"]["median_us"]
    lines.append(
        f"an append: round trip of the bare script {steps['bare']['median_us']:.1f} + kvstore's script over "
        f"it {steps['script']['median_us'] - steps['bare']['median_us']:.1f} + client side "
        f"{a - steps['script']['median_us']:.1f} (prepare_batch {steps['prepare']['median_us']:.1f} of it)"
    )
    p = steps["page"]["median_us"]
    lines.append(
        f"a page of 50: native read {steps['read']['median_us']:.1f} + decode_records "
        f"{steps['decode']['median_us']:.1f} + the rest {p - steps['read']['median_us'] - steps['decode']['median_us']:.1f}"
    )
    lines.append("")
    lines += render_ratios(result["ratios"], "shares (of medians)")
    if result.get("profile"):
        lines += ["", "cProfile of 2,000 appends and 500 pages, by own time:", result["profile"]]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile", action="store_true", help="also print where the client spends its time"
    )


def collect(args: argparse.Namespace) -> dict[str, Any]:
    params = QUICK if args.quick else DEFAULT
    profile = getattr(args, "profile", False)
    return collect_per_server(
        "encode",
        args,
        params,
        lambda url, params, own: run_server(url, params, own, profile),
        render,
    )


def main(argv: list[str] | None = None) -> int:
    return standalone_main("encode", __doc__, collect, argv, add_arguments)


if __name__ == "__main__":
    sys.exit(main())
