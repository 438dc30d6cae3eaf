"""The `kvstore` command line, driven as a user would, against real servers."""

from __future__ import annotations

import json
import subprocess
import sys

import redis

from kvstore import AssistantMessage, MessageStore, StoreConfig, UserMessage

from .test_migration import write_layout_1


def kvstore(*args: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvstore", *args], capture_output=True, text=True, input=input, timeout=timeout
    )


def test_demo_on_the_embedded_server_prints_its_table(tmp_path):
    result = kvstore("demo", "--workers", "2", "--threads", "2", "--turns", "12", "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 0, result.stderr
    assert "embedded Valkey on redis://127.0.0.1:" in result.stdout
    for row in ("threads", "turns", "appends/s", "append p50 / p99", "newest page of 50", "memory over the run"):
        assert row in result.stdout
    assert "gap-free" in result.stdout
    assert (tmp_path / "data" / "appendonlydir").is_dir()  # AOF on, data under the directory


def test_demo_against_a_url(server, server_only):
    result = kvstore("demo", "--url", server.url, "--workers", "2", "--threads", "2", "--turns", "6")
    assert result.returncode == 0, result.stderr
    assert "2 workers, 12 turns on 2 shared threads" in result.stdout
    assert "gap-free" in result.stdout and "embedded Valkey" not in result.stdout


def test_server_runs_in_the_foreground_and_prints_its_url(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "kvstore", "server", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        line = process.stdout.readline()
        url = line.split(" on ")[1].split()[0]
        assert redis.Redis.from_url(url).ping()
    finally:
        process.terminate()
        process.wait(10)
    # Stopping the command stops the server it started.
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
        raise AssertionError("the embedded server outlived `kvstore server`")
    except redis.ConnectionError:
        pass


def test_inspect_export_import(server, namespace, tmp_path, server_only):
    store = MessageStore.from_url(server.url, StoreConfig(namespace=namespace, window_size=8, chunk_size=4))
    thread = store.thread("chat-1")
    thread.start_turn("t1")
    stored = thread.append([UserMessage(content=f"m{i}", otid=f"o{i}") for i in range(20)], turn_id="t1")
    stored += thread.append(AssistantMessage(content="B" * 2_000_000))
    result = kvstore("inspect", "chat-1", "--url", server.url, "--namespace", namespace)
    assert result.returncode == 0, result.stderr
    assert "messages stored   21" in result.stdout
    assert "chunk        1  1..4  4 messages" in result.stdout
    assert "large       21" in result.stdout
    assert "t1: replies from 1, open" in result.stdout

    out = tmp_path / "chat.jsonl"
    result = kvstore("export", "chat-1", "--url", server.url, "--namespace", namespace, "-o", str(out))
    assert result.returncode == 0, result.stderr
    lines = out.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [m.to_dict() for m in stored]

    for _ in range(2):  # importing twice stores nothing twice: ids and otids are kept
        result = kvstore("import", "chat-2", str(out), "--url", server.url, "--namespace", namespace)
        assert result.returncode == 0, result.stderr
    copy = list(store.thread("chat-2").iter())
    assert [m.to_dict() for m in copy] == [m.to_dict() for m in stored]


def test_migrate_finds_layout_1_threads_and_finishes_them(server, namespace, server_only):
    client = redis.Redis.from_url(server.url)
    store = MessageStore.from_url(server.url, StoreConfig(namespace=namespace))
    expected = {t: write_layout_1(client, store.thread(t).keys, 700) for t in ("old-a", "old-b")}
    result = kvstore("migrate", "--url", server.url, "--namespace", namespace)
    assert result.returncode == 0, result.stderr
    assert "migrated 2 threads" in result.stdout
    for thread_id, messages in expected.items():
        thread = store.thread(thread_id)
        assert thread.stats().layout_version == 2
        assert list(thread.iter()) == messages
    result = kvstore("migrate", "--url", server.url, "--namespace", namespace)
    assert "no layout-1 threads" in result.stdout


def test_errors_print_one_line_and_exit_non_zero(server, namespace, server_only):
    cases = [
        ("inspect", "x", "--url", "notaurl://nowhere"),
        ("inspect", "x", "--url", "redis://127.0.0.1:1/0"),
        ("inspect", "no-such-thread", "--url", server.url, "--namespace", namespace),
        ("inspect", "bad{id}", "--url", server.url),
        ("import", "t", "/no/such/file.jsonl", "--url", server.url),
    ]
    for args in cases:
        result = kvstore(*args)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert result.stderr.startswith("kvstore: ") and result.stderr.count("\n") == 1, (args, result.stderr)
    assert "not found" in kvstore(*cases[2]).stderr
    assert "cannot reach" in kvstore(*cases[1]).stderr


def test_health_and_preload_scripts(server, server_only, tmp_path):
    result = kvstore("health", "--url", server.url, "--json")
    assert result.returncode == 2, result.stderr  # the test servers run without persistence
    report = json.loads(result.stdout)
    assert report["lua"] is True and any("persist" in w or "AOF" in w or "appendonly" in w for w in report["warnings"])
    result = kvstore("health", "--data-dir", str(tmp_path))  # the embedded server: AOF, fsync every second
    assert result.returncode == 2, result.stdout + result.stderr
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "everysec" in warnings[0]
    result = kvstore("preload-scripts", "--url", server.url)
    assert result.returncode == 0, result.stderr
    from kvstore._scripts import SCRIPTS

    assert {line.split()[1] for line in result.stdout.splitlines()} == set(SCRIPTS)
    assert all(redis.Redis.from_url(server.url).script_exists(*(s.sha for s in SCRIPTS.values())))
