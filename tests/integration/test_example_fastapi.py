"""examples/fastapi_chat end to end over HTTP: the embedded server (`python -m kvstore server`),
the app under `uvicorn --workers 2`, a turn posted to one worker and streamed as Server-Sent Events
by both, a stream resumed with Last-Event-ID, a message sent again (one turn), a long thread's
stream (its newest page, not its history), a server outage in the middle of a stream."""

from __future__ import annotations

import json
import threading
import time
import uuid

import httpx
import pytest
import uvicorn  # noqa: F401  # the examples extra's: the example runs under it

from kvstore import MessageStore, UserMessage

from ..support.example_app import deployment, read_events


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """One deployment for the tests that leave it as it was (each on its own thread)."""
    yield from deployment(tmp_path_factory.mktemp("app"))


@pytest.fixture
def own_app(tmp_path):
    """A deployment for a test that stops its server."""
    yield from deployment(tmp_path)


@pytest.fixture
def app_url(app):
    return app.url


def post(url: str, thread: str, content: str, otid: str | None = None) -> httpx.Response:
    body = {"content": content, "otid": otid or uuid.uuid4().hex}
    return httpx.post(f"{url}/threads/{thread}/messages", json=body, timeout=30)


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

    posted = post(app_url, "chat-1", "weather in Paris?")
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


def stored(app, thread_id: str) -> list:
    with MessageStore.from_url(app.db_url) as store:
        return list(store.thread(thread_id).iter())


def test_a_message_sent_again_is_one_turn_and_answers_its_result(app):
    first = post(app.url, "chat-2", "weather in Oslo?", otid="send-1")
    assert first.status_code == 200, first.text
    again = post(app.url, "chat-2", "weather in Oslo?", otid="send-1")
    assert again.status_code == 200, again.text
    assert first.json()["retried"] is False and again.json()["retried"] is True
    assert {**first.json(), "retried": True} == again.json()
    assert first.json()["turn_id"] == "turn-send-1" and first.json()["reply_count"] == 3
    assert len(stored(app, "chat-2")) == 4
    assert post(app.url, "chat-2", "and in Rome?", otid="send-2").json()["first_sequence"] == 6
    assert len(stored(app, "chat-2")) == 8


@pytest.mark.parametrize("content", [" ", "\u00a0", "  \n\t ", "?"])
def test_a_message_of_no_words_is_answered(app, content):
    # The fake model's question has no last word: it still answers, and a retry answers the same.
    thread = f"chat-blank-{uuid.uuid4().hex[:8]}"
    first = post(app.url, thread, content, otid="blank-1")
    assert first.status_code == 200, first.text
    assert first.json()["outcome"] == "completed" and first.json()["reply_count"] == 3
    again = post(app.url, thread, content, otid="blank-1")
    assert again.status_code == 200 and again.json()["outcome"] == "completed"
    assert [m.message_type for m in stored(app, thread)][-1] == "assistant_message"


def test_a_message_without_an_otid_is_refused(app):
    response = httpx.post(f"{app.url}/threads/chat-3/messages", json={"content": "hi"})
    assert response.status_code == 422
    assert stored(app, "chat-3") == []


@pytest.fixture
def slow_app(tmp_path):
    yield from deployment(tmp_path, model_delay=0.3)


def test_a_retry_takes_over_a_running_turn_and_each_message_is_stored_once(slow_app):
    app = slow_app
    answers: list[httpx.Response] = []
    first = threading.Thread(
        target=lambda: answers.append(post(app.url, "chat-4", "weather in Oslo?", otid="s-1"))
    )
    with (
        httpx.Client(timeout=30) as client,
        client.stream("GET", f"{app.url}/threads/chat-4/events") as response,
    ):
        first.start()
        events: list[dict] = []
        lines = response.iter_lines()
        read_events(lines, events, until="delta")  # the first producer is at work
        retry = post(app.url, "chat-4", "weather in Oslo?", otid="s-1")
        first.join(30)
        read_events(lines, events)
    assert retry.status_code == 200 and retry.json()["retried"] is False
    assert answers[0].status_code == 409 and "TurnFenced" not in answers[0].text
    leases = [e["data"]["lease"] for e in events if e["event"] == "turn_started"]
    assert leases == [1, 2]
    kinds = [m["message_type"] for m in (m.to_dict() for m in stored(app, "chat-4"))]
    assert kinds == [
        "user_message",
        "tool_call_message",
        "tool_return_message",
        "assistant_message",
    ]
    assert retry.json()["reply_count"] == 3


def test_a_long_threads_stream_starts_at_its_newest_page(app):
    with MessageStore.from_url(app.db_url) as store:
        thread = store.thread("long")
        for start in range(0, 20_000, 500):
            thread.append(
                [
                    UserMessage(content=f"message {i} " + "x" * 400)
                    for i in range(start, start + 500)
                ]
            )
    with (
        httpx.Client(timeout=30) as client,
        client.stream("GET", f"{app.url}/threads/long/events") as response,
    ):
        events: list[dict] = []
        lines = response.iter_lines()
        size = read_events(lines, events, until="messages_added")
        page = events[0]["data"]["messages"]
        assert [m["seq_id"] for m in page] == list(range(19_951, 20_001))
        assert events[0]["id"] == "20000"
        assert size < 40_000  # the page: 50 messages of about 500 bytes, not 20,000 of them
        assert post(app.url, "long", "weather in Oslo?").status_code == 200
        read_events(lines, events)
    added = [
        m["seq_id"]
        for e in events[1:]
        if e["event"] == "messages_added"
        for m in e["data"]["messages"]
    ]
    assert added == list(range(20_001, 20_005))


def test_a_server_outage_ends_the_stream_with_one_error_event_and_one_log_line(own_app):
    app = own_app
    assert post(app.url, "chat-5", "weather in Oslo?").status_code == 200
    with (
        httpx.Client(timeout=30) as client,
        client.stream("GET", f"{app.url}/threads/chat-5/events") as response,
    ):
        events: list[dict] = []
        lines = response.iter_lines()
        read_events(lines, events, until="messages_added")
        app.stop_server()
        read_events(lines, events, until="error")
        assert events[-1]["data"]["error"] == "ConnectionFailed"
        assert list(lines) == []  # the stream ends after it
    time.sleep(0.5)
    log = app.log_text()
    assert "Traceback" not in log
    assert log.count("stream of chat-5 ended: ConnectionFailed") == 1
    # A message sent meanwhile is refused (503) with a log line of its own at most.
    assert post(app.url, "chat-5", "again?").status_code == 503
    # Back up: the browser's reconnect (Last-Event-ID) goes on where it was.
    app.start_server()
    # Sent again until answered, as the page does (a stale pooled connection may answer 503).
    answers = [post(app.url, "chat-5", "weather in Rome?", otid="after") for _ in range(2)]
    while answers[-1].status_code == 503 and len(answers) < 20:
        time.sleep(0.2)
        answers.append(post(app.url, "chat-5", "weather in Rome?", otid="after"))
    assert answers[-1].status_code == 200, answers[-1].text
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "GET", f"{app.url}/threads/chat-5/events", headers={"Last-Event-ID": events[0]["id"]}
        ) as response,
    ):
        rest: list[dict] = []
        read_events(response, rest, until="messages_added")
    resumed = rest[0]["data"]["messages"]
    assert [m["seq_id"] for m in resumed] == [5, 6, 7, 8]  # the message the outage refused: none
    assert resumed[0]["content"] == "weather in Rome?" and rest[0]["data"]["paged"]
    assert "Traceback" not in app.log_text()


def test_a_graceful_stop_with_a_stream_open_ends_it(own_app):
    """uvicorn waits for open connections on SIGTERM; an SSE stream never ends by itself, so the
    README's command bounds the wait (--timeout-graceful-shutdown) and the stream is cut."""
    with (
        httpx.Client(timeout=30) as client,
        client.stream("GET", f"{own_app.url}/threads/chat-6/events") as response,
    ):
        read_events(response, [], until="messages_added")
        assert own_app.stop_app() < 15
    assert own_app.app.returncode == 0
    assert "Traceback" not in own_app.log_text()


def test_the_examples_extra_is_what_the_example_imports():
    """`pip install -e ".[examples]"` (kvstore and FastAPI, uvicorn) is enough to run it."""
    import ast
    import sys
    import tomllib

    from ..support.example_app import ROOT

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = {r.split(">")[0].split("[")[0] for r in extra["examples"]}
    assert named == {"fastapi", "uvicorn"}
    imported = set()
    for path in (ROOT / "examples" / "fastapi_chat").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"__future__"}
    # pydantic comes with kvstore, starlette with fastapi.
    assert third_party <= {"kvstore", "fastapi", "pydantic"}, third_party


def test_a_malformed_cursor_ends_the_stream_with_the_requests_error(app):
    with httpx.Client(timeout=30) as client:
        with client.stream(
            "GET", f"{app.url}/threads/chat-7/events", params={"after": "not a cursor"}
        ) as response:
            events: list[dict] = []
            read_events(response, events, until="error")
        assert events[-1]["data"]["status"] == 400  # the page stops: no reconnect loop
        assert events[-1]["data"]["error"] == "InvalidCursor"
        too_long = client.get(f"{app.url}/threads/chat-7/events", params={"limit": 5000})
        assert too_long.status_code == 422
    assert "Traceback" not in app.log_text()


def test_a_users_sidebar_titles_deletes_and_forks(app):
    url, user = app.url, {"user": "http-user"}
    for thread, content in (("u-1", "weather in Oslo?"), ("u-2", "weather in Rome?")):
        body = {"content": content, "otid": uuid.uuid4().hex}
        response = httpx.post(
            f"{url}/threads/{thread}/messages", json=body, params=user, timeout=30
        )
        assert response.status_code == 200, response.text
        time.sleep(0.005)
    listed = httpx.get(f"{url}/threads", params=user).json()
    assert [(t["thread_id"], t["title"], t["messages"]) for t in listed["threads"]] == [
        ("u-2", "weather in Rome?", 4),
        ("u-1", "weather in Oslo?", 4),
    ]
    fork = httpx.post(
        f"{url}/threads/u-1/fork", params=user, json={"at": 2, "new_thread_id": "u-1b"}
    )
    assert fork.status_code == 200, fork.text
    assert httpx.delete(f"{url}/threads/u-2", params=user).status_code == 204
    listed = httpx.get(f"{url}/threads", params={**user, "limit": 1}).json()
    assert [t["title"] for t in listed["threads"]] == ["weather in Oslo? (fork)"]
    rest = httpx.get(f"{url}/threads", params={**user, "after": listed["next_cursor"]}).json()
    assert [t["thread_id"] for t in rest["threads"]] == ["u-1"] and rest["next_cursor"] is None
    with MessageStore.from_url(app.db_url) as store:
        assert store.thread("u-1b", owner="http-user").stats().stored_messages == 2
        assert store.thread("u-2", owner="http-user").stats().stored_messages == 0
        assert store.thread("u-1").stats().stored_messages == 0  # another user's id: not this
    bad = httpx.get(f"{url}/threads", params={"user": "no spaces"})
    assert bad.status_code == 400
