"""Loading: kvstore's function library is loaded by the first call that finds it missing, and
every call goes on when the server loses it (FUNCTION FLUSH, a restart without persistence),
between calls, while several workers run, and on the durable path. scripting="eval" still
calls each script by SHA; a server that knows no functions is served by that path; another
version of the library loaded alongside is never called.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis

from kvstore import MessageStore, StoreConfig, UserMessage, errors
from kvstore._engine.scripts import LIBRARY, SCRIPTS

from ..reliability.support import (
    binary_of,
    dedicated_server,
    fresh_namespace,
    server_kinds,
    thread_in_mode,
)
from ..reliability.test_script_flush import CONFIG, workload
from ..support.servers import ServerProcess


def library_loaded(client) -> bool:
    return bool(client.function_list(library=LIBRARY.name))


def calls(client, *names: str) -> int:
    """How many times the server ran these commands (INFO commandstats), failed ones included."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in names)


def failed(client, name: str) -> int:
    """How many of them replied with an error."""
    return int(client.info("commandstats").get(f"cmdstat_{name}", {}).get("failed_calls", 0))


def error_replies(client) -> int:
    return int(client.info("stats")["total_error_replies"])


@pytest.fixture(params=server_kinds())
def kind(request) -> str:
    return request.param


def test_the_first_call_on_an_empty_server_loads_the_library(kind, mode):
    with dedicated_server(kind) as server:
        admin = redis.Redis(port=server.port)
        assert not library_loaded(admin)
        config = StoreConfig(namespace=fresh_namespace(), **CONFIG)
        with thread_in_mode(mode, server.url, config, "first") as thread:
            stored = thread.append([UserMessage(content=f"m{i}") for i in range(20)])
            # An id cursor: page_plan (a sequence cursor is planned with native reads).
            assert thread.list(before=stored[-1].id, limit=5).messages == stored[-6:-1]
            assert library_loaded(admin)
            loads = calls(admin, "function|load")
            for i in range(10):
                thread.append(UserMessage(content=f"n{i}"))
            assert calls(admin, "function|load") == loads
        sent = {
            name: calls(admin, name)
            for name in ("fcall", "fcall_ro", "function|load", "evalsha", "eval")
        }
        print(
            f"\nfirst call on an empty server [{kind}, {mode}]: library {LIBRARY.name} loaded; commands {sent},"
            f" of which failed: fcall {failed(admin, 'fcall')} (the first, function not found)"
        )
        # One FCALL found no function; the load and the call again; 10 appends; the page plan.
        assert sent["function|load"] == 1 and failed(admin, "fcall") == 1
        assert (sent["fcall"], sent["fcall_ro"], failed(admin, "fcall_ro")) == (12, 1, 0)
        assert sent["evalsha"] == sent["eval"] == 0


def test_function_flush_between_calls_never_fails_a_call(make_thread, raw_client, backend):
    thread = make_thread("flushed", **CONFIG)
    figures = workload(thread, 120, seed=3, before_each=raw_client.function_flush)
    print(
        f"\nFUNCTION FLUSH before each call [{backend}]: {figures['steps']} calls,"
        f" {len(figures['failures'])} failed; state equals the model"
    )
    assert not figures["failures"], "\n".join(figures["failures"][:10])
    thread.start_turn("after")  # the workload may end on native reads: one more script call
    assert library_loaded(raw_client)


WORKERS = 4


def test_function_flush_racing_several_workers_never_fails_a_call(kind, mode):
    with dedicated_server(kind) as server:
        admin = redis.Redis(port=server.port)
        stop, flushes = threading.Event(), [0]

        def flusher() -> None:
            control = redis.Redis(port=server.port)
            while not stop.is_set():
                control.function_flush()
                flushes[0] += 1
                time.sleep(0.003)

        results: list[dict] = []

        def worker(w: int) -> None:
            config = StoreConfig(namespace=fresh_namespace(), **CONFIG)
            with thread_in_mode(mode, server.url, config, f"worker-{w}") as thread:
                results.append(workload(thread, 150, seed=10 + w))

        loads = calls(admin, "function|load")
        background = threading.Thread(target=flusher)
        workers = [threading.Thread(target=worker, args=(w,)) for w in range(WORKERS)]
        background.start()
        try:
            for t in workers:
                t.start()
            for t in workers:
                t.join()
        finally:
            stop.set()
            background.join()
        failures = [f for r in results for f in r["failures"]]
        print(
            f"\nFUNCTION FLUSH racing {WORKERS} workers [{kind}, {mode}]: {len(results)} workers ran"
            f" {sum(r['steps'] for r in results)} calls while {flushes[0]} flushes ran;"
            f" {calls(admin, 'function|load') - loads} FUNCTION LOADs; {len(failures)} calls failed"
        )
        assert len(results) == WORKERS
        assert not failures, "\n".join(failures[:10])
        assert flushes[0] > 50


def test_a_restart_without_persistence_loads_the_library_again(kind, mode):
    with dedicated_server(kind) as server:
        admin = redis.Redis(port=server.port)
        config = StoreConfig(namespace=fresh_namespace())
        with thread_in_mode(mode, server.url, config, "restarted") as thread:
            thread.append(UserMessage(content="before"))
            server.restart()  # save "" and appendonly no: the data and the library are gone
            assert not library_loaded(admin)
            message = UserMessage(content="after")
            try:
                stored = thread.append(message)
            except errors.OutcomeUnknown:  # the restart closed the connection the call went on
                stored = thread.append(message)
            assert stored[0].seq_id == 1  # a new thread: nothing persisted
            assert [m.content for m in thread.iter()] == ["after"]
            assert library_loaded(admin)


def test_a_restart_with_persistence_keeps_the_library(kind):
    with dedicated_server(kind, "--appendonly", "yes", "--appendfsync", "always") as server:
        config = StoreConfig(namespace=fresh_namespace())
        with thread_in_mode("sync", server.url, config, "kept") as thread:
            thread.append(UserMessage(content="before"))
        server.restart()
        admin = redis.Redis(port=server.port)
        assert library_loaded(admin)
        with thread_in_mode("sync", server.url, config, "kept") as thread:
            thread.append(UserMessage(content="after"))
            assert [m.content for m in thread.iter()] == ["before", "after"]
        assert calls(admin, "function|load") == 0 and failed(admin, "fcall") == 0


def test_the_durable_path_loads_the_library_after_function_flush(kind, mode):
    """durability="replicated": the call and WAIT go on one connection; a missing function is
    loaded on that pipeline and the call is sent again. The replica receives the library with
    the writes, so reads (FCALL_RO) can be served by it."""
    binary = binary_of(kind)
    primary = ServerProcess(f"{kind}-primary", binary).start()
    replica = ServerProcess(
        f"{kind}-replica", binary, ["--replicaof", "127.0.0.1", str(primary.port)]
    ).start()
    try:
        admin = redis.Redis(port=primary.port)
        deadline = time.monotonic() + 10
        while admin.info("replication").get("slave0", {}).get("state") != "online":
            assert time.monotonic() < deadline, "the replica did not connect"
            time.sleep(0.05)
        namespace = fresh_namespace()
        config = StoreConfig(
            namespace=namespace,
            durability="replicated",
            durability_timeout_ms=5000,
            window_size=4,
            chunk_size=2,
        )
        with thread_in_mode(mode, primary.url, config, "durable") as thread:
            stored = []
            for i in range(6):
                admin.function_flush()
                stored += thread.append(UserMessage(content=f"m{i}", otid=f"o{i}"))
            admin.function_flush()
            thread.compact("summary", last_sequence=3)
            assert thread.append(UserMessage(content="again", otid="o2")) == [stored[2]]  # a replay
        assert [m.seq_id for m in stored] == [1, 2, 3, 4, 5, 6]
        replica_client = redis.Redis(port=replica.port)
        assert library_loaded(replica_client)
        reader = MessageStore.from_url(
            replica.url, StoreConfig(namespace=namespace, window_size=4, chunk_size=2)
        )
        # An older page from an id cursor: page_plan by FCALL_RO.
        page = reader.thread("durable").list(before=stored[4].id, limit=2)
        assert [m.seq_id for m in page.messages] == [3, 4] and calls(
            replica_client, "fcall_ro"
        ) >= 1
    finally:
        replica.cleanup()
        primary.cleanup()


def test_scripting_eval_calls_the_scripts_by_sha(make_thread, raw_client, server_only, backend):
    thread = make_thread("by-sha", scripting="eval", **CONFIG)
    before = {name: calls(raw_client, name) for name in ("fcall", "fcall_ro", "evalsha", "eval")}
    raw_client.function_flush()
    figures = workload(
        thread, 60, seed=4, before_each=raw_client.script_flush
    )  # NOSCRIPT each call
    sent = {name: calls(raw_client, name) - before[name] for name in before}
    print(
        f"\nscripting='eval' [{backend}]: {figures['steps']} calls after SCRIPT FLUSH each, commands {sent}"
    )
    assert not figures["failures"], "\n".join(figures["failures"][:10])
    assert sent["fcall"] == sent["fcall_ro"] == 0 and sent["evalsha"] > 0 and sent["eval"] > 0
    assert not library_loaded(raw_client)


def _other_version() -> str:
    """A library of another kvstore version: same function name suffixes, another digest, and
    functions that fail loudly if they are ever called."""
    name = "kvstore_000000000000"
    registrations = "\n".join(
        f"redis.register_function{{function_name = '{name}_{script}',"
        f" callback = function() return redis.error_reply('KVS_LAYOUT called the other version') end,"
        f" flags = {{{', '.join(repr(flag) for flag in SCRIPTS[script].flags)}}}}}"
        for script in SCRIPTS
    )
    return f"#!lua name={name}\n{registrations}\n"


def test_another_version_of_the_library_alongside_is_never_called(make_thread, raw_client, backend):
    raw_client.function_flush()
    raw_client.function_load(_other_version())
    thread = make_thread("versions", **CONFIG)
    figures = workload(thread, 60, seed=5)
    assert not figures["failures"], "\n".join(figures["failures"][:10])
    names = sorted(library[1].decode() for library in raw_client.function_list(library="kvstore_*"))
    print(
        f"\nanother version alongside [{backend}]: libraries {names}; {figures['steps']} calls, none failed"
    )
    assert names == sorted(["kvstore_000000000000", LIBRARY.name])


@pytest.mark.parametrize(
    "renamed",
    [("FCALL", "FCALL_RO", "FUNCTION"), ("FUNCTION",)],
    ids=["no functions", "no FUNCTION LOAD (a proxy)"],
)
def test_a_server_without_functions_is_served_by_the_eval_path(kind, mode, renamed):
    disabled = [arg for command in renamed for arg in ("--rename-command", command, "")]
    with dedicated_server(kind, *disabled) as server:
        admin = redis.Redis(port=server.port)
        config = StoreConfig(namespace=fresh_namespace(), **CONFIG)
        with thread_in_mode(mode, server.url, config, "old") as thread:
            store = thread._store
            assert store.functions
            thread.append(UserMessage(content="first"))
            assert not store.functions  # remembered by this store
            errors_before = error_replies(admin)
            for i in range(5):
                thread.append(UserMessage(content=f"m{i}", otid=f"o{i}"))
            assert error_replies(admin) == errors_before  # no FCALL sent again
            assert [m.content for m in thread.iter()] == ["first"] + [f"m{i}" for i in range(5)]
        print(
            f"\nwithout {', '.join(renamed)} [{kind}, {mode}]: the first call fell back to EVAL,"
            f" {calls(admin, 'evalsha')} EVALSHA and {calls(admin, 'eval')} EVAL sent, no error reply after it"
        )


def test_a_function_error_still_maps_to_its_typed_error(make_thread, backend):
    thread = make_thread("errors")
    thread.start_turn("t1")
    stored = thread.append(UserMessage(content="a"), turn_id="t1")
    thread.finish_turn("t1")
    with pytest.raises(errors.TurnFinished):
        thread.append(UserMessage(content="late"), turn_id="t1")
    with pytest.raises(errors.TurnNotFound):
        thread.finish_turn("no-such-turn")
    with pytest.raises(errors.MessageNotFound):
        thread.replace("message-unknown", UserMessage(content="b"))
    assert thread.list().messages == stored
