"""Validate, then write: a refused call leaves the namespace byte-identical (DUMP + expiry).

A Lua error after a write does not roll the write back, so every refusal must happen before the
first write. Each case sets up a thread, snapshots DUMP and PEXPIRETIME of every key of the
namespace, makes a call that must be refused, and compares. A key of the wrong type refuses the
calls that read or write it; a call that needs nothing from it may succeed, and must then have
left it alone and written whole.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvstore import (
    MessageStore,
    StoreConfig,
    ToolCallMessage,
    ToolReturnMessage,
    UserMessage,
    errors,
)
from kvstore._engine import core as _core
from kvstore._engine.core import ThreadRef
from kvstore.messages import ImageContent, TextContent

from ..support.layout_check import check_layout
from .support import (
    dedicated_server,
    first_request,
    fresh_namespace,
    key_fields,
    keyspace,
    keyspace_diff,
    run_one,
    script_call,
    server_kinds,
    with_limits,
)

# Small sizes so a dozen messages make chunks, an oversized chunk and a window; a ttl so the
# expiry path runs (and a refused call must not move any deadline either); a retained limit
# above the thread's size so retention runs on every rollover (after the summary) and deletes
# nothing.
SMALL = dict(
    window_size=4, chunk_size=2, chunk_max_bytes=2048, retained_message_limit=1000, thread_ttl=3600
)


@dataclasses.dataclass
class Setup:
    store: MessageStore
    raw: object
    namespace: str
    config: StoreConfig
    thread: object
    window_id: str
    chunk_id: str
    otid: str

    @property
    def ref(self) -> ThreadRef:
        return ThreadRef.of(self.config, "victim")


@pytest.fixture(scope="module", params=[*server_kinds(), "fakeredis"])
def target(request):
    """(make_store(config), raw client) on each real server and on fakeredis."""
    if request.param == "fakeredis":
        import fakeredis

        fake = fakeredis.FakeServer()
        raw = fakeredis.FakeRedis(server=fake)
        yield (
            request.param,
            (lambda config: MessageStore(fakeredis.FakeRedis(server=fake), config)),
            raw,
        )
        return
    import redis

    with dedicated_server(request.param) as server:
        raw = redis.Redis(port=server.port)
        yield request.param, (lambda config: MessageStore.from_url(server.url, config)), raw
        raw.close()


def populate(make_store, raw, **overrides) -> Setup:
    namespace = fresh_namespace()
    config = StoreConfig(namespace=namespace, **{**SMALL, **overrides})
    store = make_store(config)
    thread = store.thread("victim")
    thread.start_turn("t1")
    stored = []
    for i in range(6):
        stored += thread.append(
            UserMessage(content=f"m{i} " + "x" * 300, otid=f"o{i}"), turn_id="t1"
        )
    stored += thread.append(
        UserMessage(content="B" * 3000, otid="big"), turn_id="t1"
    )  # its own chunk
    thread.start_turn("t2")
    stored += thread.append(
        [UserMessage(content=f"r{i}", otid=f"r{i}") for i in range(3)], turn_id="t2"
    )
    stored.append(
        thread.compact("the first two", 2)
    )  # a summary: retention now runs on every rollover
    layout = check_layout(raw, thread.keys, config)
    assert layout.chunks and layout.large and layout.open
    chunk_seq = min(min(fields) for fields in layout.chunks.values())
    by_seq = {m.seq_id: m for m in stored}
    return Setup(
        store,
        raw,
        namespace,
        config,
        thread,
        window_id=by_seq[max(layout.open)].id,  # the open chunk's (layout 2: the window's)
        chunk_id=by_seq[chunk_seq].id,
        otid="o1",
    )


def writing_operations(s: Setup):
    """One call of every writing path that would succeed on the intact thread."""
    thread = s.thread
    ops = {
        "append": lambda: thread.append(UserMessage(content="new")),
        "append batch with otids": lambda: thread.append(
            [UserMessage(content="a", otid="n1"), UserMessage(content="b", otid="n2")], turn_id="t2"
        ),
        "append replay": lambda: thread.append(UserMessage(content="again", otid=s.otid)),
        "append oversized": lambda: thread.append(UserMessage(content="O" * 3000)),
        "start_turn": lambda: thread.start_turn("t9"),
        "finish_turn": lambda: thread.finish_turn("t2"),
        "compact": lambda: thread.compact("the first three", 3),
        "replace (window)": lambda: thread.replace(s.window_id, UserMessage(content="replaced")),
        "replace (chunk)": lambda: thread.replace(s.chunk_id, UserMessage(content="replaced")),
        "remove_turn": lambda: thread.remove_turn("t1"),
        "retain": lambda: run_one(s.store, script_call("retain", s.ref, limits=s.ref.limits())),
    }
    if hasattr(thread, "migrate"):
        ops["migrate"] = lambda: thread.migrate()
    return ops


def refused_unchanged(s: Setup, call, expected: type[errors.KVStoreError]) -> str | None:
    """Makes the call; returns None when it raised `expected` and changed nothing, else why not."""
    before = keyspace(s.raw, s.namespace)
    try:
        result = call()
    except expected:
        outcome = None
    except Exception as exc:
        outcome = f"raised {type(exc).__module__}.{type(exc).__name__}: {exc}"
    else:
        outcome = f"succeeded ({result!r:.80})"
    changed = keyspace_diff(before, keyspace(s.raw, s.namespace))
    if changed:
        outcome = (outcome or f"raised {expected.__name__}") + f", and changed {changed}"
    return outcome


# ------------------------------------------------------------------ wrong-type keys planted


def _wrong_values(field: str):
    # A string for every key, and the other container type (a hash where a zset belongs and the
    # reverse), which is the sneakier case: commands of the wrong family fail only when reached.
    zsets = {"window", "chunk_index", "large_index", "pairs"}
    yield "string", lambda raw, key: raw.set(key, "planted")
    if field in zsets:
        yield "hash", lambda raw, key: raw.hset(key, "planted", "1")
    else:
        yield "zset", lambda raw, key: raw.zadd(key, {"planted": 1})


@pytest.mark.parametrize("field", key_fields())
def test_a_wrong_type_key_is_refused_unchanged_or_left_alone_by_a_whole_write(target, field):
    """A call refuses a key of the wrong type it would read or write, with LayoutError and the
    keyspace byte-identical. A call that needs nothing from that key may succeed (appends check
    only the keys they may write, docs/LAYOUT.md); then it left the key's value alone, and with
    the key's original value put back the thread passes every layout invariant: the write was
    whole."""
    name, make_store, raw = target
    failures, outcomes = [], {"refused": 0, "succeeded": 0}
    for wrong, plant in _wrong_values(field):
        s = populate(make_store, raw)
        key = getattr(s.thread.keys, field)
        original = raw.dump(key)

        def put_back(key=key, original=original):
            raw.delete(key)
            if original is not None:
                raw.restore(key, 0, original)

        raw.delete(key)
        plant(raw, key)
        planted = raw.dump(key)
        for op, call in writing_operations(s).items():
            before = keyspace(s.raw, s.namespace)
            try:
                call()
            except errors.LayoutError:
                outcomes["refused"] += 1
                changed = keyspace_diff(before, keyspace(s.raw, s.namespace))
                if changed:
                    failures.append(
                        f"{field} holds a {wrong}: {op} raised LayoutError and changed {changed}"
                    )
                continue
            except Exception as exc:
                failures.append(
                    f"{field} holds a {wrong}: {op} raised {type(exc).__module__}.{type(exc).__name__}:"
                    f" {exc}; changed {keyspace_diff(before, keyspace(s.raw, s.namespace))}"
                )
                put_back()
                return _fail(name, field, outcomes, failures)
            outcomes["succeeded"] += 1
            if raw.dump(key) != planted:
                failures.append(f"{field} holds a {wrong}: {op} succeeded and wrote into it")
            put_back()
            try:
                check_layout(raw, s.thread.keys, s.config)
            except AssertionError as exc:
                failures.append(
                    f"{field} holds a {wrong}: {op} succeeded but the thread is inconsistent: {exc!r:.300}"
                )
            raw.delete(key)
            plant(raw, key)
        # delete checks the chunk indexes it walks; any other key of the thread it removes.
        if field in ("chunk_index", "large_index"):
            why = refused_unchanged(s, s.thread.delete, errors.LayoutError)
            if why:
                failures.append(f"{field} holds a {wrong}: delete {why}")
        else:
            s.thread.delete()
            left = set(keyspace(raw, s.namespace))
            assert not left, f"delete left {left}"
    _fail(name, field, outcomes, failures)


def _fail(name, field, outcomes, failures):
    print(
        f"\nvalidate-then-write [{name}] {field}: {outcomes['refused']} refused with the keyspace"
        f" byte-identical, {outcomes['succeeded']} whole writes that did not need it; {len(failures)} not clean"
    )
    assert not failures, "\n".join(failures)


def history_setup(make_store, raw) -> tuple[Setup, dict]:
    """A thread written with strict history checks: a pair in the turn t3, a call left open."""
    s = populate(make_store, raw, history_checks="strict")
    raw.delete(*[key for key in raw.scan_iter(match=f"{s.namespace}:*")])
    thread = s.thread
    thread.append(UserMessage(content="weather?"))
    thread.start_turn("t3")
    call, _ = thread.append([_call("k1"), _answer("k1")], turn_id="t3")
    thread.finish_turn("t3")
    thread.append(_call("k2"))
    ops = {
        "append answering the open call": lambda: thread.append(_answer("k2")),
        "append of a new call": lambda: thread.append(_call("k3")),
        "append of a plain message": lambda: thread.append(UserMessage(content="plain")),
        "replace keeping the pairs": lambda: thread.replace(call.id, _call("k1")),
        "remove_turn": lambda: thread.remove_turn("t3"),
    }
    return dataclasses.replace(s, window_id=call.id), ops


def _call(call_id: str) -> ToolCallMessage:
    return ToolCallMessage(tool_call={"name": "f", "arguments": "{}", "tool_call_id": call_id})


def _answer(call_id: str) -> ToolReturnMessage:
    return ToolReturnMessage(status="success", tool_call_id=call_id, tool_return="ok")


def test_every_history_refusal_and_a_wrong_type_pairs_key_change_nothing(target):
    """With strict history checks: each refusal leaves the keyspace byte-identical, and a pairs
    key of the wrong type refuses the calls that read or write it, changing nothing."""
    name, make_store, raw = target
    s, _ = history_setup(make_store, raw)
    thread = s.thread
    later = thread.append(_answer("k2"))[0]
    cases = [
        ("an answer to no call", lambda: thread.append(_answer("nothing")), errors.HistoryConflict),
        ("a second answer", lambda: thread.append(_answer("k1")), errors.HistoryConflict),
        (
            "one bad answer in a batch",
            lambda: thread.append([_call("k4"), _answer("k4"), _answer("k9")]),
            errors.HistoryConflict,
        ),
        (
            "a replacement changing the call",
            lambda: thread.replace(s.window_id, _call("other")),
            errors.HistoryConflict,
        ),
        (
            "a replacement dropping the answer",
            lambda: thread.replace(later.id, UserMessage(content="x")),
            errors.HistoryConflict,
        ),
    ]
    thread.start_turn("t4")
    thread.append(_call("k5"), turn_id="t4")
    thread.finish_turn("t4")
    thread.append(_answer("k5"))
    cases.append(
        (
            "a turn removal orphaning a later answer",
            lambda: thread.remove_turn("t4"),
            errors.HistoryConflict,
        )
    )
    failures = [
        f"{label}: {why}"
        for label, call, expected in cases
        if (why := refused_unchanged(s, call, expected))
    ]

    outcomes = {"refused": 0, "succeeded": 0}
    for wrong, plant in _wrong_values("pairs"):
        s, ops = history_setup(make_store, raw)
        key = s.thread.keys.pairs
        original = raw.dump(key)
        for op, call in ops.items():
            raw.delete(key)
            plant(raw, key)
            planted = raw.dump(key)
            before = keyspace(s.raw, s.namespace)
            try:
                call()
            except errors.LayoutError:
                outcomes["refused"] += 1
                if changed := keyspace_diff(before, keyspace(s.raw, s.namespace)):
                    failures.append(
                        f"pairs holds a {wrong}: {op} raised LayoutError and changed {changed}"
                    )
            except Exception as exc:
                failures.append(f"pairs holds a {wrong}: {op} raised {type(exc).__name__}: {exc}")
            else:
                outcomes["succeeded"] += 1
                if raw.dump(key) != planted:
                    failures.append(f"pairs holds a {wrong}: {op} succeeded and wrote into it")
            raw.delete(key)
            raw.restore(key, 0, original)
    print(
        f"\nvalidate-then-write [{name}] history: {len(cases)} refusals, {outcomes['refused']} wrong-type"
        f" refusals, {outcomes['succeeded']} writes that did not need the key; {len(failures)} not clean"
    )
    assert not failures, "\n".join(failures)
    assert outcomes["refused"] >= 2 * 3


# The chunk keys are the thread's keys too: a script writes `chunk:<first>` by name, so a key of
# the wrong type there must refuse the call before its first write, like any other key.


def test_a_wrong_type_at_a_chunk_key_the_call_would_write_refuses_it_and_changes_nothing(target):
    name, make_store, raw = target
    failures = []

    # 1. The close of the open chunk this append makes writes chunk:<open_first>:d (and :m).
    s = populate(make_store, raw)
    open_first = int(raw.hget(s.thread.keys.meta, "open_first"))
    raw.set(s.thread.keys.chunk_data(open_first), "planted")
    batch = [UserMessage(content=f"roll {i}") for i in range(s.config.chunk_size)]
    why = refused_unchanged(s, lambda: s.thread.append(batch), errors.LayoutError)
    if why:
        failures.append(f"append whose close writes chunk:{open_first}:d: {why}")

    # 2. An oversized message goes to chunk:<its sequence>; here it follows a small one.
    s = populate(make_store, raw)
    next_seq = s.thread.stats().next_sequence
    raw.set(s.thread.keys.chunk(next_seq + 1), "planted")
    batch = [UserMessage(content="small"), UserMessage(content="O" * 3000)]
    why = refused_unchanged(s, lambda: s.thread.append(batch), errors.LayoutError)
    if why:
        failures.append(f"batch whose oversized message goes to chunk:{next_seq + 1}: {why}")

    # 3. A window message replaced by an oversized one moves to chunk:<its sequence>.
    s = populate(make_store, raw)
    sequence = s.thread.get(s.window_id).seq_id
    raw.set(s.thread.keys.chunk(sequence), "planted")
    why = refused_unchanged(
        s,
        lambda: s.thread.replace(s.window_id, UserMessage(content="G" * 3000)),
        errors.LayoutError,
    )
    if why:
        try:
            still = f"get() now returns seq {s.thread.get(s.window_id).seq_id}"
        except errors.KVStoreError as exc:
            still = f"get() of the message now raises {type(exc).__name__}: {exc}"
        failures.append(f"replace moving message {sequence} to chunk:{sequence}: {why}; {still}")
    print(f"\nvalidate-then-write [{name}] planted chunk keys: 3 calls, {len(failures)} not clean")
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------- every other refusal path


def test_every_refusal_is_typed_and_changes_nothing(target):
    name, make_store, raw = target
    s = populate(make_store, raw)
    thread, ref = s.thread, s.ref
    last_seq = thread.stats().next_sequence - 1
    big_ref = ThreadRef.of(
        dataclasses.replace(s.config, max_message_bytes=10 * 1024 * 1024), "victim"
    )
    huge = UserMessage(content="H" * 6000)
    small_limit = dataclasses.replace(s.config, max_message_bytes=4096)
    small_ref = ThreadRef.of(small_limit, "victim")
    # The script reads the budget from its limits: a 10-byte budget, for the limits only.
    media_ref = ThreadRef.of(
        dataclasses.replace(s.config, max_inline_media_bytes=10, max_inline_part_bytes=10), "victim"
    )
    image = UserMessage(
        content=[
            TextContent(text="look"),
            ImageContent(source={"type": "base64", "media_type": "image/png", "data": "QUFB" * 30}),
        ]
    )
    with_media = UserMessage(
        content=[
            ImageContent(source={"type": "base64", "media_type": "image/png", "data": "QUFB" * 20})
        ]
    )

    def direct(operation, ref_for_limits=None):
        request = first_request(operation, s.store)
        if ref_for_limits is not None:
            request = with_limits(request, ref_for_limits)
        return lambda: run_one(s.store, request)

    cases = [
        # otids and ids
        (
            "otid mix (stored + new)",
            lambda: thread.append(
                [UserMessage(content="a", otid="o1"), UserMessage(content="b", otid="fresh")]
            ),
            errors.OtidConflict,
        ),
        (
            "otid repeated in a batch",
            lambda: thread.append(
                [UserMessage(content="a", otid="dup"), UserMessage(content="b", otid="dup")]
            ),
            errors.OtidRepeated,
        ),
        (
            "message id mix (stored + new)",
            lambda: thread.append(
                [
                    UserMessage(id=s.window_id, content="a"),
                    UserMessage(id="message-fresh", content="b"),
                ]
            ),
            errors.DuplicateMessageId,
        ),
        (
            "message id repeated in a batch",
            lambda: thread.append(
                [UserMessage(id="message-x", content="a"), UserMessage(id="message-x", content="b")]
            ),
            errors.MessageIdRepeated,
        ),
        # sizes, past the client's own check
        (
            "oversized append, script called directly",
            direct(_core.append(big_ref, huge, None), small_ref),
            errors.MessageTooLarge,
        ),
        (
            "oversized compact summary, script called directly",
            direct(_core.compact(big_ref, "S" * 6000, 2), small_ref),
            errors.MessageTooLarge,
        ),
        (
            "oversized replace, script called directly",
            lambda: run_one(
                s.store,
                with_limits(
                    script_call(
                        "replace",
                        ref,
                        limits=ref.limits(),
                        id=s.window_id,
                        media=0,
                        tokens=1500,
                        record=b"\x92\x02" + b"R" * 6000,
                        pairs="",
                        summary=0,
                    ),
                    small_ref,
                ),
            ),
            errors.MessageTooLarge,
        ),
        (
            "replace growing a shared chunk past chunk_max_bytes",
            lambda: thread.replace(s.chunk_id, UserMessage(content="G" * 1900)),
            errors.MessageTooLarge,
        ),
        (
            "inline media over the thread's budget, first call",
            direct(_core.append(ref, with_media, None), media_ref),
            errors.InlineMediaBudget,
        ),
        (
            "inline part over max_inline_part_bytes (client)",
            lambda: (
                MessageStore(
                    s.store.client,
                    dataclasses.replace(
                        s.config, max_inline_part_bytes=10, max_inline_media_bytes=10
                    ),
                )
                .thread("victim")
                .append(image)
            ),
            errors.InlineMediaTooLarge,
        ),
        # summaries, turns, ids, cursors
        (
            "compact past the last sequence",
            lambda: thread.compact("s", last_seq + 5),
            errors.InvalidSummaryRange,
        ),
        (
            "compact with last_sequence 0",
            lambda: thread.compact("s", 0),
            errors.InvalidSummaryRange,
        ),
        ("finish a turn never started", lambda: thread.finish_turn("never"), errors.TurnNotFound),
        (
            "replace an unknown id",
            lambda: thread.replace("message-unknown", UserMessage(content="r")),
            errors.MessageNotFound,
        ),
        (
            "page after an unknown id",
            lambda: thread.list(after="message-unknown"),
            errors.MessageNotFound,
        ),
        (
            "page before an unknown id",
            lambda: thread.list(before="message-unknown", order="desc"),
            errors.MessageNotFound,
        ),
        ("page after a negative sequence", lambda: thread.list(after=-1), errors.InvalidCursor),
        ("page with limit 0", lambda: thread.list(limit=0), errors.InvalidCursor),
        ("get an unknown id", lambda: thread.get("message-unknown"), errors.MessageNotFound),
        (
            "batch over max_batch_messages",
            lambda: thread.append([UserMessage(content="m")] * 501),
            errors.BatchTooLarge,
        ),
    ]
    failures = [
        f"{label}: {why}"
        for label, call, expected in cases
        if (why := refused_unchanged(s, call, expected))
    ]

    # The summary may not move back: compact once, then try an earlier last_sequence.
    thread.compact("up to 4", 4)
    failures += [
        f"compact moving back: {why}"
        for why in [
            refused_unchanged(s, lambda: thread.compact("s", 2), errors.InvalidSummaryRange)
        ]
        if why
    ]
    # A thread in a layout this version does not write.
    raw.hset(thread.keys.meta, "layout", "9")
    for op, call in writing_operations(s).items():
        why = refused_unchanged(s, call, errors.LayoutError)
        if why:
            failures.append(f"layout 9: {op} {why}")
    print(
        f"\nvalidate-then-write [{name}]: {len(cases) + 1 + len(writing_operations(s))} refusal paths,"
        f" {len(failures)} not clean"
    )
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------------ OOM


def test_out_of_memory_refuses_every_write_typed_and_changes_nothing(kind):
    import redis

    with dedicated_server(kind) as server:
        raw = redis.Redis(port=server.port)
        s = populate(lambda config: MessageStore.from_url(server.url, config), raw)
        expected_pages, expected_stats = s.thread.list(limit=100), s.thread.stats()
        raw.config_set("maxmemory-policy", "noeviction")
        raw.config_set("maxmemory", 1)
        failures, texts = [], set()
        for op, call in writing_operations(s).items():
            before = keyspace(raw, s.namespace)
            try:
                call()
                failures.append(f"{op} succeeded while the server is out of memory")
            except errors.KVStoreError as exc:
                texts.add(f"{type(exc).__name__}: {exc}")
            except Exception as exc:
                failures.append(f"{op} raised {type(exc).__module__}.{type(exc).__name__}: {exc}")
            changed = keyspace_diff(before, keyspace(raw, s.namespace))
            if changed:
                failures.append(f"{op} changed {changed}")
        # Reads go on: read-only scripts declare no-writes, pages are native reads.
        assert s.thread.list(limit=100) == expected_pages
        assert s.thread.get(s.chunk_id).id == s.chunk_id
        assert s.thread.context() and s.thread.stats() == expected_stats
        # delete() frees memory, so it runs at the limit (its script declares allow-oom).
        s.thread.delete()
        assert keyspace(raw, s.namespace) == {}
        print(
            f"\nOOM [{kind}]: {len(writing_operations(s))} writes refused, delete allowed; errors seen: {sorted(texts)}"
        )
        assert not failures, "\n".join(failures)


def test_appends_up_to_the_memory_limit_are_whole_and_refusals_change_nothing(kind):
    """Fills a server to maxmemory with appends (rollovers included): the calls acknowledged are
    all stored, every refused one left the keyspace as it was, the layout holds throughout."""
    import redis

    with dedicated_server(kind) as server:
        raw = redis.Redis(port=server.port)
        namespace = fresh_namespace()
        config = StoreConfig(
            namespace=namespace, window_size=8, chunk_size=4, chunk_max_bytes=64 * 1024
        )
        thread = MessageStore.from_url(server.url, config).thread("fill")
        used = int(raw.info("memory")["used_memory"])
        raw.config_set("maxmemory-policy", "noeviction")
        raw.config_set("maxmemory", used + 2 * 1024 * 1024)
        acknowledged, refused, i = [], 0, 0
        while refused < 5:
            before = keyspace(raw, namespace)
            try:
                acknowledged += thread.append(
                    UserMessage(content=f"{i} " + "z" * 8000, otid=f"f{i}")
                )
            except errors.KVStoreError as exc:
                refused += 1
                assert "memory" in str(exc), exc
                assert keyspace_diff(before, keyspace(raw, namespace)) == []
            i += 1
            assert i < 5000, "never reached maxmemory"
        check_layout(raw, thread.keys, config)
        assert list(thread.iter()) == acknowledged
        print(
            f"\nOOM edge [{kind}]: {len(acknowledged)} appends of 8 KB acknowledged and stored under a"
            f" 2 MiB headroom, {refused} refused with the keyspace byte-identical"
        )
