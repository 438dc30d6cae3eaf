"""Delivery guarantees at the edges: a call whose outcome is unknown, and the packaged scripts."""

from __future__ import annotations

import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvstore import MessageStore, StoreConfig, UserMessage, errors
from kvstore._scripts import SCRIPT_NAMES

ROOT = Path(__file__).resolve().parent.parent


def test_a_timed_out_write_is_outcome_unknown_and_a_resend_stores_once(server, namespace, server_only):
    admin = redis.Redis.from_url(server.url)
    config = StoreConfig(namespace=namespace)
    impatient = redis.Redis.from_url(server.url, socket_timeout=0.1, retry=Retry(NoBackoff(), 0))
    store = MessageStore(impatient, config)
    thread = store.thread("paused")
    thread.append(UserMessage(content="warm up"))  # loads the script before the pause
    admin.execute_command("CLIENT", "PAUSE", 600, "WRITE")
    try:
        with pytest.raises(errors.OutcomeUnknown, match="Re-send the same call"):
            thread.append(UserMessage(content="maybe", otid="req-7"))
    finally:
        # Whether the paused call runs once the pause ends or was dropped with its connection,
        # the re-send below must leave exactly one copy.
        time.sleep(0.7)
    patient = MessageStore.from_url(server.url, config).thread("paused")
    resent = patient.append(UserMessage(content="maybe", otid="req-7"))
    messages = list(patient.iter())
    assert [m.otid for m in messages] == [None, "req-7"]
    assert resent == [messages[1]]


def test_the_wheel_carries_every_script(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
    )
    (wheel,) = tmp_path.glob("kvstore-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in SCRIPT_NAMES:
        assert f"kvstore/lua/{name}.lua" in names
    for include in (ROOT / "lua" / "includes").glob("*.lua"):
        assert f"kvstore/lua/includes/{include.name}" in names
