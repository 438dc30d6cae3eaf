"""The direct append (lua/includes/append_direct.lua) against the general path it skips.

Every append call a store sends to one thread is sent again, argument for argument, to a second
thread on the same server through the library without the direct path. Replies and every key the
two threads hold must be equal: the direct path makes exactly the writes the general path makes,
and refuses (by handing over) everything it does not cover. The workload mixes what takes the
direct path (single appends and batches into the open chunk, with and without otids) with what
must not (closes, oversized records, turns, replays, conflicts, repeats, a foreign value at the
open chunk's name)."""

from __future__ import annotations

import contextlib
import random
import time

import pytest
import redis

from kvstore import AssistantMessage, StoreConfig, UserMessage
from kvstore._engine.scripts import LIBRARY
from kvstore.errors import KVStoreError

from ..conftest import make_sync_store

DIRECT_CALL = "do local reply = append_direct(KEYS, ARGV); if reply then return reply end end "
GENERAL_NAME = LIBRARY.name + "_general"
DATE = "2024-05-01T12:00:00Z"
SEND = redis.Redis.execute_command  # unrecorded, whatever the test patches
# The calls sent to both threads: appends, and the turns' holds and finishes they run under.
MIRRORED = ("_append", "_start_turn", "_finish_turn")


def load_general_library(client: redis.Redis) -> None:
    assert DIRECT_CALL in LIBRARY.source, "the append body no longer calls append_direct this way"
    source = LIBRARY.source.replace(DIRECT_CALL, "").replace(LIBRARY.name, GENERAL_NAME)
    client.function_load(source, replace=True)


class Twin:
    """Sends each append call the store makes to thread A again to thread B, through the
    general path; keeps both replies."""

    def __init__(self, client: redis.Redis, namespace: str, a: str, b: str) -> None:
        self.client, self.a, self.b = client, "{" + a + "}", "{" + b + "}"
        self.namespace = namespace
        self.calls: list[tuple] = []

    def states(self) -> tuple[dict, dict]:
        """Both threads' keys (:func:`state`)."""
        return state(self.client, f"{self.namespace}:{self.a}"), state(
            self.client, f"{self.namespace}:{self.b}"
        )

    def on_b(self, command: tuple) -> tuple:
        keys = int(command[2])
        renamed = [str(key).replace(self.a, self.b) for key in command[3 : 3 + keys]]
        function = str(command[1]).replace(LIBRARY.name, GENERAL_NAME)
        return ("FCALL", function, keys, *renamed, *command[3 + keys :])

    def send_b(self, command: tuple):
        try:
            return SEND(self.client, *self.on_b(command))
        except redis.ResponseError as error:
            return ("error", str(error).replace(self.b, self.a))


def recorder(sent: list[tuple], names: tuple[str, ...] = MIRRORED):
    """A stand-in for redis.Redis.execute_command that keeps each call of the functions `names`
    ends (the mirrored ones) and its reply in `sent`."""

    def recording(client, *command, **options):
        reply = SEND(client, *command, **options)
        if command and str(command[0]).upper() == "FCALL" and str(command[1]).endswith(names):
            sent.append((command, reply))
        return reply

    return recording


def twin_threads(backend, raw_client: redis.Redis, config: StoreConfig, name: str):
    """A store (its library loaded by a first append elsewhere), its thread `name`-a, and the
    Twin that sends its calls to `name`-b through the general path."""
    load_general_library(raw_client)
    store = make_sync_store(backend, config)
    store.thread(f"{name}-warm").append(UserMessage(content="loads the library"))
    twin = Twin(raw_client, config.namespace, f"{name}-a", f"{name}-b")
    return store, store.thread(f"{name}-a"), twin


def run_a(client: redis.Redis, command: tuple):
    try:
        return SEND(client, *command)
    except redis.ResponseError as error:
        return ("error", str(error))


def state(client: redis.Redis, tag: str) -> dict:
    """Every key of the thread (`tag`: its namespace and hash tag, the prefix of its keys' names)
    by its name without the tag: type, value and deadline (meta's, none, or one of its own). The incarnation (set from the server's clock at the first event) is
    compared by presence only."""
    found = {}
    for key in client.scan_iter(match=f"{tag}*", count=1000):
        name = key.decode().replace(tag, "{}")
        deadline = client.execute_command("PEXPIRETIME", key)
        meta_deadline = client.execute_command("PEXPIRETIME", name.split("{}")[0] + tag + ":meta")
        expiry = (
            "meta's" if deadline == meta_deadline else ("none" if deadline == -1 else "its own")
        )
        found[name + " deadline"] = expiry
        kind = client.type(key).decode()
        if kind == "string":
            value = client.get(key)
        elif kind == "hash":
            value = client.hgetall(key)
            if name.endswith(":meta") and b"born" in value:
                value[b"born"] = b"<set>"
            for field in value:
                if field.endswith(b"\texpires"):  # a lease's end, in each call's server time
                    value[field] = b"<set>"
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            value = [
                (entry_id, {f: (b"<set>" if f == b"g" else v) for f, v in fields.items()})
                for entry_id, fields in client.xrange(key)
            ]
        else:
            value = kind
        found[name] = (kind, value)
    return found


def text(rng: random.Random, size: int) -> str:
    return "".join(rng.choice("abcdefgh ") for _ in range(size))


def message(rng: random.Random, n: int, otid: str | None = None, size: int | None = None):
    cls = UserMessage if n % 2 else AssistantMessage
    body = text(rng, size if size is not None else rng.randint(5, 500))
    return cls(id=f"message-d{n}", date=DATE, content=body, otid=otid)


def one_call(thread, rng: random.Random, n: int, step: int, lease=None) -> None:
    """One append of the workload's mix (a refusal is compared like a reply); `lease`: the turn
    the workload holds now, if any."""
    roll = rng.random()
    turn = None
    if lease is not None and roll < 0.3:
        batch = [message(rng, n + i) for i in range(rng.randint(1, 2))]
        with contextlib.suppress(KVStoreError):
            thread.append(batch, turn_id=lease)
        return
    if roll < 0.45:
        batch = [message(rng, n)]
    elif roll < 0.6:
        batch = [message(rng, n + i, otid=f"otid-{n + i}") for i in range(rng.randint(1, 4))]
    elif roll < 0.75:
        batch = [message(rng, n + i) for i in range(rng.randint(2, 7))]
    elif roll < 0.8:
        batch = [message(rng, n, size=rng.randint(2500, 4000))]  # past chunk_max_bytes
    elif roll < 0.85:
        # A repeated otid, or an otid stored already: refused on both paths.
        batch = [message(rng, n, otid="otid-0"), message(rng, n + 1, otid="otid-0")]
    elif roll < 0.9:
        batch = [message(rng, n, otid=f"otid-{rng.randint(0, max(n, 1))}")]
    else:
        turn = f"turn-{step // 20}"
        batch = [message(rng, n + i) for i in range(rng.randint(1, 3))]
    with contextlib.suppress(KVStoreError):
        thread.append(batch, turn_id=turn)


@pytest.mark.parametrize(("seed", "ttl"), [(1, None), (2, None), (3, None), (4, 3600), (5, 3600)])
def test_the_direct_append_writes_what_the_general_path_writes(
    backend, server_only, namespace, raw_client, monkeypatch, seed, ttl
):
    """With a ttl, every key of both threads carries meta's deadline after every call."""
    load_general_library(raw_client)
    config = StoreConfig(
        namespace=namespace,
        chunk_size=8,
        chunk_max_bytes=3000,
        retained_message_limit=30,
        thread_ttl=ttl,
    )
    store = make_sync_store(backend, config)
    store.thread("direct-warm").append(UserMessage(content="loads the library"))  # not piped
    thread = store.thread("direct-a")
    twin = Twin(raw_client, namespace, "direct-a", "direct-b")
    sent: list[tuple] = []
    recording = recorder(sent)

    rng = random.Random(seed)
    lease = None
    hsetnx_before = raw_client.info("commandstats").get("cmdstat_hsetnx", {}).get("calls", 0)
    monkeypatch.setattr(redis.Redis, "execute_command", recording)
    try:
        for step in range(160):
            sent.clear()
            if rng.random() < 0.1 and twin.calls:
                # A call sent again (a retry): a replay on both paths.
                command, _ = rng.choice(twin.calls)
                sent.append((command, run_a(raw_client, command)))
            elif step % 40 == 5:
                lease = thread.hold_turn(f"held-{step}")
            elif step % 40 == 30 and lease is not None:
                thread.finish_turn(lease)
                lease = None
            else:
                one_call(thread, rng, 8 * step, step, lease)
            for command, reply in sent:
                twin.calls.append((command, reply))
                assert twin.send_b(command) == reply, step
            if step % 20 == 19:
                a, b = twin.states()
                assert a == b, step
    finally:
        monkeypatch.undo()
        store.close()
    a, b = twin.states()
    assert a == b
    hsetnx = raw_client.info("commandstats").get("cmdstat_hsetnx", {}).get("calls", 0)
    assert hsetnx - hsetnx_before >= 20, "the single appends did not take the direct path"


def test_a_foreign_value_at_the_open_chunk_is_refused_and_nothing_written(
    backend, server_only, namespace, raw_client
):
    """The direct path's first writes (the id's HSETNX, then the APPENDs) are taken back when the
    open chunk's string is not what meta accounts for."""
    store = make_sync_store(backend, StoreConfig(namespace=namespace))
    try:
        thread = store.thread("foreign")
        thread.append(UserMessage(content="first"))
        data_key = f"{namespace}:{{foreign}}:open:d"
        raw_client.append(data_key, b"planted")
        before = state(raw_client, f"{namespace}:{{foreign}}")
        with pytest.raises(Exception, match="holds"):
            thread.append(UserMessage(id="message-refused", date=DATE, content="second"))
        assert state(raw_client, f"{namespace}:{{foreign}}") == before
        assert raw_client.hget(f"{namespace}:{{foreign}}:ids", "message-refused") is None
    finally:
        store.close()


def test_keys_the_direct_path_makes_on_a_thread_with_a_ttl_carry_its_deadline(
    backend, server_only, namespace, raw_client
):
    """The direct path sets no deadline on keys it did not make: the ones it makes (the otid
    map, a new open chunk, the id map of a thread that stored nothing, a stream gone) get
    meta's, and every key of the thread carries it after each call."""
    store = make_sync_store(
        backend, StoreConfig(namespace=namespace, chunk_size=4, thread_ttl=3600)
    )
    prefix = f"{namespace}:{{ttl}}"

    def every_key_carries_meta_deadline() -> None:
        meta = raw_client.execute_command("PEXPIRETIME", f"{prefix}:meta")
        assert meta > 0
        for key in raw_client.scan_iter(match=f"{prefix}*", count=1000):
            assert raw_client.execute_command("PEXPIRETIME", key) == meta, key

    def direct_appends() -> int:
        stats = raw_client.info("commandstats").get("cmdstat_hsetnx", {})
        return stats.get("calls", 0)

    try:
        thread = store.thread("ttl")
        thread.append(UserMessage(content="in a turn"), turn_id="t1")  # the general path
        assert thread.remove_turn("t1") == 1
        assert raw_client.exists(f"{prefix}:ids") == 0  # the thread stores nothing now
        before = direct_appends()
        thread.append(UserMessage(content="first again"))  # makes the id map
        every_key_carries_meta_deadline()
        thread.append(UserMessage(content="with an otid", otid="o-1"))  # makes the otid map
        every_key_carries_meta_deadline()
        for i in range(4):  # the last closes the open chunk (the general path)
            thread.append(UserMessage(content=f"m{i}"))
        thread.append(UserMessage(content="opens a chunk"))  # makes the open chunk's strings
        every_key_carries_meta_deadline()
        raw_client.delete(f"{prefix}:events")
        thread.append(UserMessage(content="makes the stream again"))
        every_key_carries_meta_deadline()
        assert raw_client.xlen(f"{prefix}:events") == 1
        assert direct_appends() - before >= 4, "the appends did not take the direct path"
    finally:
        store.close()


def test_an_append_under_a_held_turn_takes_the_direct_path_and_renews_the_lease(
    backend, server_only, namespace, raw_client
):
    """A single append under a live lease is stored by the direct path (its id's HSETNX) and
    moves the lease's end, as the general path does; a stale lease is still fenced."""
    from kvstore import errors

    store = make_sync_store(backend, StoreConfig(namespace=namespace, turn_lease=30))
    turns = f"{namespace}:{{held}}:turns"
    try:
        thread = store.thread("held")
        thread.append(UserMessage(content="counts the first event"))
        lease = thread.hold_turn("t1")
        ends = int(raw_client.hget(turns, "t1\texpires"))
        hsetnx = raw_client.info("commandstats").get("cmdstat_hsetnx", {}).get("calls", 0)
        time.sleep(0.01)
        (stored,) = thread.append(AssistantMessage(content="under the lease"), turn_id=lease)
        assert raw_client.info("commandstats")["cmdstat_hsetnx"]["calls"] == hsetnx + 1
        assert int(raw_client.hget(turns, "t1\texpires")) > ends
        assert [m.id for m in thread.list(turn_id="t1").messages] == [stored.id]
        newer = thread.hold_turn("t1")  # another worker takes the turn over
        with pytest.raises(errors.TurnFenced):
            thread.append(AssistantMessage(content="from the old holder"), turn_id=lease)
        thread.append(AssistantMessage(content="from the new holder"), turn_id=newer)
        thread.finish_turn(newer)
        assert thread.finish_turn("t1").reply_count == 2
    finally:
        store.close()


def test_closes_take_the_direct_path_and_write_what_the_general_path_writes(
    backend, server_only, namespace, raw_client, monkeypatch
):
    """Without a ttl or retention to run, an append that closes the open chunk (a single message,
    or a batch split by the close) is stored by the direct path: no general path's `gen`
    HINCRBY, and both threads equal after each call. A key of another kind where the chunk goes
    hands the call to the general path, which refuses it with nothing written."""
    store, thread, twin = twin_threads(
        backend, raw_client, StoreConfig(namespace=namespace, chunk_size=4), "close"
    )
    sent: list[tuple] = []
    recording = recorder(sent)

    def hincrby_calls() -> int:
        return raw_client.info("commandstats").get("cmdstat_hincrby", {}).get("calls", 0)

    rng = random.Random(7)
    commands: list[list] = []
    monkeypatch.setattr(redis.Redis, "execute_command", recording)
    try:
        direct_closes = 0
        for step in range(40):
            sent.clear()
            count = 1 if step % 3 else rng.randint(2, 3)
            batch = [message(rng, 10 * step + i, size=rng.randint(5, 200)) for i in range(count)]
            chunks = raw_client.zcard(f"{namespace}:{{close-a}}:chunks")
            before = hincrby_calls()
            thread.append(batch)
            closed = raw_client.zcard(f"{namespace}:{{close-a}}:chunks") - chunks
            direct_closes += closed
            # (The thread's first append takes the general path: it makes the thread.)
            assert closed <= 1 and (step == 0 or hincrby_calls() == before), step
            for command, reply in sent:
                assert twin.send_b(command) == reply, step
                commands.append(list(command))
            a, b = twin.states()
            assert a == b, step
        assert direct_closes >= 10
        # Ids and otids with the manifest's framing characters (no kvstore client sends
        # them; the scripts escape them): both paths write the same lines.
        at = 3 + int(commands[-1][2])
        single = next(c for c in reversed(commands) if len(c) == at + 9)
        batch = next(c for c in reversed(commands) if len(c) > at + 9)
        for n, command in enumerate((single, batch)):
            for q in range((len(command) - at - 4) // 5):
                command[at + 4 + 5 * q] = f"tab\t{n}.{q}"
                command[at + 5 + 5 * q] = f"new\nline\r{n}.{q}\x00" if q % 2 == 0 else ""
            assert run_a(raw_client, tuple(command)) == twin.send_b(tuple(command))
            a, b = twin.states()
            assert a == b
            assert f"tab%09{n}.0".encode() in raw_client.get(f"{namespace}:{{close-a}}:open:m")
        meta = raw_client.hgetall(f"{namespace}:{{close-a}}:meta")
        for _ in range(4 - int(meta[b"open_count"])):
            thread.append(UserMessage(content="fills the open chunk"))
        meta = raw_client.hgetall(f"{namespace}:{{close-a}}:meta")
        planted = f"{namespace}:{{close-a}}:chunk:{int(meta[b'open_first'])}:d"
        raw_client.set(planted, b"foreign")
        before = state(raw_client, f"{namespace}:{{close-a}}")
        with pytest.raises(KVStoreError, match="must create a new key"):
            thread.append(UserMessage(content="would close the open chunk"))
        assert state(raw_client, f"{namespace}:{{close-a}}") == before
    finally:
        monkeypatch.undo()
        store.close()


def test_a_batch_that_opens_the_open_chunk_and_closes_it_writes_what_the_general_path_writes(
    backend, server_only, namespace, raw_client, monkeypatch
):
    """A call that finds the open chunk empty (its messages removed with their turn: meta keeps no
    open_* field) opens it at the call's first sequence; when the same batch fills and closes it,
    the closed chunk starts there."""
    store, thread, twin = twin_threads(
        backend, raw_client, StoreConfig(namespace=namespace, chunk_size=4), "reopen"
    )
    sent: list[tuple] = []
    monkeypatch.setattr(redis.Redis, "execute_command", recorder(sent, (*MIRRORED, "_remove_turn")))
    rng = random.Random(11)
    try:
        thread.append([message(rng, i, size=100) for i in range(4)])
        for round in range(3):
            n = 100 * (round + 1)
            thread.append([message(rng, n + i, size=100) for i in range(2)], turn_id=f"gone-{n}")
            thread.remove_turn(f"gone-{n}")
            meta = raw_client.hgetall(f"{namespace}:{{reopen-a}}:meta")
            assert b"open_count" not in meta and b"open_first" not in meta, meta
            thread.append([message(rng, n + 10 + i, size=100) for i in range(8)])
        for command, reply in sent:
            assert twin.send_b(command) == reply
    finally:
        monkeypatch.undo()
        store.close()
    a, b = twin.states()
    assert a == b
    index = raw_client.zrange(f"{namespace}:{{reopen-a}}:chunks", 0, -1, withscores=True)
    assert [int(m.split(b":")[0]) for m, _ in index] == [int(score) for _, score in index]


WRITES = (*MIRRORED, "_remove_turn", "_replace", "_compact", "_retain", "_renew_turn")


def mixed_write(
    thread, rng: random.Random, n: int, stored: list[str], turns: list[str], compact: bool
) -> None:
    """One write of any kind the store makes: appends of every shape (into the open chunk,
    closing it, past chunk_max_bytes, under a turn), a turn removed (or retracted and written
    again, which can leave the open chunk empty for the batch after it), a message replaced, and when `compact`
    says so a compaction (retention runs after it: the direct path closes no chunk from then
    on)."""
    roll = rng.random()
    with contextlib.suppress(KVStoreError):
        if roll < 0.55:
            size = rng.choice([5, 120, 600, 1700]) if rng.random() < 0.3 else None
            count = 1 if rng.random() < 0.5 else rng.randint(2, 6)
            batch = [
                message(rng, n + i, otid=f"otid-{n + i}" if rng.random() < 0.3 else None, size=size)
                for i in range(count)
            ]
            turn = rng.choice([None, None, f"turn-{n % 3}", f"turn-{n}"])
            thread.append(batch, turn_id=turn)
            stored += [m.id for m in batch]
            if turn:
                turns.append(turn)
        elif roll < 0.65:
            # A regenerated answer: the turn just written retracted, and written again.
            turn = f"regenerated-{n}"
            thread.append([message(rng, n + i) for i in range(rng.randint(1, 3))], turn_id=turn)
            thread.remove_turn(turn)
            batch = [message(rng, n + 10 + i) for i in range(rng.randint(1, 6))]
            thread.append(batch, turn_id=rng.choice([turn, None]))
            stored += [m.id for m in batch]
        elif roll < 0.75 and turns:
            thread.remove_turn(rng.choice(turns))
        elif roll < 0.95 and stored:
            thread.replace(
                rng.choice(stored[-12:]), message(rng, n, size=rng.choice([5, 300, 1700]))
            )
        elif stored and compact:
            last = thread.stats().next_sequence - 1
            thread.compact(f"summary {n}", rng.randint(max(1, last - 12), last), tokens=10)


@pytest.mark.parametrize(
    ("seed", "options"),
    [(21, {}), (23, {"events": False}), (24, {"thread_ttl": 3600})],
)
def test_every_write_sent_to_both_paths_leaves_the_threads_equal(
    backend, server_only, namespace, raw_client, monkeypatch, seed, options
):
    """Every write call (appends, turns, removals, replacements, compactions and the retention
    they start) sent to thread A through the library and to thread B through the general path
    alone: after each call, replies and every key of both threads are equal, whatever state the
    edits leave the open chunk in."""
    load_general_library(raw_client)
    sizes = {
        "window_size": 4,
        "chunk_size": 3,
        "chunk_max_bytes": 1500,
        "retained_message_limit": 5,
    }
    config = StoreConfig(namespace=namespace, **{**sizes, **options})
    store = make_sync_store(backend, config)
    store.thread("mixed-warm").append(UserMessage(content="loads the library"))
    thread = store.thread("mixed-a")
    twin = Twin(raw_client, namespace, "mixed-a", "mixed-b")
    sent: list[tuple] = []
    monkeypatch.setattr(redis.Redis, "execute_command", recorder(sent, WRITES))
    rng = random.Random(seed)
    stored: list[str] = []
    turns: list[str] = []
    try:
        for step in range(120):
            sent.clear()
            mixed_write(thread, rng, 10 * step, stored, turns, compact=step >= 80)
            for command, reply in sent:
                assert twin.send_b(command) == reply, step
            a, b = twin.states()
            assert a == b, step
    finally:
        monkeypatch.undo()
        store.close()
