"""health(): the server's settings, and a warning for each one that voids a kvstore guarantee."""

from __future__ import annotations

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvstore import MessageStore, UserMessage, errors
from kvstore._engine.health import HealthReport, health
from kvstore._engine.scripts import LIBRARY, SCRIPTS

from .support import dedicated_server, free_port_client
from .test_least_privilege import PASSWORD, load_rules, make_user


def test_a_well_configured_server_reports_no_warning(kind):
    with dedicated_server(kind, "--appendonly", "yes", "--appendfsync", "always") as server:
        report = health(redis.Redis(port=server.port))
        print(f"\nhealth [{kind}], appendonly yes, appendfsync always, noeviction:\n{report}")
        assert isinstance(report, HealthReport)
        assert report.server == kind
        assert report.version and report.version[0].isdigit()
        assert report.lua is True
        assert (report.appendonly, report.appendfsync, report.maxmemory_policy) == (True, "always", "noeviction")
        assert report.aof_last_write_ok is True
        assert report.ok and report.warnings == ()
        assert report.library == LIBRARY.name and report.library_loaded is False
        assert report.scripts_loaded == 0 and report.scripts_total == len(SCRIPTS)


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
        make_user(admin, "app", without=load_rules())  # no FUNCTION LOAD; CONFIG and INFO are never granted
        report = health(redis.Redis(port=server.port, username="kvstore-app", password=PASSWORD))
        print(f"\nhealth [{kind}] as the least-privileged user:\n{report}")
        assert report.server == "unknown" and report.version is None
        assert report.lua is None and report.appendonly is None
        assert report.library_loaded is None and report.scripts_loaded is None
        assert any("CONFIG GET denied" in w for w in report.warnings)
        # The admin sees the library and the script cache the app user relies on.
        assert health(admin).library_loaded is False
        thread = MessageStore.from_url(server.url).thread("t")
        thread.stats()  # native reads only
        assert health(admin).library_loaded is False
        thread.append(UserMessage(content="loads the library"))
        assert health(admin).library_loaded is True and health(admin).scripts_loaded == 0


def test_fakeredis_is_reported_as_in_process():
    store = MessageStore.in_memory()
    report = health(store.client)
    assert report.server == "fakeredis" and report.lua is True and report.library_loaded is False
    store.thread("t").append(UserMessage(content="loads the library"))
    assert health(store.client).library_loaded is True
    assert not report.ok


def test_an_unreachable_server_raises_server_error():
    client = free_port_client(socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    with pytest.raises(errors.ServerError, match="cannot reach"):
        health(client)
