"""The command line's edges, third set, on real servers: an export that fails leaves the file it
would replace as it was; a source message no encoding can carry fails its session only; a file
that is not UTF-8 and an empty --url are refused in one line."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import stat
import sys
import threading

import pytest
import redis
import redis.asyncio

from kvstore import AsyncMessageStore, MessageStore, StoreConfig, UserMessage
from kvstore.cli.main import main as cli
from kvstore.importers import (
    import_langchain,
    import_langchain_async,
    import_llamaindex,
    import_llamaindex_async,
    import_openai_agents,
    import_openai_agents_async,
)

from ..support.backup_files import one_error_line

GOOD_BACKUP = '{"kept": "a good backup made earlier"}\n'


@pytest.fixture
def store(backend, server_only, server, namespace):
    with MessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as made:
        made.thread("chat").append([UserMessage(content=f"m{i}") for i in range(5)])
        yield made


# --- export: the file is replaced whole, or left as it was -------------------------------------


@pytest.mark.parametrize("format", ["backup", "langchain"])
def test_an_export_of_a_mistyped_thread_leaves_the_file_as_it_was(
    store, server, namespace, tmp_path, capsys, format
):
    target = tmp_path / "chat.jsonl"
    target.write_text(GOOD_BACKUP)
    args = ["export", "chta", "-o", str(target), "--url", server.url, "--namespace", namespace]
    assert cli([*args, "--format", format]) == 1
    assert "'chta' not found" in one_error_line(capsys)
    assert target.read_text() == GOOD_BACKUP
    assert os.listdir(tmp_path) == ["chat.jsonl"]  # no temporary file left


def _fail_after_the_first_page(monkeypatch, store, raising: BaseException | None) -> None:
    """The export's reads: after the first page, the thread takes a message (the export then
    fails as changed) or `raising` is raised (as Ctrl-C would)."""
    from kvstore import admin

    pages = admin.pages

    def one_page_then(*args, **kwargs):
        for number, page in enumerate(pages(*args, **kwargs)):
            if number == 1:
                if raising is not None:
                    raise raising
                store.thread("chat").append(UserMessage(content="written meanwhile"))
            yield page

    monkeypatch.setattr(admin, "pages", one_page_then)
    thread = store.thread("chat")
    thread.append([UserMessage(content=f"more {i}") for i in range(500)])  # pages past one


@pytest.mark.parametrize(
    "raising, status, said",
    [
        (None, 1, "changed while it was exported"),
        (KeyboardInterrupt(), 130, "interrupted: {target} is left as it was"),
    ],
    ids=["thread-changed", "ctrl-c"],
)
def test_an_export_failing_midway_leaves_the_file_as_it_was(
    store, server, namespace, tmp_path, capsys, monkeypatch, raising, status, said
):
    _fail_after_the_first_page(monkeypatch, store, raising)
    target = tmp_path / "chat.jsonl"
    target.write_text(GOOD_BACKUP)
    args = ["export", "chat", "-o", str(target), "--url", server.url, "--namespace", namespace]
    assert cli(args) == status
    assert said.format(target=target) in one_error_line(capsys)
    assert target.read_text() == GOOD_BACKUP
    assert os.listdir(tmp_path) == ["chat.jsonl"]


def test_an_export_to_a_new_file_that_fails_leaves_no_file(
    store, server, namespace, tmp_path, capsys, monkeypatch
):
    _fail_after_the_first_page(monkeypatch, store, KeyboardInterrupt())
    target = tmp_path / "new.jsonl"
    args = ["export", "chat", "-o", str(target), "--url", server.url, "--namespace", namespace]
    assert cli(args) == 130
    assert "no file was written" in one_error_line(capsys)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("format", ["backup", "langchain"])
def test_an_export_replaces_the_file_whole_keeping_its_mode_and_links(
    store, server, namespace, tmp_path, capsys, format
):
    real = tmp_path / "backups" / "chat.jsonl"
    real.parent.mkdir()
    real.write_text(GOOD_BACKUP)
    real.chmod(0o640)
    link = tmp_path / "latest.jsonl"
    link.symlink_to(real)
    args = ["export", "chat", "-o", str(link), "--url", server.url, "--namespace", namespace]
    assert cli([*args, "--format", format]) == 0, capsys.readouterr().err
    assert link.is_symlink() and os.readlink(link) == str(real)  # the link kept, its file new
    text = real.read_text()
    assert "m4" in text and GOOD_BACKUP not in text
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert sorted(os.listdir(real.parent)) == ["chat.jsonl"]


def test_an_export_into_a_fifo_writes_through_it(store, server, namespace, tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_bytes()))
    reader.start()
    try:
        args = ["export", "chat", "-o", str(fifo), "--url", server.url, "--namespace", namespace]
        assert cli(args) == 0, capsys.readouterr().err
    finally:
        reader.join(5)
        if reader.is_alive():  # unblock the reader if the export never opened the pipe
            with contextlib.suppress(OSError):  # ENXIO: the reader closed its end meanwhile
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert b'"content":"m4"' in read[0] and b"kvstore_backup_end" in read[0]


def test_an_export_to_standard_output_is_unchanged(
    store, server, namespace, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    common = ["--url", server.url, "--namespace", namespace]
    for output in ([], ["-o", "-"]):  # -o - is standard output, not a file named "-"
        assert cli(["export", "chat", *output, *common]) == 0
        assert '"content":"m4"' in capsys.readouterr().out
    assert os.listdir(tmp_path) == []


# --- import-from: a message no encoding can carry is its session's error ------------------------

# Valid JSON, a lone surrogate once parsed: no UTF-8 form, so nothing the server can store.
LONE = b"\\ud800"
SOURCES = {
    "langchain": (
        b'{"type":"human","data":{"type":"human","content":"%s"}}',
        b'{"type":"human","data":{"type":"human","content":"fine"}}',
    ),
    "llamaindex": (
        b'{"role":"user","blocks":[{"block_type":"text","text":"%s"}]}',
        b'{"role":"user","blocks":[{"block_type":"text","text":"fine"}]}',
    ),
    "openai-agents": (
        b'{"role":"user","content":"%s"}',
        b'{"role":"user","content":"fine"}',
    ),
}
# Where else a lone surrogate can hide: a source field kept in metadata, a dict key.
ELSEWHERE = {
    "langchain": b'{"type":"human","data":{"type":"human","content":"x","id":"%s"}}',
    "llamaindex": b'{"role":"user","blocks":[{"block_type":"text","text":"x"},{"block_type":"audio","%s":1}]}',
    "openai-agents": b'{"role":"user","content":"x","extra":{"%s":1}}',
}


def _keys(kind: str, namespace: str) -> tuple[list[str], list[str]]:
    """The source keys of sessions a, m (bad), n (bad elsewhere), z; and the import's options."""
    if kind == "langchain":
        prefix = f"message_store:{namespace}-"
        return [f"{prefix}{s}" for s in "amnz"], ["--pattern", f"{prefix}*"]
    if kind == "llamaindex":
        return [f"{namespace}:chat:{s}" for s in "amnz"], ["--pattern", f"{namespace}:chat:*"]
    prefix = f"{namespace}:agents"
    return [f"{prefix}:{s}:messages" for s in "amnz"], ["--key-prefix", prefix]


def _write_sessions(raw_client, kind: str, keys: list[str]) -> None:
    bad, good = SOURCES[kind]
    # LangChain pushes newest first: the bad message is the second either way.
    push = raw_client.lpush if kind == "langchain" else raw_client.rpush
    push(keys[0], good)
    push(keys[1], good, bad % LONE, good)
    push(keys[2], good, ELSEWHERE[kind] % LONE)
    push(keys[3], good)


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_cli_import_from_reports_a_message_no_encoding_carries_and_goes_on(
    backend, server_only, server, raw_client, namespace, capsys, kind
):
    keys, options = _keys(kind, namespace)
    _write_sessions(raw_client, kind, keys)
    args = ["import-from", kind, "--url", server.url, "--namespace", namespace, *options]
    assert cli(args) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    rows = {line.split()[0]: line for line in captured.out.splitlines() if line.split()}
    assert rows[keys[0]].endswith("ok") and rows[keys[3]].endswith("ok")
    for bad in keys[1:3]:
        assert "failed: " in rows[bad] and "cannot be encoded" in rows[bad], rows[bad]
    assert "4 sessions" in captured.out and "2 failed" in captured.out
    with MessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as store:
        # What came before the refused message stays; nothing after it.
        thread_id = rows[keys[1]].split()[1]
        assert [m.content for m in store.thread(thread_id).iter()] == ["fine"]


_LIBRARY = {
    "langchain": (import_langchain, import_langchain_async),
    "llamaindex": (import_llamaindex, import_llamaindex_async),
    "openai-agents": (import_openai_agents, import_openai_agents_async),
}


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_library_import_reports_a_message_no_encoding_carries_and_goes_on(
    backend, server_only, server, raw_client, namespace, mode, kind
):
    keys, options = _keys(kind, namespace)
    _write_sessions(raw_client, kind, keys)
    option, value = options  # --pattern or --key-prefix, as the library names it
    arguments = {
        option[2:].replace("-", "_"): value,
        "thread_id": lambda key: "abcd"[keys.index(key)],
    }
    config = StoreConfig(namespace=namespace)
    call, call_async = _LIBRARY[kind]
    if mode == "sync":
        with (
            MessageStore.from_url(server.url, config) as store,
            redis.Redis.from_url(server.url) as source,
        ):
            results = call(store, source, **arguments)
    else:

        async def run():
            store = AsyncMessageStore.from_url(server.url, config)
            source = redis.asyncio.Redis.from_url(server.url)
            try:
                return await call_async(store, source, **arguments)
            finally:
                await store.close()
                await source.aclose()

        results = asyncio.run(run())
    assert [(r.thread_id, r.imported, r.error_type) for r in results] == [
        ("a", 1, None),
        ("b", 1, "InvalidMessage"),
        ("c", 1, "InvalidMessage"),
        ("d", 1, None),
    ]
    assert all("cannot be encoded" in (r.error or "") for r in results[1:3])


# --- files that are not UTF-8 --------------------------------------------------------------------

NOT_UTF8 = b"chat\ncaf\xe9\n"


def test_threads_from_a_file_not_utf8_is_refused_in_one_line(
    backend, server_only, server, namespace, tmp_path, capsys
):
    path = tmp_path / "ids.txt"
    path.write_bytes(NOT_UTF8)
    common = ["--url", server.url, "--namespace", namespace]
    assert cli(["migrate", "--threads-from", str(path), *common]) == 1
    assert one_error_line(capsys) == f"kvstore: --threads-from {path}: line 2 is not UTF-8 text"


def test_threads_from_standard_input_not_utf8_is_refused_in_one_line(
    backend, server_only, server, namespace, capsys, monkeypatch
):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(NOT_UTF8), encoding="utf-8"))
    common = ["--url", server.url, "--namespace", namespace]
    assert cli(["migrate", "--threads-from", "-", *common]) == 1
    assert one_error_line(capsys) == "kvstore: --threads-from -: line 2 is not UTF-8 text"


def test_a_rename_file_not_utf8_or_too_deep_is_refused_in_one_line(
    backend, server_only, server, namespace, tmp_path, capsys
):
    path = tmp_path / "renames.json"
    common = ["import-from", "langchain", "--url", server.url, "--rename-file", str(path)]
    path.write_bytes(b'{"message_store:caf\xe9": "cafe"}')
    assert cli(common) == 1
    assert one_error_line(capsys) == (f"kvstore: --rename-file {path}: not UTF-8 text (at byte 19)")
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert cli(common) == 1
    assert "not JSON (nested too deep)" in one_error_line(capsys)


# --- an empty --url ----------------------------------------------------------------------------

URL_COMMANDS = {
    "demo": ["demo", "--url", ""],
    "inspect": ["inspect", "chat", "--url", ""],
    "export": ["export", "chat", "--url", ""],
    "import": ["import", "chat", "-", "--url", ""],
    "fork": ["fork", "chat", "copy", "--at", "1", "--url", ""],
    "migrate": ["migrate", "chat", "--url", ""],
    "threads": ["threads", "alice", "--url", ""],
    "erase-owner": ["erase-owner", "alice", "--url", ""],
    "health": ["health", "--url", ""],
    "preload-scripts": ["preload-scripts", "--url", ""],
    "import-from": ["import-from", "langchain", "--url", ""],
}


# Other options an empty value must not leave unset: standard output, SCAN, no renames.
OTHER_EMPTY = {
    "-o": ["export", "chat", "-o", ""],
    "--threads-from": ["migrate", "--threads-from", ""],
    "--rename-file": ["import-from", "langchain", "--url", "redis://x", "--rename-file", ""],
}


@pytest.mark.parametrize(
    "flag, argv",
    [("--url", URL_COMMANDS[name]) for name in sorted(URL_COMMANDS)] + sorted(OTHER_EMPTY.items()),
    ids=sorted(URL_COMMANDS) + sorted(OTHER_EMPTY),
)
def test_an_empty_value_is_refused_in_one_line_and_starts_no_server(
    tmp_path, capsys, monkeypatch, flag, argv
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", io.StringIO(GOOD_BACKUP))
    assert cli(argv) == 1
    assert one_error_line(capsys).startswith(f"kvstore: {flag} is empty (an unset variable?)")
    assert os.listdir(tmp_path) == []  # no embedded server's data dir


def test_an_empty_to_url_is_refused_not_taken_as_the_source(
    backend, server_only, server, raw_client, namespace, capsys
):
    key = f"message_store:{namespace}-a"
    raw_client.lpush(key, json.dumps({"type": "human", "data": {"content": "hi"}}))
    args = ["import-from", "langchain", "--url", server.url, "--pattern", key, "--to-url", ""]
    assert cli([*args, "--namespace", namespace]) == 1
    assert one_error_line(capsys).startswith("kvstore: --to-url is empty")
    assert not list(raw_client.scan_iter(f"{namespace}:*"))
