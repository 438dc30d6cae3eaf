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

from kvstore import AppendResult, MessageStore, StoreConfig, UserMessage, errors
from kvstore._engine.scripts import SCRIPT_NAMES

ROOT = Path(__file__).resolve().parents[2]


def test_a_timed_out_write_is_outcome_unknown_and_a_resend_stores_once(
    server, namespace, server_only
):
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


def test_append_tells_a_replay_and_sets_its_ids_on_the_callers_messages(make_thread):
    thread = make_thread()
    model = UserMessage(content="a model")
    as_dict = {"message_type": "user_message", "content": "a dict"}
    first = thread.append([model, as_dict])
    assert isinstance(first, AppendResult) and isinstance(first, list) and first.replayed is False
    # The caller's own messages carry the ids that were the call's token, set before sending.
    assert [model.id, as_dict["id"]] == [m.id for m in first]
    assert "id" in model.model_fields_set and model.seq_id is None and model.date is None
    again = thread.append([model, as_dict])
    assert again.replayed is True and again == first
    with_otid = thread.append(UserMessage(content="c", otid="req-9"))
    assert with_otid.replayed is False
    assert thread.append(UserMessage(content="c", otid="req-9")).replayed is True
    assert [m.content for m in thread.iter()] == ["a model", "a dict", "c"]
    # A new message with the same content is a new message.
    assert thread.append(UserMessage(content="a model")).replayed is False
    assert thread.stats().stored_messages == 4


def test_get_by_otid(make_thread):
    thread = make_thread(window_size=4, chunk_size=2)
    stored = thread.append([UserMessage(content=f"m{i}", otid=f"o-{i}") for i in range(12)])
    thread.append(UserMessage(content="no otid"))
    for i in (0, 5, 11):  # in chunks and in the window
        assert thread.get_by_otid(f"o-{i}") == stored[i]
    with pytest.raises(errors.MessageNotFound, match="otid 'o-99'"):
        thread.get_by_otid("o-99")
    with pytest.raises(errors.InvalidCursor):
        thread.get_by_otid("")


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
