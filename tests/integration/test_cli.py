"""The `kvstore` command line, driven as a user would, against real servers."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from kvstore import (
    AssistantMessage,
    MessageStore,
    StoreConfig,
    ToolCallMessage,
    ToolReturnMessage,
    UserMessage,
    errors,
)
from kvstore._engine.tokens import estimated_tokens
from kvstore.cli.process import _can_listen
from kvstore.cli.server import DEFAULT_PORT, EmbeddedServer, data_dir_server

from ..support import lifetime
from .test_migration import write_layout_1

_opened: list[redis.Redis | MessageStore] = []


def connect(url: str, **options) -> redis.Redis:
    """A client on `url`, closed at the end of the test (its server may be gone by then)."""
    _opened.append(redis.Redis.from_url(url, **options))
    return _opened[-1]


def open_store(url: str, config: StoreConfig) -> MessageStore:
    """A store on `url`, closed at the end of the test."""
    _opened.append(MessageStore.from_url(url, config))
    return _opened[-1]


@pytest.fixture(autouse=True)
def _close_opened():
    yield
    while _opened:
        _opened.pop().close()


def kvstore(
    *args: str, input: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvstore", *args],
        capture_output=True,
        text=True,
        input=input,
        timeout=timeout,
    )


def test_demo_on_the_embedded_server_prints_its_table(tmp_path):
    result = kvstore(
        "demo",
        "--workers",
        "2",
        "--threads",
        "2",
        "--turns",
        "12",
        "--data-dir",
        str(tmp_path / "data"),
    )
    assert result.returncode == 0, result.stderr
    assert "embedded Valkey on redis://127.0.0.1:" in result.stdout
    for row in (
        "threads",
        "turns",
        "appends/s",
        "append p50 / p99",
        "newest page of 50",
        "memory over the run",
    ):
        assert row in result.stdout
    assert "gap-free" in result.stdout
    assert (tmp_path / "data" / "appendonlydir").is_dir()  # AOF on, data under the directory


def test_demo_against_a_url(server, server_only):
    result = kvstore(
        "demo", "--url", server.url, "--workers", "2", "--threads", "2", "--turns", "6"
    )
    assert result.returncode == 0, result.stderr
    assert "2 workers, 12 turns on 2 shared threads" in result.stdout
    assert "durability: appendonly no: no AOF" in result.stdout  # the test servers persist nothing
    assert "gap-free" in result.stdout and "embedded Valkey" not in result.stdout


def test_demo_tells_its_story_and_each_scene_holds(tmp_path):
    """`kvstore demo` as the README runs it: under a minute, and what each scene claims is so on
    the server it leaves behind."""
    data = tmp_path / "data"
    started = time.monotonic()
    result = kvstore("demo", "--data-dir", str(data))
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    assert elapsed < 60, elapsed
    out = result.stdout
    assert (
        "\r" not in out and "FAILED" not in out
    )  # not a terminal: the progress bar's last state only
    # 1. The conversation, printed as a chat.
    for line in (
        "  #1   user       What's the weather in Oslo tomorrow?",
        "  #3   tool call  weather(",
        "  #5   assistant  Cloudy",
        "turn-1 completed: 4 replies, #2..#5",
    ):
        assert line in out, line
    # 2. The request sent twice, stored once.
    assert "sent again with otid req-2: a replay, nothing written, #6 returned" in out
    # 3. The worker killed with its append stored and unanswered, and the job run again.
    assert "killed (SIGKILL) after the server stored reply 12" in out
    assert "on the server: 13 messages, turn job-7 open" in out
    assert "13 appends replayed (nothing written), 18 stored" in out
    # 4. Memory flat while messages keep coming.
    assert "4 workers, 1600 turns on 8 shared threads" in out
    memory = re.search(r"memory over the run +([▁▂▃▄▅▆▇█]+)  ", out)
    assert memory and len(memory.group(1)) >= 20 and set(memory.group(1)[-8:]) <= set("▇█"), out
    held = re.search(r"memory under retention +held flat: ([+-][0-9]+)% \(", out)
    assert held and int(held.group(1)) <= 15, out  # the demo checks it (FLAT_GROWTH)
    # 5. The command to try next, as printed.
    next_command = re.search(r"Next, .*:  kvstore (inspect .*)", out).group(1).split()
    assert next_command == ["inspect", "demo-0", "--namespace", "demo", "--data-dir", str(data)]

    # The README shows the output as it prints, its numbers apart.
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    shown = readme.split("As it prints:\n\n```text\n", 1)[1].split("```", 1)[0]
    printed = out.replace(f" --data-dir {data}", "")
    assert _shape(shown) == _shape(printed), (
        "README.md's demo output is not what `kvstore demo` prints"
    )

    process, url = start_server(data)
    try:
        client = connect(url, decode_responses=True)
        assert (
            f"durability: appendfsync {client.config_get('appendfsync')['appendfsync']} (AOF on)"
            in out
        )
        store = open_store(url, StoreConfig(namespace="demo"))
        chat = list(store.thread("chat").iter())
        assert len(chat) == 7 and [m.otid for m in chat].count("req-2") == 1
        job = list(store.thread("job").iter())
        assert [m.seq_id for m in job] == list(range(1, 32))
        assert sorted(m.otid for m in job) == sorted(
            ["job-7-user"] + [f"job-7-reply-{n}" for n in range(1, 31)]
        )
        assert store.thread("job").finish_turn("job-7").reply_count == 30
        for t in range(8):  # retention holds each thread near its newest 200 messages
            stats = store.thread(f"demo-{t}").stats()
            assert stats.next_sequence > 600 and stats.stored_messages < 400, (t, stats)
        result = kvstore(*next_command)  # uses the running server
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("thread demo-0 (namespace demo, layout 3)")
        assert "--chunks lists each chunk" in result.stdout
    finally:
        stop(process)


def _shape(text: str) -> list[str]:
    """The demo's output with what changes from run to run (numbers, sparklines, paths) masked."""
    text = re.sub(r"data in \S+", "data in DIR", text)
    text = re.sub(r"[▁▂▃▄▅▆▇█]+", "▁", text)
    text = re.sub(r"[+-]?[0-9][0-9,.]*", "0", text)
    return [line.rstrip() for line in text.splitlines()]


def test_demo_says_when_it_cannot_read_the_durability(server, server_only):
    """A user denied CONFIG still runs the demo; the URL it prints next hides the password."""
    admin = connect(server.url)
    user = f"demo-{os.getpid()}"
    admin.execute_command(
        "ACL", "SETUSER", user, "reset", "on", ">secret-pw", "~*", "&*", "+@all", "-config"
    )
    try:
        url = f"redis://{user}:secret-pw@127.0.0.1:{server.port}/0"
        result = kvstore("demo", "--url", url, "--workers", "1", "--threads", "2", "--turns", "10")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "durability: could not read the server's appendfsync (CONFIG GET: " in result.stdout
        assert "secret-pw" not in result.stdout
        assert (
            f"kvstore inspect demo-0 --namespace demo --url redis://{user}:***@127.0.0.1:{server.port}/0"
            in result.stdout
        )
        assert "a replay, nothing written" in result.stdout and "18 stored" in result.stdout
    finally:
        admin.execute_command("ACL", "DELUSER", user)


def test_server_runs_in_the_foreground_and_prints_its_url(tmp_path):
    process = lifetime.Popen(
        [sys.executable, "-m", "kvstore", "server", "--data-dir", str(tmp_path), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        url = line.split(" on ")[1].split()[0]
        assert connect(url).ping()
    finally:
        stop(process)
    # Stopping the command stops the server it started.
    try:
        connect(url, socket_connect_timeout=1).ping()
        raise AssertionError("the embedded server outlived `kvstore server`")
    except redis.ConnectionError:
        pass


def test_inspect_export_import(server, namespace, tmp_path, server_only):
    store = open_store(server.url, StoreConfig(namespace=namespace, window_size=8, chunk_size=4))
    thread = store.thread("chat-1")
    thread.start_turn("t1")
    stored = thread.append(
        [UserMessage(content=f"m{i}", otid=f"o{i}") for i in range(20)], turn_id="t1"
    )
    stored += thread.append(AssistantMessage(content="B" * 2_000_000))
    result = kvstore("inspect", "chat-1", "--url", server.url, "--namespace", namespace, "--chunks")
    assert result.returncode == 0, result.stderr
    assert "messages stored   21" in result.stdout
    assert f"tokens            {sum(estimated_tokens(m) for m in stored):,}" in result.stdout
    assert "chunk        1  1..4  4 messages" in result.stdout
    assert "large       21" in result.stdout
    assert "t1: replies from 1, open" in result.stdout

    out = tmp_path / "chat.jsonl"
    result = kvstore(
        "export", "chat-1", "--url", server.url, "--namespace", namespace, "-o", str(out)
    )
    assert result.returncode == 0, result.stderr
    header, *lines, end = out.read_text().splitlines()
    assert json.loads(header)["kvstore_backup"] == 2 and json.loads(header)["turn"]["id"] == "t1"
    assert json.loads(end)["kvstore_backup_end"] == 2 and json.loads(end)["messages"] == 21
    # Each line carries the message's stored token count (here the default rule's).
    assert [json.loads(line) for line in lines] == (
        [
            {"message": m.to_dict(), "turn_id": "t1", "tokens": estimated_tokens(m)}
            for m in stored[:20]
        ]
        + [{"message": stored[20].to_dict(), "tokens": estimated_tokens(stored[20])}]
    )

    for closing in (
        "21 new, 0 already stored",
        "0 new, 21 already stored",
    ):  # a second import stores nothing
        result = kvstore(
            "import", "chat-2", str(out), "--url", server.url, "--namespace", namespace
        )
        assert result.returncode == 0, result.stderr
        assert result.stderr.splitlines()[-1] == f"imported into chat-2: {closing}", result.stderr
    copy = store.thread("chat-2")
    assert [m.to_dict() for m in copy.iter()] == [m.to_dict() for m in stored]
    assert copy.list(turn_id="t1", limit=100).messages == stored[:20]
    assert copy.snapshot().turn == thread.snapshot().turn


def test_export_and_import_print_progress_lines_to_a_non_terminal(
    server, namespace, tmp_path, server_only
):
    store = open_store(server.url, StoreConfig(namespace=namespace))
    thread = store.thread("long")
    for start in range(0, 1000, 100):
        thread.append([UserMessage(content=f"m{start + i}") for i in range(100)])
    out = tmp_path / "long.jsonl"
    common = ("--url", server.url, "--namespace", namespace, "--progress-every", "0")
    result = kvstore("export", "long", "-o", str(out), *common)
    assert result.returncode == 0, result.stderr
    # A line per page read (iter's pages grow: 200, 400, then the 400 left), then the summary.
    assert "\r" not in result.stderr
    assert result.stderr.splitlines() == [
        "  exported: 200/1,000 messages (20%)",
        "  exported: 600/1,000 messages (60%)",
        "  exported: 1,000/1,000 messages (100%)",
        f"exported 1000 messages to {out}",
    ], result.stderr
    result = kvstore("import", "copy", str(out), *common)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert "\r" not in result.stderr and len(lines) == 11, result.stderr  # a line per run of 100
    assert lines[-2:] == [
        "  restored: 1,000/1,000 messages (100%)",
        "imported into copy: 1000 new, 0 already stored",
    ]


def test_inspect_sums_up_the_chunks_and_lists_them_on_request(server, namespace, server_only):
    """A long thread is a dozen lines by default; --chunks lists every chunk, read page by page."""
    store = open_store(
        server.url,
        StoreConfig(namespace=namespace, window_size=8, chunk_size=4, max_chunks_per_call=200),
    )
    thread = store.thread("long")
    for start in range(
        0, 24_000, 500
    ):  # 5,998 chunks: more than one page of the index (INDEX_PAGE)
        thread.append([UserMessage(content=f"m{start + i}") for i in range(500)])
    thread.append(
        [AssistantMessage(content="B" * 1_100_000), AssistantMessage(content="C" * 1_200_000)]
    )
    client = connect(server.url)
    keys = thread.keys
    members = client.zrange(keys.chunk_index, 0, -1)
    assert len(members) > 5000

    result = kvstore("inspect", "long", "--url", server.url, "--namespace", namespace)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) < 15, result.stdout
    assert "messages stored   24002" in result.stdout
    chunked = sum(int(m.split(b":")[2]) for m in members)
    size = sum(int(m.split(b":")[3]) for m in members)
    last = int(members[-1].split(b":")[1])
    assert (
        f"  chunks            {len(members):,}: {chunked:,} messages (1..{last}), {size:,} bytes,"
        in result.stdout
    )
    assert "each 4 messages" in result.stdout
    assert "  oversized         2 messages in chunks of their own (24001, 24002)" in result.stdout
    assert "--chunks lists each chunk" in result.stdout

    result = kvstore("inspect", "long", "--url", server.url, "--namespace", namespace, "--chunks")
    assert result.returncode == 0, result.stderr
    listed = [
        line.split()[1] for line in result.stdout.splitlines() if line.startswith("    chunk ")
    ]
    assert listed == [
        m.split(b":")[0].decode() for m in members
    ]  # each once, in order, across pages
    assert [
        line.split()[1] for line in result.stdout.splitlines() if line.startswith("    large ")
    ] == ["24001", "24002"]
    assert f"  chunks            {len(members)} (+ 2 oversized)" in result.stdout


def test_migrate_finds_layout_1_threads_and_finishes_them(server, namespace, server_only):
    client = connect(server.url)
    store = open_store(server.url, StoreConfig(namespace=namespace))
    expected = {t: write_layout_1(client, store.thread(t).keys, 700) for t in ("old-a", "old-b")}
    result = kvstore("migrate", "--url", server.url, "--namespace", namespace)
    assert result.returncode == 0, result.stderr
    assert "migrated 2 threads" in result.stdout
    # Not a terminal: progress comes as whole lines (the last count once), never carriage returns.
    assert "\r" not in result.stdout
    assert "  migrated: 2/2 threads (100%)\n" in result.stdout
    for thread_id, messages in expected.items():
        thread = store.thread(thread_id)
        assert thread.stats().layout_version == 3
        assert list(thread.iter()) == messages
    result = kvstore("migrate", "--url", server.url, "--namespace", namespace)
    assert "no threads to migrate" in result.stdout


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
        assert result.stderr.startswith("kvstore: ") and result.stderr.count("\n") == 1, (
            args,
            result.stderr,
        )
    assert "not found" in kvstore(*cases[2]).stderr
    assert "cannot reach" in kvstore(*cases[1]).stderr


def test_health_and_preload_scripts(server, server_only, tmp_path):
    result = kvstore("health", "--url", server.url, "--json")
    assert result.returncode == 2, result.stderr  # the test servers run without persistence
    report = json.loads(result.stdout)
    assert report["lua"] is True and any(
        "persist" in w or "AOF" in w or "appendonly" in w for w in report["warnings"]
    )
    result = kvstore(
        "health", "--data-dir", str(tmp_path)
    )  # the embedded server: AOF, appendfsync always
    assert result.returncode == 0, result.stdout + result.stderr
    assert "appendonly       True (appendfsync always)" in result.stdout
    assert result.stdout.splitlines()[-1] == "ok: no setting voids kvstore's guarantees"
    admin = connect(server.url)
    admin.function_flush()
    admin.script_flush()
    result = kvstore("preload-scripts", "--url", server.url)
    assert result.returncode == 0, result.stderr
    from kvstore._engine.scripts import LIBRARY, SCRIPTS

    first, *scripts = result.stdout.splitlines()
    assert first == f"library {LIBRARY.name}"
    assert {line.split()[1] for line in scripts} == set(SCRIPTS)
    assert admin.function_list(library=LIBRARY.name)
    assert all(admin.script_exists(*(s.sha for s in SCRIPTS.values())))
    again = kvstore("preload-scripts", "--url", server.url)  # a library already loaded is kept
    assert again.returncode == 0 and again.stdout == result.stdout, again.stderr


def test_server_help_describes_each_option():
    result = kvstore("server", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "Run the embedded Valkey" in text and "server.json" in text
    assert (
        f"--port PORT the loopback port to listen on (default: {DEFAULT_PORT}; 0: any free port)"
        in text
    )
    assert "--data-dir DATA_DIR the directory of the server's data" in text
    assert "--appendfsync {always,everysec} always (default): each write is fsynced" in text
    assert "a crash can lose the last second or two of acknowledged writes" in text
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert (
        f"kvstore server [--data-dir .kvstore-data] [--port {DEFAULT_PORT}] [--appendfsync always|everysec]"
        in readme
    )
    health = " ".join(kvstore("health", "--help").stdout.split())
    assert (
        "exit status: 0 every setting read and none voids a guarantee; 2 a setting voids one"
        in health
    )
    assert "3 none read voids one, but some could not be read (unchecked)" in health


def test_server_listens_on_its_documented_port_and_runs_appendfsync_always(tmp_path):
    # The documented port must be free where the tests run (CI): a test that skipped here would
    # leave the default posture untested.
    assert _can_listen(DEFAULT_PORT), (
        f"port {DEFAULT_PORT} is taken on this machine: free it to run this test"
    )
    process, url = start_server(tmp_path / "data", "--port", str(DEFAULT_PORT))
    try:
        assert url == f"redis://127.0.0.1:{DEFAULT_PORT}/0"
        recorded = json.loads((tmp_path / "data" / "server.json").read_text())
        assert (recorded["port"], recorded["appendfsync"]) == (DEFAULT_PORT, "always")
        assert connect(url, decode_responses=True).config_get("appendfsync") == {
            "appendfsync": "always"
        }
        # Health against kvstore's own server, in its default posture, finds nothing wrong.
        result = kvstore("health", "--data-dir", str(tmp_path / "data"), "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads(result.stdout)
        assert (
            report["appendfsync"] == "always"
            and report["warnings"] == []
            and report["unchecked"] == []
        )
        assert (report["ok"], report["complete"]) == (True, True)
        # A second server elsewhere on the same default port refuses in one line, saying what to do.
        second = kvstore("server", "--data-dir", str(tmp_path / "other"), timeout=30)
        assert second.returncode == 1, second.stdout + second.stderr
        assert second.stderr.count("\n") == 1 and f"127.0.0.1:{DEFAULT_PORT}" in second.stderr
        assert "--port 0" in second.stderr
        assert not (tmp_path / "other" / "server.json").exists()
    finally:
        stop(process)


def test_server_with_appendfsync_everysec_says_so_and_health_warns(tmp_path):
    process = lifetime.Popen(
        [
            sys.executable,
            "-m",
            "kvstore",
            "server",
            "--data-dir",
            str(tmp_path),
            "--port",
            "0",
            "--appendfsync",
            "everysec",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert "appendfsync everysec" in line, line + process.stderr.read()
        url = line.split(" on ")[1].split()[0]
        assert connect(url, decode_responses=True).config_get("appendfsync") == {
            "appendfsync": "everysec"
        }
        assert json.loads((tmp_path / "server.json").read_text())["appendfsync"] == "everysec"
        result = kvstore("health", "--data-dir", str(tmp_path))  # uses the running server
        assert result.returncode == 2, result.stdout + result.stderr
        warnings = [line for line in result.stdout.splitlines() if line.startswith("warning:")]
        assert len(warnings) == 1 and "appendfsync is everysec" in warnings[0]
    finally:
        stop(process)
    refused = kvstore("server", "--data-dir", str(tmp_path), "--appendfsync", "no")
    assert refused.returncode == 2 and "invalid choice: 'no'" in refused.stderr


def test_data_dir_server_says_which_appendfsync_it_runs(tmp_path):
    with data_dir_server(tmp_path, appendfsync="everysec") as owned:
        assert owned.started and owned.appendfsync == "everysec" == owned.embedded.appendfsync
        assert connect(owned.url, decode_responses=True).config_get("appendfsync") == {
            "appendfsync": "everysec"
        }
        with data_dir_server(
            tmp_path
        ) as borrowed:  # found running: its own posture, not the default
            assert (
                not borrowed.started
                and borrowed.url == owned.url
                and borrowed.appendfsync == "everysec"
            )
    with data_dir_server(tmp_path) as default:
        assert default.appendfsync == "always"
        assert connect(default.url, decode_responses=True).config_get("appendfsync") == {
            "appendfsync": "always"
        }
    assert EmbeddedServer(tmp_path).appendfsync == "always"
    with pytest.raises(ValueError, match="appendfsync must be one of always, everysec"):
        EmbeddedServer(tmp_path, appendfsync="no")


def test_health_as_the_readme_user_reports_what_it_could_not_check(server, namespace, server_only):
    """The README's application user may not run INFO nor CONFIG GET: health exits 3 (nothing
    found wrong, not everything read), names each unread setting and why, and still shows the
    server, its version and whether the library is loaded."""
    from ..reliability.test_least_privilege import PASSWORD, readme_acl_args

    admin = connect(server.url)
    user = f"app-{namespace}"
    admin.execute_command("ACL", "SETUSER", user, *readme_acl_args(namespace))
    try:
        app_url = f"redis://{user}:{PASSWORD}@127.0.0.1:{server.port}/0"
        result = kvstore("health", "--url", app_url)
        assert result.returncode == 3, result.stdout + result.stderr
        lines = result.stdout.splitlines()
        # The server's own name (valkey, redis): a kind of the matrix may add its major (valkey8).
        product = server.name.rstrip("0123456789")
        assert lines[0] == f"server           {product} {server.version()}"
        unchecked = [line for line in lines if line.startswith("unchecked: ")]
        assert any(
            "CONFIG GET is denied to this user" in line and "appendfsync" in line
            for line in unchecked
        )
        assert not any(line.startswith("warning:") for line in lines)
        assert "a user allowed INFO and CONFIG GET" in lines[-1]
        report = json.loads(kvstore("health", "--url", app_url, "--json").stdout)
        assert (
            report["unchecked"]
            and report["warnings"] == []
            and report["library_loaded"] in (True, False)
        )
        assert (report["ok"], report["complete"]) == (False, False)
        # The admin, on the same server (no persistence), gets the warning: status 2.
        assert kvstore("health", "--url", server.url).returncode == 2
    finally:
        admin.execute_command("ACL", "DELUSER", user)


# A data dir has one owner: the commands next to a running `kvstore server` use it.


def start_server(data_dir, *extra: str) -> tuple[subprocess.Popen, str]:
    """`kvstore server` as a subprocess (on a free port unless `extra` gives one); returns it and
    the URL it printed."""
    port = () if "--port" in extra else ("--port", "0")
    process = lifetime.Popen(
        [sys.executable, "-m", "kvstore", "server", "--data-dir", str(data_dir), *port, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    if " on " not in line:
        process.wait(10)
        raise AssertionError(f"`kvstore server` did not start: {line!r} {process.stderr.read()!r}")
    return process, line.split(" on ")[1].split()[0]


def stop(process: subprocess.Popen) -> None:
    """Stops `process` if it still runs, and closes its pipes."""
    if process.poll() is None:
        process.terminate()
        process.wait(15)
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe:
            with contextlib.suppress(OSError):  # a broken pipe's unsent rest
                pipe.close()


def valkey_pid(url: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.info("server")["process_id"])


def wait_gone(pid: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still runs")


def jsonl(messages) -> str:
    return "".join(m.to_json() + "\n" for m in messages)


def contents(url: str, thread_id: str, namespace: str = "kv") -> list[str]:
    with MessageStore.from_url(url, StoreConfig(namespace=namespace)) as store:
        return [m.content for m in store.thread(thread_id).iter()]


def test_commands_next_to_a_running_server_use_it_and_nothing_is_lost(tmp_path):
    data = tmp_path / "data"
    process, url = start_server(data)
    try:
        store = open_store(url, StoreConfig())
        store.thread("chat").append(UserMessage(content="acknowledged by the first server"))
        file = tmp_path / "in.jsonl"
        file.write_text(jsonl([UserMessage(content=f"imported {i}") for i in range(3)]))
        result = kvstore("import", "copy", str(file), "--data-dir", str(data))
        assert result.returncode == 0, result.stderr
        # Imported through the running server, not through a second one on the same AOF.
        assert contents(url, "copy") == [f"imported {i}" for i in range(3)]
        result = kvstore("export", "chat", "--data-dir", str(data))
        assert result.returncode == 0, result.stderr
        assert (
            json.loads(result.stdout.splitlines()[1])["message"]["content"]
            == "acknowledged by the first server"
        )
        result = kvstore(
            "demo", "--data-dir", str(data), "--workers", "2", "--threads", "2", "--turns", "6"
        )
        assert result.returncode == 0, result.stderr
        assert f"Valkey on {url}" in result.stdout and "already running" in result.stdout
        demo = open_store(url, StoreConfig(namespace="demo"))
        assert demo.thread("demo-0").stats().stored_messages > 0
        # A second `kvstore server` on the dir refuses, naming the one that runs.
        second = kvstore("server", "--data-dir", str(data), timeout=30)
        assert (
            second.returncode == 1 and "already runs" in second.stderr and url in second.stderr
        ), second.stderr
        assert second.stderr.count("\n") == 1
        assert process.poll() is None
    finally:
        stop(process)
    process, url = start_server(
        data
    )  # a restart replays the one AOF: everything acknowledged is there
    try:
        assert contents(url, "chat") == ["acknowledged by the first server"]
        assert contents(url, "copy") == [f"imported {i}" for i in range(3)]
    finally:
        stop(process)


def test_a_killed_owner_leaves_no_lock_behind(tmp_path):
    data = tmp_path / "data"
    process, url = start_server(data)
    open_store(url, StoreConfig()).thread("chat").append(UserMessage(content="before kill -9"))
    pid = valkey_pid(url)
    process.kill()  # SIGKILL the command: its Valkey goes with it (and flushes its AOF)
    stop(process)
    wait_gone(pid)
    result = kvstore("export", "chat", "--data-dir", str(data))  # the recorded address is stale
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[1])["message"]["content"] == "before kill -9"
    process, url = start_server(data)
    try:
        # appendfsync always: what was acknowledged is on disk, however soon the server dies.
        open_store(url, StoreConfig()).thread("chat").append(
            UserMessage(content="after the restart")
        )
        pid = valkey_pid(url)
        os.kill(pid, signal.SIGKILL)  # both die hard: the lock goes with them, the address stays
        process.kill()
        stop(process)
        wait_gone(pid)
    finally:
        stop(process)
    result = kvstore("export", "chat", "--data-dir", str(data))
    assert result.returncode == 0, result.stderr
    _header, *lines, end = result.stdout.splitlines()  # the backup's header, messages, end line
    assert [json.loads(line)["message"]["content"] for line in lines] == [
        "before kill -9",
        "after the restart",
    ]
    assert json.loads(end)["messages"] == 2


def test_a_locked_data_dir_whose_server_does_not_answer_is_refused(tmp_path):
    data = tmp_path / "data"
    process, url = start_server(data)
    pid = valkey_pid(url)
    os.kill(pid, signal.SIGSTOP)  # the owner lives, its server hangs
    try:
        started = time.monotonic()
        result = kvstore("inspect", "chat", "--data-dir", str(data), timeout=60)
        elapsed = time.monotonic() - started
        assert result.returncode == 1, result.stdout + result.stderr
        assert "does not answer" in result.stderr and url in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1 and elapsed < 20
    finally:
        os.kill(pid, signal.SIGCONT)
        stop(process)
    wait_gone(pid)


def test_two_commands_starting_at_once_share_one_server(tmp_path):
    data = tmp_path / "data"
    servers = [
        lifetime.Popen(
            [sys.executable, "-m", "kvstore", "server", "--data-dir", str(data), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        outcomes = sorted(servers, key=lambda p: p.stdout.readline() == "")
        runs, refused = outcomes
        assert refused.wait(30) == 1 and "already runs" in refused.stderr.read()
        assert runs.poll() is None
    finally:
        for process in servers:
            stop(process)

    # Two imports at once on a dir with no server: the first starts one, the second uses it, and
    # the first, done first, keeps its server up until the second is done too.
    def importer(name: str) -> subprocess.Popen:
        return lifetime.Popen(
            [sys.executable, "-m", "kvstore", "import", name, "-", "--data-dir", str(data)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait_stored(name: str, count: int) -> None:
        url = "redis://127.0.0.1:{port}/0".format(**json.loads((data / "server.json").read_text()))
        deadline = time.monotonic() + 30
        while len(contents(url, name)) < count:
            assert time.monotonic() < deadline, f"{name}: fewer than {count} stored"
            time.sleep(0.05)

    first = importer("a")
    first.stdin.write(jsonl([UserMessage(content=f"a {i}") for i in range(100)]))
    first.stdin.flush()
    deadline = time.monotonic() + 30
    while not (data / "server.json").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    wait_stored("a", 100)
    second = importer("b")
    second.stdin.write(jsonl([UserMessage(content=f"b {i}") for i in range(100)]))
    second.stdin.flush()
    wait_stored("b", 100)
    first.stdin.close()
    time.sleep(1)
    assert first.poll() is None  # lingering for the second import
    second.stdin.write(jsonl([UserMessage(content=f"b {i}") for i in range(100, 300)]))
    second.stdin.close()
    assert second.wait(30) == 0, second.stderr.read()
    assert first.wait(30) == 0
    assert "other command(s) use the server" in first.stderr.read()
    for process in (first, second):
        stop(process)
    process, url = start_server(data)
    try:
        assert contents(url, "a") == [f"a {i}" for i in range(100)]
        assert contents(url, "b") == [f"b {i}" for i in range(300)]
    finally:
        stop(process)


def test_migrate_named_threads_as_the_least_privileged_user(
    server, namespace, tmp_path, server_only
):
    """The app user (exactly the documented ACL line) migrates named threads; SCAN's discovery is
    refused with a clear, typed message (it needs an admin user with +scan)."""
    from ..reliability.test_least_privilege import PASSWORD, _denials, make_user

    admin = connect(server.url)
    user = f"app-{namespace}"
    make_user(admin, namespace, name=user)
    try:
        store = open_store(server.url, StoreConfig(namespace=namespace))
        expected = {
            t: write_layout_1(admin, store.thread(t).keys, 700) for t in ("old-a", "old-b", "old-c")
        }
        store.thread("new").append(UserMessage(content="layout 2 already"))
        app_url = f"redis://{user}:{PASSWORD}@127.0.0.1:{server.port}/0"
        result = kvstore("migrate", "--url", app_url, "--namespace", namespace)
        assert result.returncode == 1, result.stdout + result.stderr
        assert result.stderr.startswith("kvstore: ") and result.stderr.count("\n") == 1, (
            result.stderr
        )
        assert (
            "needs SCAN" in result.stderr and "+scan" in result.stderr and "THREAD" in result.stderr
        )
        assert all(store.thread(t).stats().layout_version == 1 for t in expected)

        admin.execute_command("ACL", "LOG", "RESET")
        listed = tmp_path / "threads.txt"
        listed.write_text("old-b\n\n# a comment\nold-c\nnew\nold-a\n")
        result = kvstore(
            "migrate",
            "old-a",
            "--threads-from",
            str(listed),
            "--url",
            app_url,
            "--namespace",
            namespace,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "migrated 3 threads to layout 3 (1 already in layout 3)" in result.stdout
        for thread_id, messages in expected.items():
            thread = store.thread(thread_id)
            assert thread.stats().layout_version == 3
            assert list(thread.iter()) == messages
        denials = [d for d in _denials(admin) if d != "command client|setinfo"]
        assert not denials, denials

        result = kvstore("migrate", "old-a", "gone", "--url", app_url, "--namespace", namespace)
        assert (
            result.returncode == 1
            and "1 of 2 threads not found" in result.stderr
            and "gone" in result.stderr
        )
        result = kvstore("migrate", "bad{id}", "--url", app_url, "--namespace", namespace)
        assert (
            result.returncode == 1
            and result.stderr.startswith("kvstore: ")
            and result.stderr.count("\n") == 1
        )
    finally:
        admin.execute_command("ACL", "DELUSER", user)


def test_export_into_a_closed_pipe_ends_quietly(server, namespace, server_only):
    store = open_store(server.url, StoreConfig(namespace=namespace))
    thread = store.thread("long")
    for start in range(0, 2000, 100):  # ~0.5 MB of JSON lines: more than a pipe holds
        thread.append([UserMessage(content=f"m{start + i} " + "x" * 200) for i in range(100)])
    process = lifetime.Popen(
        [
            sys.executable,
            "-m",
            "kvstore",
            "export",
            "long",
            "--url",
            server.url,
            "--namespace",
            namespace,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert "kvstore_backup" in json.loads(process.stdout.readline())  # `| head -2`
    assert json.loads(process.stdout.readline())["message"]["content"].startswith("m0 ")
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(30) == 141 and stderr == ""  # as a tool cut by SIGPIPE, without a word
    stop(process)


def test_ctrl_c_during_import_says_what_was_stored(server, namespace, server_only):
    process = lifetime.Popen(
        [
            sys.executable,
            "-m",
            "kvstore",
            "import",
            "chat",
            "-",
            "--url",
            server.url,
            "--namespace",
            namespace,
        ],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    process.stdin.write(jsonl([UserMessage(content=f"m{i}", otid=f"o{i}") for i in range(250)]))
    process.stdin.flush()  # two batches of 100 stored, 50 lines read and not yet sent
    store = open_store(server.url, StoreConfig(namespace=namespace))
    deadline = time.monotonic() + 30
    while store.thread("chat").stats().stored_messages < 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130
    stop(process)
    assert stderr.count("\n") == 1 and stderr.startswith("kvstore: interrupted"), stderr
    assert (
        "200 messages stored" in stderr
        and "chat" in stderr
        and "run the same import again" in stderr
    ), stderr
    assert store.thread("chat").stats().stored_messages == 200


def test_ctrl_c_during_a_restore_then_the_same_import_finishes_it(
    server, namespace, tmp_path, server_only
):
    store = open_store(server.url, StoreConfig(namespace=namespace))
    thread = store.thread("source")
    for start in range(0, 400, 100):
        thread.append(
            [UserMessage(content=f"m{start + i}") for i in range(100)], turn_id=f"t{start}"
        )
    out = tmp_path / "backup.jsonl"
    common = ("--url", server.url, "--namespace", namespace)
    assert kvstore("export", "source", "-o", str(out), *common).returncode == 0
    lines = out.read_text().splitlines(keepends=True)
    process = lifetime.Popen(
        [sys.executable, "-m", "kvstore", "import", "copy", "-", *common],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    process.stdin.write("".join(lines[:251]))  # the header, two runs of 100 restored, 50 read
    process.stdin.flush()
    deadline = time.monotonic() + 30
    while store.thread("copy").stats().stored_messages < 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130
    stop(process)
    assert stderr.startswith("kvstore: interrupted") and "200 messages stored in copy" in stderr, (
        stderr
    )
    result = kvstore("import", "copy", str(out), *common)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[-1] == "imported into copy: 200 new, 200 already stored"
    copy = store.thread("copy")
    assert [m.to_dict() for m in copy.iter()] == [m.to_dict() for m in thread.iter()]
    assert [m.seq_id for m in copy.list(turn_id="t300", limit=200).messages] == list(
        range(301, 401)
    )


def test_import_with_history_checks_makes_checked_threads(server, namespace, tmp_path, server_only):
    store = open_store(server.url, StoreConfig(namespace=namespace))
    checked = open_store(server.url, StoreConfig(namespace=namespace, history_checks="strict"))
    call = ToolCallMessage(tool_call={"name": "w", "arguments": "{}", "tool_call_id": "c1"})
    store.thread("source").append([UserMessage(content="q"), call])
    out = tmp_path / "source.jsonl"
    assert (
        kvstore(
            "export", "source", "--url", server.url, "--namespace", namespace, "-o", str(out)
        ).returncode
        == 0
    )
    result = kvstore(
        "import",
        "copy",
        str(out),
        "--url",
        server.url,
        "--namespace",
        namespace,
        "--history-checks",
        "strict",
    )
    assert result.returncode == 0, result.stderr
    copy = checked.thread("copy")
    assert copy.stats().history_checked
    with pytest.raises(errors.HistoryConflict):
        copy.append(
            ToolReturnMessage(status="success", tool_call_id="c9", tool_return="no such call")
        )
    copy.append(ToolReturnMessage(status="success", tool_call_id="c1", tool_return="ok"))
    # Plain JSON lines are appended, and checked: an answer to no call is refused, typed.
    plain = tmp_path / "plain.jsonl"
    plain.write_text(
        json.dumps(
            {
                "message_type": "tool_return_message",
                "status": "success",
                "tool_call_id": "c-none",
                "tool_return": "x",
            }
        )
        + "\n"
    )
    result = kvstore(
        "import",
        "fresh",
        str(plain),
        "--url",
        server.url,
        "--namespace",
        namespace,
        "--history-checks",
        "strict",
    )
    assert result.returncode != 0 and "tool call c-none, which is not open" in result.stderr, (
        result.stderr
    )
    assert checked.thread("fresh").stats().stored_messages == 0


def test_fork_from_the_command_line(server, namespace, server_only):
    store = open_store(server.url, StoreConfig(namespace=namespace, window_size=4, chunk_size=2))
    source = store.thread("source")
    stored = source.append([UserMessage(content=f"m{i}") for i in range(10)])
    base = ("--url", server.url, "--namespace", namespace)
    result = kvstore("fork", "source", "by-id", "--at", stored[6].id, *base)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "forked source at sequence 7 into by-id: 7 messages"
    assert list(store.thread("by-id").iter()) == stored[:7]
    # By sequence; run again, a finished fork returns at once and writes nothing.
    for _ in range(2):
        result = kvstore("fork", "source", "by-seq", "--at", "3", *base)
        assert result.returncode == 0 and "3 messages" in result.stderr, result.stderr
    assert store.thread("by-seq").stats().stored_messages == 3
    # A fork point not stored, and a target holding other messages: refused, typed, nothing written.
    missing = kvstore("fork", "source", "nowhere", "--at", "message-none", *base)
    assert missing.returncode != 0 and "message-none" in missing.stderr
    assert store.thread("nowhere").stats().stored_messages == 0
    store.thread("taken").append(UserMessage(content="other"))
    taken = kvstore("fork", "source", "taken", "--at", "5", *base)
    assert taken.returncode != 0 and taken.stderr.startswith("kvstore:"), taken.stderr
    assert [m.content for m in store.thread("taken").iter()] == ["other"]


def test_a_fork_stopped_then_resumed_from_the_command_line_after_retention(
    server, namespace, server_only
):
    """A fork stopped after its first run, its source's retention then past what it copied:
    `kvstore fork` run again finishes it as the fork of that point made after the retention."""
    from kvstore._engine.fork import fork

    from .test_fork_races import Stopped, acting, stop

    store = open_store(server.url, StoreConfig(namespace=namespace))
    source = store.thread("source")
    for start in range(0, 250, 50):
        source.append([UserMessage(content=f"m{j}") for j in range(start, start + 50)])
    operation = fork(source._ref, "source", store.thread("copy")._ref, 250)
    with pytest.raises(Stopped):
        store.run(acting(operation, 2, stop))
    retaining = open_store(server.url, StoreConfig(namespace=namespace, retained_message_limit=20))
    retaining.thread("source").compact("earlier", last_sequence=240)
    base = ("--url", server.url, "--namespace", namespace)
    result = kvstore("fork", "source", "copy", "--at", "250", *base)
    assert result.returncode == 0, result.stderr
    whole = source.fork("whole", at=250)
    copy = store.thread("copy")
    assert list(copy.iter()) == list(whole.iter())
    got, want = copy.stats(), whole.stats()
    assert (got.stored_messages, got.tokens, got.deleted_before_sequence) == (
        want.stored_messages,
        want.tokens,
        want.deleted_before_sequence,
    )
    assert not got.restore_unfinished


@pytest.mark.parametrize("kind", ["plain", "backup"])
def test_an_import_of_a_line_nested_too_deep_is_one_line_and_writes_nothing(
    server, namespace, tmp_path, server_only, kind
):
    """Valid JSON nested past what the parser reads (a RecursionError in json.loads): the
    line is refused like any malformed line, in one line of stderr."""
    deep = '{"message_type": "user_message", "content": "x", "metadata": {"a": ' + "[" * 5000
    deep += "]" * 5000 + "}}"
    lines = [deep]
    if kind == "backup":
        store = open_store(server.url, StoreConfig(namespace=namespace))
        store.thread("source").append(UserMessage(content="hello"))
        out = tmp_path / "backup.jsonl"
        common = ("--url", server.url, "--namespace", namespace)
        assert kvstore("export", "source", "-o", str(out), *common).returncode == 0
        lines = out.read_text().splitlines()
        lines.insert(1, deep)
    path = tmp_path / "deep.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = kvstore("import", "copy", str(path), "--url", server.url, "--namespace", namespace)
    assert result.returncode == 1, result
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "line" in result.stderr and "Traceback" not in result.stderr
    client = redis.Redis.from_url(server.url)
    try:
        assert list(client.scan_iter(match=f"{namespace}:{{copy}}:*")) == []
    finally:
        client.close()


def test_an_import_of_a_backup_cut_at_a_line_end_fails_and_serves_no_thread(
    server, namespace, tmp_path, server_only
):
    """300 messages cut after 150 lines: exit 1, naming the missing end line; the part restored
    refuses writes (its state not set); the whole file then finishes it. A backup of an older
    version (no end line) imports with --allow-untrailed."""
    store = open_store(server.url, StoreConfig(namespace=namespace))
    thread = store.thread("source")
    for n in range(100):
        thread.append(UserMessage(content=f"question {n}"), turn_id=f"t{n}")
        thread.start_turn(f"t{n}")
        thread.append(
            [AssistantMessage(content=f"answer {n}.{i}") for i in range(2)], turn_id=f"t{n}"
        )
        thread.finish_turn(f"t{n}")
    out = tmp_path / "backup.jsonl"
    common = ("--url", server.url, "--namespace", namespace)
    assert kvstore("export", "source", "-o", str(out), *common).returncode == 0
    lines = out.read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:151]))
    result = kvstore("import", "copy", str(cut), *common)
    assert result.returncode == 1 and "no end line" in result.stderr, result.stderr
    copy = store.thread("copy")
    assert copy.stats().stored_messages == 150
    with pytest.raises(errors.RestoreIncomplete):
        copy.append(AssistantMessage(content="into a turn past the cut"), turn_id="t99")
    result = kvstore("import", "copy", str(out), *common)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[-1] == "imported into copy: 150 new, 150 already stored"
    assert [m.to_dict() for m in copy.iter()] == [m.to_dict() for m in thread.iter()]
    assert copy.stats().next_sequence == thread.stats().next_sequence == 301
    with pytest.raises(errors.TurnFinished):
        copy.append(AssistantMessage(content="a finished turn takes no reply"), turn_id="t99")

    old = tmp_path / "old.jsonl"
    old.write_text("".join(lines[:-1]))
    assert kvstore("import", "old", str(old), *common).returncode == 1
    result = kvstore("import", "old", str(old), "--allow-untrailed", *common)
    assert result.returncode == 0, result.stderr
    assert [m.to_dict() for m in store.thread("old").iter()] == [m.to_dict() for m in thread.iter()]


def _into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """`kvstore ARGS | head -0`: standard output a pipe whose reader is gone before a line."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return subprocess.run(
            [sys.executable, "-m", "kvstore", *args],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(writer)


@pytest.mark.parametrize(
    "command",
    [
        ["inspect", "long"],
        ["inspect", "long", "--chunks"],
        ["health"],
        ["preload-scripts"],
        ["migrate", "long"],
        ["export", "long"],
        ["export", "long", "--format", "langchain"],
    ],
)
def test_every_command_into_a_closed_pipe_ends_quietly(server, namespace, server_only, command):
    """`kvstore inspect … | head` and the like: the command ends as a tool cut by SIGPIPE does
    (status 141, not a word on standard error), whichever command it is."""
    store = open_store(server.url, StoreConfig(namespace=namespace))
    store.thread("long").append([UserMessage(content=f"m{n}") for n in range(30)])
    result = _into_a_closed_pipe(*command, "--url", server.url, "--namespace", namespace)
    assert (result.returncode, result.stderr) == (141, ""), result.stderr


def test_import_from_into_a_closed_pipe_ends_quietly(server, namespace, server_only):
    connect(server.url).rpush(f"{namespace}:chat", '{"role": "user", "content": "hi"}')
    result = _into_a_closed_pipe(
        "import-from", "llamaindex", "--url", server.url, "--pattern", f"{namespace}:chat"
    )
    assert result.returncode == 141 and "Traceback" not in result.stderr, result.stderr


def test_a_command_without_url_says_it_runs_the_embedded_server(tmp_path):
    """Without --url a command runs on the data dir's embedded server, which may hold nothing
    yet: one line on standard error says which server, where its data lives, and for how long."""
    data = tmp_path / "data"
    result = kvstore("inspect", "chat", "--data-dir", str(data))
    assert result.returncode == 1  # an empty server: no such thread
    first, *rest = result.stderr.splitlines()
    assert first.startswith("kvstore: no --url: started the embedded Valkey on redis://127.0.0.1:")
    assert f"data in {data} (AOF on, 0 keys)" in first and "stops when this command ends" in first
    assert rest == ["kvstore: thread 'chat' not found in namespace 'kv'"]

    process, url = start_server(data)
    try:
        result = kvstore("inspect", "chat", "--data-dir", str(data))
        first = result.stderr.splitlines()[0]
        assert first.startswith(f"kvstore: no --url: using the embedded Valkey on {url}")
        assert f"serving {data}" in first
    finally:
        stop(process)
    with_url = kvstore("inspect", "chat", "--url", url.replace("/0", "/0"), "--data-dir", str(data))
    assert "no --url" not in with_url.stderr


def test_the_demo_fails_when_memory_does_not_hold_flat(server, server_only):
    """The demo checks its memory claim, not prints it: memory that keeps growing with the
    messages among the threads' keys (keys of theirs written from the last scene's start on)
    fails the demo, exit status 1."""
    import threading

    client = connect(server.url)
    store = open_store(server.url, StoreConfig(namespace="demo"))
    done = threading.Event()

    def keep_growing() -> None:
        """2 KiB more among the threads' keys for each message appended, in keys of 64 KiB (one
        string would grow its allocation by steps): memory that grows with the messages."""
        written = 0
        while not done.wait(0.005):
            stats = [store.thread(f"demo-{t}").stats() for t in range(2)]
            due = sum(stat.next_sequence - 1 for stat in stats) * 2048 // 65536
            for number in range(written, due):
                client.set(f"demo:{{demo-grow}}:{number}", b"x" * 65536)
            written = max(written, due)

    writer = threading.Thread(target=keep_growing)
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "kvstore", "demo", "--url", server.url),
            *("--workers", "2", "--threads", "2", "--turns", "200"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        for line in process.stdout:
            lines.append(line)
            if line.startswith("4. Memory held flat"):
                writer.start()
        out = "".join(lines)
        assert process.wait(60) == 1, out + process.stderr.read()
    finally:
        done.set()
        if writer.is_alive():
            writer.join()
        grown = list(client.scan_iter(match="demo:{demo-grow}:*", count=1000))
        if grown:
            client.delete(*grown)
        stop(process)
    assert re.search(r"memory under retention +NOT flat: \+[0-9]+%", out), out
    assert "FAILED: memory grew" in out and "Next, look" not in out


def test_the_demo_says_when_retention_held_too_briefly_to_check_memory(server, server_only):
    result = kvstore(
        "demo", "--url", server.url, "--workers", "1", "--threads", "2", "--turns", "12"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"memory under retention +not checked: ", result.stdout), result.stdout


def test_a_plain_import_progress_ends_at_its_message_count(
    server, namespace, tmp_path, server_only
):
    """A file whose last line has no newline, with blank lines: the progress total counts its
    messages, so the last line says N/N."""
    lines = [json.dumps({"message_type": "user_message", "content": f"m{n}"}) for n in range(7)]
    for name, text in (
        ("unterminated", "\n".join(lines)),  # no newline at the end
        ("blank lines", "\n".join(lines[:3]) + "\n\n" + "\n".join(lines[3:]) + "\n\n\n"),
    ):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(text)
        result = kvstore(
            *("import", name.replace(" ", "-"), str(path), "--url", server.url),
            *("--namespace", namespace, "--progress-every", "0"),
        )
        assert result.returncode == 0, result.stderr
        assert "  imported: 7/7 messages (100%)" in result.stderr.splitlines(), result.stderr
