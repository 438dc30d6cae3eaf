"""health(): the server's settings, a warning for each one that voids a kvstore guarantee, and
each one the user may not read named in `unchecked`; sync and asyncio read the same report."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio
import redis.asyncio.retry
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvstore import AsyncMessageStore, HealthReport, MessageStore, StoreConfig, UserMessage, errors
from kvstore._engine.health import health
from kvstore._engine.scripts import LIBRARY, SCRIPTS

from .support import dedicated_server, free_port_client
from .test_least_privilege import PASSWORD, load_rules, make_user, readme_acl_args


def store_health(mode: str, port: int, **client_kwargs) -> HealthReport:
    """`store.health()` of a store over a client of `port`, sync or awaited."""
    if mode == "sync":
        with MessageStore(redis.Redis(port=port, **client_kwargs)) as store:
            return store.health()

    async def read() -> HealthReport:
        async with AsyncMessageStore(redis.asyncio.Redis(port=port, **client_kwargs)) as store:
            return await store.health()

    return asyncio.run(read())


def test_a_well_configured_server_reports_no_warning(kind, mode):
    with dedicated_server(kind, "--appendonly", "yes", "--appendfsync", "always") as server:
        report = store_health(mode, server.port)
        print(
            f"\nhealth [{kind}, {mode}], appendonly yes, appendfsync always, noeviction:\n{report}"
        )
        assert isinstance(report, HealthReport)
        assert report == health(redis.Redis(port=server.port))
        assert report.complete and report.unchecked == ()
        assert report.server == kind
        assert report.version and report.version[0].isdigit()
        assert report.lua is True
        assert (report.appendonly, report.appendfsync, report.maxmemory_policy) == (
            True,
            "always",
            "noeviction",
        )
        assert report.aof_last_write_ok is True
        assert report.ok and report.warnings == ()
        assert report.library == LIBRARY.name and report.library_loaded is False
        assert report.scripts_loaded == 0 and report.scripts_total == len(SCRIPTS)
        # The text says how scripts load, not "0 of N cached" as if something were missing.
        text = str(report)
        assert "scripts cached" not in text and f"0 of {len(SCRIPTS)}" not in text
        assert f"library          {LIBRARY.name} not loaded yet: the first write loads it" in text
        assert "eval scripts     none cached: each loads on its first call" in text
        store = MessageStore.from_url(server.url)
        store.thread("t").append(UserMessage(content="loads the library"))
        store.close()
        loaded = str(store_health(mode, server.port))
        assert f"library          {LIBRARY.name} loaded" in loaded
        assert "eval scripts     none cached: the function library serves the calls" in loaded


SETTINGS = [
    # (CONFIG SET pairs, a phrase the one warning must hold)
    ({"maxmemory-policy": "allkeys-lru"}, "maxmemory-policy is allkeys-lru"),
    ({"maxmemory-policy": "volatile-ttl"}, "keys that carry a TTL"),
    ({"appendonly": "no", "save": ""}, "no persistence"),
    ({"appendonly": "no", "save": "3600 1"}, "snapshots only"),
    ({"appendfsync": "everysec"}, "appendfsync is everysec"),
    ({"appendfsync": "no"}, "appendfsync is no"),
]


@pytest.mark.parametrize(("settings", "phrase"), SETTINGS, ids=[p for _, p in SETTINGS])
def test_each_setting_that_voids_a_guarantee_is_warned_about(kind, settings, phrase):
    with dedicated_server(kind, "--appendonly", "yes", "--appendfsync", "always") as server:
        admin = redis.Redis(port=server.port)
        for name, value in settings.items():
            admin.config_set(name, value)
        report = health(admin)
        print(f"\nhealth [{kind}] with {settings}: {list(report.warnings)}")
        assert not report.ok
        assert len(report.warnings) == 1, report.warnings
        assert phrase in report.warnings[0]


def test_a_user_denied_config_info_and_eval_gets_a_report_not_an_error(kind):
    with dedicated_server(kind) as server:
        admin = redis.Redis(port=server.port)
        make_user(
            admin, "app", without=load_rules()
        )  # no FUNCTION LOAD; CONFIG and INFO are never granted
        report = health(redis.Redis(port=server.port, username="kvstore-app", password=PASSWORD))
        print(f"\nhealth [{kind}] as a user without function|load:\n{report}")
        assert report.server == kind and report.version == server.version()  # from HELLO
        assert report.lua is None and report.appendonly is None
        assert report.library_loaded is False and report.scripts_loaded is None
        assert any("CONFIG GET is denied" in u for u in report.unchecked)
        # The admin sees the library and the script cache the app user relies on.
        assert health(admin).library_loaded is False
        thread = MessageStore.from_url(server.url).thread("t")
        thread.stats()  # native reads only
        assert health(admin).library_loaded is False
        thread.append(UserMessage(content="loads the library"))
        assert health(admin).library_loaded is True and health(admin).scripts_loaded == 0


def test_the_readme_user_gets_what_it_can_check_and_what_it_cannot(kind, mode):
    """The README's ACL line: INFO, CONFIG GET, EVAL, FUNCTION LIST and SCRIPT EXISTS are denied.
    The report still names the server and its version (HELLO) and whether the library is loaded
    (FCALL_RO, refused before anything runs), finds nothing wrong, and lists what it could not
    read, and why: not ok, not complete, no warning."""
    with dedicated_server(kind, "--appendonly", "yes", "--appendfsync", "always") as server:
        admin = redis.Redis(port=server.port)
        admin.execute_command("ACL", "SETUSER", "kvstore-app", *readme_acl_args("app"))
        app = {"username": "kvstore-app", "password": PASSWORD}
        before = store_health(mode, server.port, **app)
        print(f"\nhealth [{kind}, {mode}] as the README's user, before the first write:\n{before}")
        assert (before.server, before.version) == (kind, server.version())
        assert before.library_loaded is False and before.lua is None
        assert before.warnings == () and not before.ok and not before.complete
        assert before.maxmemory_policy is None and before.appendfsync is None
        assert any(
            u.startswith("whether Lua runs: EVAL is denied") and "not loaded yet" in u
            for u in before.unchecked
        )
        settings = [u for u in before.unchecked if "CONFIG GET is denied to this user" in u]
        assert len(settings) == 1 and "INFO is denied to this user" in settings[0]
        assert all(
            name in settings[0]
            for name in ("maxmemory-policy", "appendonly", "appendfsync", "save")
        )
        assert "unchecked: " in str(before) and "a user allowed INFO and CONFIG GET" in str(before)
        assert "warning:" not in str(before)
        url = f"redis://kvstore-app:{PASSWORD}@127.0.0.1:{server.port}/0"
        with MessageStore.from_url(url, StoreConfig(namespace="app")) as store:
            store.thread("t").append(UserMessage(content="loads the library"))  # +function|load
        after = store_health(mode, server.port, **app)
        assert after.library_loaded is True and after.lua is True  # the library's functions are Lua
        assert len(after.unchecked) == 1 and after.unchecked[0] == settings[0]
        assert not any("write flag" in line for line in str(after).splitlines())
        # A setting that voids a guarantee, where the user can see it, is a warning even so:
        # with INFO allowed, the eviction policy and AOF come from INFO (CONFIG is often disabled
        # on managed services).
        admin.config_set("maxmemory-policy", "allkeys-lru")
        admin.execute_command("ACL", "SETUSER", "kvstore-app", "+info")
        with_info = store_health(mode, server.port, **app)
        assert (with_info.maxmemory_policy, with_info.appendonly) == ("allkeys-lru", True)
        assert (
            len(with_info.warnings) == 1
            and "maxmemory-policy is allkeys-lru" in with_info.warnings[0]
        )
        assert with_info.unchecked == ("appendfsync, save: CONFIG GET is denied to this user",)
        assert with_info.aof_last_write_ok is True


def test_fakeredis_is_reported_as_in_process():
    store = MessageStore.in_memory()
    report = health(store.client)
    assert report.server == "fakeredis" and report.lua is True and report.library_loaded is False
    store.thread("t").append(UserMessage(content="loads the library"))
    assert health(store.client).library_loaded is True
    assert not report.ok


def test_fakeredis_is_reported_as_in_process_by_the_async_store():
    async def read() -> tuple[HealthReport, HealthReport]:
        async with AsyncMessageStore.in_memory() as store:
            before = await store.health()
            await store.thread("t").append(UserMessage(content="loads the library"))
            return before, await store.health()

    before, after = asyncio.run(read())
    assert before.server == "fakeredis" and before.lua is True and before.library_loaded is False
    assert after.library_loaded is True and not after.ok and "fakeredis" in after.warnings[0]


def test_an_unreachable_server_raises_connection_failed(mode):
    """As every other call does when no connection can be used (a ServerError too, so the CLI's
    exit status 1 stays)."""
    client = free_port_client(socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    with pytest.raises(errors.ConnectionFailed, match="cannot reach"):
        if mode == "sync":
            MessageStore(client).health()
        else:
            port = client.connection_pool.connection_kwargs["port"]
            asyncio.run(
                AsyncMessageStore(
                    redis.asyncio.Redis(
                        port=port,
                        socket_connect_timeout=0.2,
                        retry=redis.asyncio.retry.Retry(NoBackoff(), 0),
                    )
                ).health()
            )
