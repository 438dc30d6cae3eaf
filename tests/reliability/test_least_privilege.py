"""Least privilege: kvstore runs as a user limited to its namespace's keys and the commands it
needs, and every denial reaches the caller as PermissionDenied.

The ACL lines are read from docs/RELIABILITY.md, so the documented lines are the tested ones, and
the commands kvstore sends are read from its code (every `redis.call` of every script, every native
command of the core, every script call and load of the executors: FCALL, FCALL_RO, FUNCTION
LOAD, EVALSHA, EVAL), so a new command without a documented permission fails here first.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import redis

from kvstore import AssistantMessage, StoreConfig, SummaryMessage, UserMessage, errors
from kvstore._engine.scripts import LIBRARY, SCRIPTS
from kvstore.admin import health, preload_library, preload_scripts

from ..support.layout_check import check_layout
from .support import dedicated_server, fresh_namespace, keyspace, keyspace_diff, thread_in_mode

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "app-secret"


def _documented_lines() -> list[str]:
    text = (ROOT / "docs" / "RELIABILITY.md").read_text(encoding="utf-8")
    return [
        ln.strip() for ln in text.splitlines() if ln.strip().startswith("ACL SETUSER kvstore-app ")
    ]


def documented_acl_line() -> str:
    """The user every deployment needs (the first ACL SETUSER line of docs/RELIABILITY.md)."""
    return _documented_lines()[0]


def readme_acl_args(namespace: str) -> list[str]:
    """The README's application user (its one ACL SETUSER line), as ACL SETUSER arguments."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    [line] = [
        ln.strip() for ln in text.splitlines() if ln.strip().startswith("ACL SETUSER kvstore-app ")
    ]
    return shlex.split(line.replace("<password>", PASSWORD).replace("<namespace>", namespace))[3:]


def test_the_readme_and_reliability_document_the_same_user():
    assert readme_acl_args("ns") == acl_args("ns")


def documented_additions() -> dict[str, str]:
    """The rules the other documented lines add (the EVAL path, the durability modes):
    {"+evalsha": line, "+waitaof": line, ...}."""
    return {rule: line for line in _documented_lines()[1:] for rule in shlex.split(line)[3:]}


def add_documented(admin: redis.Redis, rule: str, without: tuple[str, ...] = ()) -> None:
    """Applies the documented line that adds `rule`, minus the rules in `without`."""
    args = [arg for arg in shlex.split(documented_additions()[rule])[2:] if arg not in without]
    admin.execute_command("ACL", "SETUSER", *args)


def acl_args(namespace: str, *, without: tuple[str, ...] = ()) -> list[str]:
    """The documented ACL SETUSER arguments for `namespace`, minus the rules in `without`."""
    line = documented_acl_line().replace("<password>", PASSWORD).replace("<namespace>", namespace)
    args = shlex.split(line)[3:]  # past "ACL SETUSER kvstore-app"
    for rule in without:
        args.remove(rule)
    return args


def documented_commands() -> set[str]:
    return {rule[1:] for rule in acl_args("ns") if rule.startswith("+")}


CLIENT_METHODS = {
    "fcall": "fcall",
    "fcall_ro": "fcall_ro",
    "function_load": "function|load",
    "evalsha": "evalsha",
    "eval": "eval",
    "script_load": "script|load",
    "script_exists": "script|exists",
}


def commands_kvstore_sends() -> set[str]:
    """What the code sends: each script's redis.call, each command the core or the executor
    builds as a tuple (("HGET", ...), ("FCALL_RO", ...), ("FUNCTION LOAD", ...)), and any script
    call or load made with a client method (`client.fcall(...)`, `pipe.function_load(...)`)."""
    sent = set()
    for script in SCRIPTS.values():
        sent |= {
            c.lower() for c in re.findall(r"redis\.p?call\(\s*['\"]([A-Za-z]+)['\"]", script.source)
        }
        # A read that doubles as its key's type check (lua/includes/layout3_store.lua) names its
        # command as checked_read's second argument.
        sent |= {
            c.lower() for c in re.findall(r"checked_read\([^,()]+,\s*'([A-Z]+)'", script.source)
        }
    # The store and the engine's operations and executor (health checks and the command line's
    # maintenance commands are not the app user's).
    modules = [
        ROOT / "kvstore" / "store.py",
        *(p for p in sorted((ROOT / "kvstore" / "_engine").glob("*.py")) if p.name != "health.py"),
    ]
    for module in modules:
        source = module.read_text(encoding="utf-8")
        sent |= {
            c.lower().replace(" ", "|")
            for c in re.findall(r'\(\s*"([A-Z][A-Z_]*(?: [A-Z]+)?)"\s*,', source)
        }
        sent |= {CLIENT_METHODS[m] for m in re.findall(r"\.(\w+)\(", source) if m in CLIENT_METHODS}
    return sent


def load_rules() -> tuple[str, ...]:
    """The documented rules that let the user load kvstore's function library."""
    return tuple(r for r in ("+function|load",) if r in acl_args("ns"))


# The documented addition for the EVAL path, and the rule of it that lets the user put a script
# into the server's cache.
EVAL_RULE, EVAL_LOAD_RULE = "+evalsha", "+eval"


def test_the_documented_acl_grants_every_command_kvstore_sends():
    sent = commands_kvstore_sends()
    granted = documented_commands() | {rule[1:] for rule in documented_additions()}
    print(
        f"\nACL: kvstore sends {len(sent)} commands: {sorted(sent)};"
        f" the EVAL path and the durability modes add {sorted(documented_additions())}"
    )
    assert {"fcall", "fcall_ro", "function|load", "evalsha", "eval"} <= sent
    assert load_rules() == ("+function|load",) and EVAL_LOAD_RULE in documented_additions()
    assert not sent - granted, f"docs/RELIABILITY.md's ACL lines lack {sorted(sent - granted)}"
    # And they grant nothing kvstore no longer sends (the CLI's connection check sends PING).
    unused = documented_commands() - sent - {"ping"}
    assert not unused, (
        f"docs/RELIABILITY.md's ACL line grants {sorted(unused)}, which kvstore does not send"
    )


def make_user(
    admin: redis.Redis, namespace: str, name: str = "kvstore-app", without: tuple[str, ...] = ()
) -> None:
    args = acl_args(namespace, without=without)
    admin.execute_command("ACL", "SETUSER", name, *args)


# The sync clients the running test made, closed when it ends.
OPENED: list[redis.Redis] = []


@pytest.fixture(autouse=True)
def _close_clients():
    """Every sync client a test here makes is closed when the test ends. One left to the garbage
    collector (a client a caught exception's traceback holds is in a cycle) may have its socket
    finalized before the client closes it: a ResourceWarning, an error at the module's end."""
    yield
    while OPENED:
        OPENED.pop().close()


def _client(**kwargs) -> redis.Redis:
    client = redis.Redis(**kwargs)
    OPENED.append(client)
    return client


def app_client(server, name: str = "kvstore-app") -> redis.Redis:
    return _client(port=server.port, username=name, password=PASSWORD)


def integration_slice(thread) -> dict:
    """Every public operation once or more, each result checked; returns a few counts."""
    first = thread.append(
        UserMessage(content="What's the weather in Oslo?", otid="req-1"), turn_id="turn-1"
    )
    thread.start_turn("turn-1")
    replies = thread.append(
        [AssistantMessage(content=f"part {i} " + "w" * 400) for i in range(5)], turn_id="turn-1"
    )
    finished = thread.finish_turn("turn-1")
    assert (finished.reply_count, finished.first_sequence, finished.last_sequence) == (5, 2, 6)
    assert thread.append(UserMessage(content="again", otid="req-1")) == first  # otid replay
    stored = first + replies
    for t in range(2, 8):
        stored += thread.append(
            UserMessage(content=f"q{t} " + "x" * 300, otid=f"req-{t}"), turn_id=f"turn-{t}"
        )
        stored += thread.append(AssistantMessage(content=f"a{t}"), turn_id=f"turn-{t}")
    stored += thread.append(
        UserMessage(content="O" * 5000), turn_id="turn-big"
    )  # an oversized chunk
    assert list(thread.iter()) == stored
    assert thread.list(limit=5, order="desc").messages == stored[::-1][:5]
    assert thread.list(after=stored[2].id, limit=4).messages == stored[3:7]
    assert thread.list(before=stored[10].seq_id, limit=3).messages == stored[7:10]
    assert thread.list(turn_id="turn-1").messages == stored[:6]
    assert thread.get(stored[1].id) == stored[1]
    replaced = thread.replace(stored[1].id, AssistantMessage(content="part 0, corrected"))
    assert replaced.seq_id == stored[1].seq_id and thread.get(stored[1].id) == replaced
    stored[1] = replaced
    newest = thread.replace(stored[-2].id, AssistantMessage(content="a7, corrected"))
    stored[-2] = newest
    summary = thread.compact("the weather talk", last_sequence=12)
    assert isinstance(summary, SummaryMessage)
    context = thread.context()
    assert context[0] == summary and [m.seq_id for m in context[1:]] == [
        m.seq_id for m in stored if m.seq_id > 12
    ]
    removed = thread.remove_turn("turn-7")
    assert removed == 2
    stored = [m for m in stored if m.seq_id not in (stored[-3].seq_id, stored[-2].seq_id)]
    snapshot = thread.snapshot()
    assert snapshot.summary == summary
    stats = thread.stats()
    assert stats.stored_messages == len(list(thread.iter()))
    assert stats.summary_last_sequence == 12
    thread.delete()
    assert thread.stats().stored_messages == 0
    return {"messages": len(stored) + 1, "chunks": snapshot.stats.chunks}


CONFIG = dict(
    window_size=4, chunk_size=2, chunk_max_bytes=2048, retained_message_limit=4, thread_ttl=3600
)


def _denials(admin: redis.Redis) -> list[str]:
    def text(entry: dict, field: str) -> str:
        value = entry.get(field.encode(), entry.get(field))
        return value.decode() if isinstance(value, bytes) else str(value)

    return [f"{text(e, 'reason')} {text(e, 'object')}" for e in admin.execute_command("ACL", "LOG")]


def documented_user(server, scripting: str) -> tuple[redis.Redis, StoreConfig]:
    """An admin client of `server`, its documented application user made (with the EVAL
    addition for `scripting="eval"`) and its ACL log emptied, and the store's config."""
    admin = _client(port=server.port)
    namespace = fresh_namespace()
    make_user(admin, namespace)
    if scripting == "eval":
        add_documented(admin, EVAL_RULE)
    admin.execute_command("ACL", "LOG", "RESET")
    return admin, StoreConfig(namespace=namespace, scripting=scripting, **CONFIG)


@pytest.mark.parametrize("scripting", ["functions", "eval"])
def test_the_integration_slice_runs_as_the_least_privileged_user(kind, mode, scripting):
    with dedicated_server(kind) as server:
        admin, config = documented_user(server, scripting)
        with thread_in_mode(
            mode, server.url, config, "least-privilege", client=_client_for(mode, server)
        ) as thread:
            figures = integration_slice(thread)
            thread.append(UserMessage(content="kept"))
            check_layout(admin, thread.keys, config)
        # redis-py names itself with CLIENT SETINFO on connect and ignores a refusal: not needed.
        denials = [d for d in _denials(admin) if d != "command client|setinfo"]
        print(
            f"\nleast privilege [{kind}, {mode}, {scripting}]: {figures['messages']} messages, {figures['chunks']} chunks,"
            f" every operation as the ACL user; denials logged: {denials or 'none'}"
        )
        assert not denials


def _client_for(mode: str, server, name: str = "kvstore-app"):
    if mode == "sync":
        return app_client(server, name)
    import redis.asyncio

    return redis.asyncio.Redis(port=server.port, username=name, password=PASSWORD)


def test_denied_keys_and_commands_raise_permission_denied(kind):
    with dedicated_server(kind) as server:
        admin = _client(port=server.port)
        namespace = fresh_namespace()
        make_user(admin, namespace)
        client = app_client(server)
        from kvstore import MessageStore

        own = MessageStore(client, StoreConfig(namespace=namespace)).thread("mine")
        own.append(UserMessage(content="allowed"))
        outcomes = {}
        # Other namespaces, including one the pattern `<ns>:*` would have matched.
        for other in ("elsewhere", f"{namespace}:nested"):
            thread = MessageStore(client, StoreConfig(namespace=other)).thread("theirs")
            for name, call in {
                "script on a key outside the pattern (append)": lambda thread=thread: thread.append(
                    UserMessage(content="x")
                ),
                "read-only script outside the pattern (page plan)": lambda thread=thread: (
                    thread.list(after="message-x")
                ),
                "native reads outside the pattern (page plan)": lambda thread=thread: thread.list(
                    after=1
                ),
                "native command outside the pattern (stats)": thread.stats,
                "native command outside the pattern (newest page)": lambda thread=thread: (
                    thread.list(order="desc")
                ),
            }.items():
                with pytest.raises(errors.PermissionDenied) as caught:
                    call()
                outcomes[f"{other}: {name}"] = str(caught.value)[:70]
        # The library is gone, and the user may not load it: a PermissionDenied that says what
        # to do, never a silent failure.
        admin.execute_command(
            "ACL", "SETUSER", "kvstore-app", *(f"-{rule[1:]}" for rule in load_rules())
        )
        admin.function_flush()
        with pytest.raises(errors.PermissionDenied, match="kvstore preload-scripts") as caught:
            own.append(UserMessage(content="needs a load"))
        assert "function|load" in str(caught.value)
        as_admin = MessageStore(admin, StoreConfig(namespace=namespace)).thread("mine")
        assert [m.content for m in as_admin.iter()] == ["allowed"]
        print(f"\nPermissionDenied [{kind}]: {len(outcomes) + 1} denials, all typed")


def test_a_command_denied_inside_a_script_raises_permission_denied(kind):
    """A user whose ACL lacks a command an append runs before its first write: HMGET (the read of
    meta, made through redis.pcall) and TYPE (the check of the turns key, with a turn id)."""
    from kvstore import MessageStore

    with dedicated_server(kind) as server:
        admin = _client(port=server.port)
        failures = []
        for denied, turn_id in (("+hmget", None), ("+type", "turn-1")):
            namespace = fresh_namespace()
            thread = MessageStore(
                _client(port=server.port), StoreConfig(namespace=namespace)
            ).thread("t")
            thread.append(UserMessage(content="first"))
            make_user(admin, namespace, without=(denied,))
            limited = MessageStore(app_client(server), StoreConfig(namespace=namespace)).thread("t")
            before = keyspace(admin, namespace)
            try:
                limited.append(UserMessage(content="second"), turn_id=turn_id)
                failures.append(f"without {denied[1:]}: the append succeeded")
            except errors.PermissionDenied:
                pass
            except errors.KVStoreError as exc:
                failures.append(f"without {denied[1:]}: {type(exc).__name__}: {exc}")
            changed = keyspace_diff(before, keyspace(admin, namespace))
            if changed:
                failures.append(f"without {denied[1:]}: the refused append changed {changed}")
        print(
            f"\ndenied inside a script [{kind}]: 2 denials, {len(failures)} not PermissionDenied: {failures}"
        )
        assert not failures, "\n".join(failures)


def test_durability_fsync_runs_as_the_user_with_the_documented_addition():
    """WAITAOF exists from Redis 7.2 and Valkey 8: this runs on Valkey (Debian's Redis is 7.0)."""
    with dedicated_server("valkey", "--appendonly", "yes", "--appendfsync", "always") as server:
        admin = _client(port=server.port)
        namespace = fresh_namespace()
        make_user(admin, namespace)
        line = documented_additions()["+waitaof"]
        admin.execute_command("ACL", "SETUSER", *shlex.split(line)[2:])
        admin.execute_command("ACL", "LOG", "RESET")
        from kvstore import MessageStore

        store = MessageStore(
            app_client(server), StoreConfig(namespace=namespace, durability="fsync", **CONFIG)
        )
        figures = integration_slice(store.thread("durable"))
        denials = [d for d in _denials(admin) if d != "command client|setinfo"]
        print(
            f"\ndurability fsync as the ACL user [valkey]: {figures['messages']} messages; denials: {denials or 'none'}"
        )
        assert not denials


@pytest.mark.parametrize("scripting", ["functions", "eval"])
def test_preloaded_scripts_serve_a_user_without_load_permissions(kind, mode, scripting):
    """The documented lines without the rule that loads (`+function|load`, or `+eval` on the EVAL
    path): denied with PermissionDenied until an operator preloads as an admin, then every
    operation works; a restart without persistence loses what was loaded, and a new preload
    brings it back."""
    if scripting == "functions":
        without, flush, preload = (
            load_rules(),
            "function_flush",
            lambda admin: preload_library(admin),
        )
    else:
        without, flush, preload = (
            (EVAL_LOAD_RULE,),
            "script_flush",
            lambda admin: preload_scripts(admin),
        )

    def limited_user(admin: redis.Redis) -> None:
        make_user(admin, namespace, without=load_rules())
        if scripting == "eval":
            add_documented(admin, EVAL_RULE, without=without)

    def loaded(admin: redis.Redis) -> bool:
        report = health(admin)
        return (
            report.library_loaded
            if scripting == "functions"
            else report.scripts_loaded == len(SCRIPTS)
        )

    with dedicated_server(kind) as server:
        admin = _client(port=server.port)
        namespace = fresh_namespace()
        limited_user(admin)
        getattr(admin, flush)()
        config = StoreConfig(namespace=namespace, scripting=scripting, **CONFIG)
        with thread_in_mode(
            mode, server.url, config, "preloaded", client=_client_for(mode, server)
        ) as thread:
            with pytest.raises(errors.PermissionDenied) as before:
                thread.append(UserMessage(content="before the preload"))
            if scripting == "functions":
                assert "kvstore preload-scripts" in str(before.value)
            assert not loaded(admin) and admin.keys(f"{namespace}:*") == []
            preloaded = preload(admin)  # the operator, as an admin user
            if scripting == "functions":
                assert preloaded == LIBRARY.name
            else:
                assert preloaded == {name: script.sha for name, script in SCRIPTS.items()}
            assert loaded(admin)
            figures = integration_slice(thread)
            # A restart without persistence loses them: the app is denied until the operator
            # preloads again.
            server.restart()
            limited_user(admin)
            with pytest.raises(errors.PermissionDenied):
                thread.append(UserMessage(content="after a restart"))
            preload(admin)
            thread.append(UserMessage(content="after the preload"))
        print(
            f"\npreloaded [{kind}, {mode}, {scripting}]: loaded by the admin; the slice"
            f" ({figures['messages']} messages) ran as a user without {', '.join(without)}"
        )


def test_the_live_tail_forks_and_budgets_run_as_the_least_privileged_user(kind):
    """watch() on its own connection, publish() under a held turn, fork() into another thread of
    the namespace and a budgeted context, sync and async, as the documented user: nothing denied."""
    import asyncio

    from kvstore import AsyncMessageStore, MessageStore
    from kvstore.events import MessagesAdded, TurnFinished

    with dedicated_server(kind) as server:
        admin = _client(port=server.port)
        namespace = fresh_namespace()
        make_user(admin, namespace)
        admin.execute_command("ACL", "LOG", "RESET")
        config = StoreConfig(namespace=namespace, **CONFIG)

        def kinds_of(events) -> list[type]:
            return [type(e) for e in events]

        with MessageStore(app_client(server), config) as store:
            thread = store.thread("tail")
            lease = thread.hold_turn("turn-1")
            cursor = thread.publish(lease, "Hel")
            thread.append(AssistantMessage(content="Hello"), turn_id=lease)
            thread.finish_turn(lease)
            # Read on the watcher's own connection (XREAD), from the delta on.
            with thread.watch(after=cursor, block_ms=200) as watcher:
                seen = [next(watcher), next(watcher)]
            assert kinds_of(seen) == [MessagesAdded, TurnFinished]
            fork = thread.fork("tail-fork", at=1)
            assert [m.content for m in fork.iter()] == ["Hello"]
            assert [m.content for m in thread.context(max_tokens=1000)] == ["Hello"]

        async def async_side() -> list:
            client = redis.asyncio.Redis(
                port=server.port, username="kvstore-app", password=PASSWORD
            )
            async with AsyncMessageStore(client, config) as store:
                thread = store.thread("tail-async")
                lease = await thread.hold_turn("turn-1")
                cursor = await thread.publish(lease, "Hel")
                await thread.append(AssistantMessage(content="Hello"), turn_id=lease)
                await thread.finish_turn(lease)
                async with thread.watch(after=cursor, block_ms=200) as watcher:
                    seen = [await watcher.__anext__(), await watcher.__anext__()]
                fork = await thread.fork("tail-async-fork", at=1)
                assert [m.content async for m in fork.iter()] == ["Hello"]
                return seen

        assert kinds_of(asyncio.run(async_side())) == [MessagesAdded, TurnFinished]

        # Strict history checks: a checked append, a refusal, a replace and a turn removal.
        from kvstore import ToolCallMessage, ToolReturnMessage, errors

        strict = StoreConfig(namespace=namespace, history_checks="strict", **CONFIG)
        with MessageStore(app_client(server), strict) as store:
            thread = store.thread("checked")
            thread.start_turn("t")
            call = ToolCallMessage(tool_call={"name": "w", "arguments": "{}", "tool_call_id": "c1"})
            (stored_call,) = thread.append(call, turn_id="t")
            with pytest.raises(errors.HistoryConflict):
                thread.append(
                    ToolReturnMessage(status="success", tool_call_id="c2", tool_return="x")
                )
            thread.replace(stored_call.id, call)
            thread.append(
                ToolReturnMessage(status="success", tool_call_id="c1", tool_return="x"), turn_id="t"
            )
            assert thread.remove_turn("t") == 2 and thread.stats().history_checked
        denials = [d for d in _denials(admin) if d != "command client|setinfo"]
        print(
            f"\nleast privilege, live tail, fork and history checks [{kind}]: denials logged: {denials or 'none'}"
        )
        assert not denials


@pytest.mark.parametrize("scripting", ["functions", "eval"])
def test_owners_run_as_the_least_privileged_user(kind, scripting):
    """An owner's directory (listing, usage, quota, an owned fork, erasure), sync and async, as
    the documented user: the owner's keys match `<namespace>:{*` and nothing is denied."""
    import asyncio

    from kvstore import AsyncMessageStore, MessageStore

    with dedicated_server(kind) as server:
        admin, config = documented_user(server, scripting)
        with MessageStore(app_client(server), config) as store:
            chat = store.thread("a", owner="user-1")
            chat.set_info(title="first", metadata={"model": "small"})
            chat.append(UserMessage(content="hi"))
            chat.fork("b", at=1)
            store.set_owner_quota("user-1", threads=5)
            page = store.threads("user-1", where={"model": "small"})
            assert [t.thread_id for t in page.threads] == ["a"]
            assert store.owner_usage("user-1").threads == 2
            assert store.erase_owner("user-1").threads == 2

        async def async_side() -> int:
            client = redis.asyncio.Redis(
                port=server.port, username="kvstore-app", password=PASSWORD
            )
            async with AsyncMessageStore(client, config) as store:
                chat = store.thread("c", owner="user-2")
                await chat.append(UserMessage(content="hi"))
                assert (await chat.info()).messages == 1
                listed = await store.threads("user-2", order="created")
                assert [t.thread_id for t in listed.threads] == ["c"]
                return (await store.erase_owner("user-2")).messages

        assert asyncio.run(async_side()) == 1
        assert keyspace(admin, config.namespace) == {}
        denials = [d for d in _denials(admin) if d != "command client|setinfo"]
        print(
            f"\nleast privilege, owners [{kind}, {scripting}]: denials logged: {denials or 'none'}"
        )
        assert not denials
