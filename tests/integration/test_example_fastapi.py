"""examples/fastapi_chat end to end over HTTP: the embedded server (`python -m kvstore server`),
the app under `uvicorn --workers 2`, a turn posted to one worker and streamed as Server-Sent Events
by both, and a stream resumed with Last-Event-ID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis
import uvicorn  # noqa: F401  # the test extra's: the example runs under it

from kvstore.cli.process import free_port

from ..support import lifetime

ROOT = Path(__file__).resolve().parents[2]


def wait_until(check, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:  # not up yet
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("not up in time")
        time.sleep(0.1)


def read_events(response: httpx.Response, into: list[dict], until: str = "turn_finished") -> None:
    """Parses the SSE stream into `into` until an event of kind `until`."""
    event: dict = {}
    for line in response.iter_lines():
        if line == "":
            if "event" in event:
                into.append(event)
                if event["event"] == until:
                    return
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            event[name] = json.loads(value) if name == "data" else value


@pytest.fixture
def app_url(tmp_path):
    db_port, app_port = free_port(), free_port()
    started = []
    try:
        server = lifetime.Popen(
            [
                sys.executable,
                "-m",
                "kvstore",
                "server",
                "--data-dir",
                str(tmp_path / "data"),
                "--port",
                str(db_port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        started.append(server)
        client = redis.Redis(port=db_port)
        wait_until(client.ping)
        client.close()
        env = {
            **os.environ,
            "KVSTORE_URL": f"redis://127.0.0.1:{db_port}/0",
            "FAKE_MODEL_DELAY": "0.02",
        }
        app = lifetime.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "examples.fastapi_chat.app:app",
                "--workers",
                "2",
                "--port",
                str(app_port),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        started.append(app)
        url = f"http://127.0.0.1:{app_port}"
        wait_until(lambda: httpx.get(f"{url}/openapi.json").status_code == 200)
        yield url
    finally:
        for process in reversed(started):
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def test_a_turn_posted_to_one_worker_streams_from_both(app_url):
    # One SSE stream on each worker (the kernel hands each new connection to either).
    streams: dict[str, tuple[httpx.Client, httpx.Response]] = {}
    for _ in range(40):
        client = httpx.Client(timeout=30)
        response = client.send(
            client.build_request("GET", f"{app_url}/threads/chat-1/events", params={"after": "0"}),
            stream=True,
        )
        pid = response.headers["X-Worker-Pid"]
        if pid in streams:
            response.close()
            client.close()
        else:
            streams[pid] = (client, response)
        if len(streams) == 2:
            break
    assert len(streams) == 2, "uvicorn --workers 2 should serve from two processes"
    got: dict[str, list[dict]] = {pid: [] for pid in streams}
    readers = [
        threading.Thread(target=read_events, args=(response, got[pid]), daemon=True)
        for pid, (_, response) in streams.items()
    ]
    for reader in readers:
        reader.start()
    time.sleep(0.5)  # both watchers blocked on the server

    posted = httpx.post(
        f"{app_url}/threads/chat-1/messages", json={"content": "weather in Paris?"}, timeout=30
    )
    assert posted.status_code == 200, posted.text
    assert posted.json()["reply_count"] == 3
    for reader in readers:
        reader.join(30)
    for client, response in streams.values():
        response.close()
        client.close()

    first, second = got.values()
    assert first == second  # both workers' watchers: the same events, ids and all
    kinds = [e["event"] for e in first]
    deltas = [i for i, k in enumerate(kinds) if k == "delta"]
    assert kinds[:2] == ["messages_added", "turn_started"]
    assert kinds[-1] == "turn_finished" and first[-1]["data"]["outcome"] == "completed"
    assert (
        deltas and deltas[-1] < len(kinds) - 2
    )  # the final message, then finish: the terminal event
    stored = [m for e in first if e["event"] == "messages_added" for m in e["data"]["messages"]]
    assert [m["message_type"] for m in stored] == [
        "user_message",
        "tool_call_message",
        "tool_return_message",
        "assistant_message",
    ]
    text = "".join(
        e["data"]["message"]["content"]
        if isinstance(e["data"]["message"]["content"], str)
        else e["data"]["message"]["content"][0]["text"]
        for e in first
        if e["event"] == "delta" and e["data"]["message"]["message_type"] == "assistant_message"
    )
    assert text.strip() == "It is sunny and 21 degrees."
    arguments = "".join(
        e["data"]["message"]["tool_call"]["arguments"]
        for e in first
        if e["event"] == "delta" and e["data"]["message"]["message_type"] == "tool_call_message"
    )
    assert json.loads(arguments) == {"city": "Paris"}
    # The ids count the events, one after another.
    assert [int(e["id"].split("-")[0]) for e in first] == list(range(1, len(first) + 1))

    # A client that lost its connection after the 5th event reconnects with Last-Event-ID.
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "GET", f"{app_url}/threads/chat-1/events", headers={"Last-Event-ID": first[4]["id"]}
        ) as response,
    ):
        rest: list[dict] = []
        read_events(response, rest)
    assert rest == first[5:]
