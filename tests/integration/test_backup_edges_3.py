"""`kvstore import` and `export` at the edges of the backup format, on real servers: an end line
told from a message by what a message cannot lack, a header checked whole (bounds and
consistency) before anything is written, ids held to append's rules, files that are not UTF-8
or end inside a character, and an export that lists fewer messages than the thread stores."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
import redis

from kvstore import AssistantMessage, MessageStore, StoreConfig, SystemMessage, UserMessage, errors
from kvstore.cli import backup
from kvstore.cli.main import main

from ..support.backup_files import DATE, header, sealed, user


@pytest.fixture
def store(server, namespace, server_only):
    opened = MessageStore.from_url(server.url, StoreConfig(namespace=namespace))
    yield opened
    opened.close()


def run(capsys, server, namespace, *args: str) -> tuple[int, str]:
    """`kvstore ARGS --url … --namespace …` in this process: (exit status, stderr)."""
    status = main([*args, "--url", server.url, "--namespace", namespace])
    return status, capsys.readouterr().err


def written(server, namespace: str, thread_id: str) -> list[bytes]:
    client = redis.Redis.from_url(server.url)
    try:
        return list(client.scan_iter(match=f"{namespace}:{{{thread_id}}}:*"))
    finally:
        client.close()


def import_stdin(server, namespace, thread_id: str, data: bytes) -> tuple[int, str]:
    """`kvstore import THREAD -` with `data` on standard input, in a child process."""
    command = [sys.executable, "-m", "kvstore", "import", thread_id, "-", "--url", server.url]
    result = subprocess.run(
        [*command, "--namespace", namespace], input=data, capture_output=True, timeout=120
    )
    return result.returncode, result.stderr.decode()


def refused_in_one_line(status: int, err: str) -> None:
    assert status == 1, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def exported(capsys, server, namespace, store, tmp_path) -> tuple[dict, list[str]]:
    """A thread with turns and a summary, exported: its header and message lines."""
    thread = store.thread("source")
    for n in range(6):
        thread.append(UserMessage(content=f"q{n} ünï 😀", otid=f"o{n}"), turn_id=f"t{n}")
        thread.start_turn(f"t{n}")
        thread.append(AssistantMessage(content=f"a{n}"), turn_id=f"t{n}")
        thread.finish_turn(f"t{n}")
    thread.compact("so far", thread.stats().next_sequence - 3)
    out = tmp_path / "source.jsonl"
    assert run(capsys, server, namespace, "export", "source", "-o", str(out))[0] == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    return json.loads(lines[0]), lines[1:-1]


def test_a_message_with_a_field_named_like_the_end_line_round_trips(
    capsys, server, namespace, store, tmp_path
):
    """Unknown fields are stored as given: one named `kvstore_backup_end` is a message line."""
    thread = store.thread("source")
    thread.append([UserMessage(content=f"before {i}") for i in range(120)])
    hostile = {"message_type": "user_message", "content": "hostile", "kvstore_backup_end": 1}
    thread.append(UserMessage.model_validate(hostile))
    thread.append(UserMessage(content="after"))
    out = tmp_path / "source.jsonl"
    assert run(capsys, server, namespace, "export", "source", "-o", str(out))[0] == 0
    status, err = run(capsys, server, namespace, "import", "copy", str(out))
    assert status == 0, err
    copy = store.thread("copy")
    assert [m.to_dict() for m in copy.iter()] == [m.to_dict() for m in thread.iter()]
    assert not copy.stats().restore_unfinished
    # A plain file whose first message has a field named like the header is appended.
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps(user(1, kvstore_backup=1)) + "\n")
    status, err = run(capsys, server, namespace, "import", "plain", str(plain))
    assert status == 0, err
    assert store.thread("plain").stats().stored_messages == 1


@pytest.mark.parametrize(
    "change",
    [
        {"deleted_before": 10**6},
        {"summary_last": 999, "summary_seq": 1000},
        {"summary_seq": 10**6},
        {"turn": {"id": "t5", "seq": 10**6, "outcome": "open"}},
        {"summary_seq": 2**60},
        {"last_seq": 2**51},
        {"turns": "first start 2**51"},
        {"turns": "first last_seq past"},
        {"turns": "first outcome exploded"},
        {"turns": "first id with a tab"},
        {"turns": "first id of 100 KB"},
        {"turn": {"id": "t\x00", "seq": 1, "outcome": "open"}},
        {"prompt": {"state": "zzz", "messages": ["system 1"]}, "deleted_before": 2},
        {"prompt": {"state": "closed", "messages": [f"system {i}" for i in range(1, 18)]}},
        {"prompt": {"state": "closed", "messages": ["system 0"]}, "deleted_before": 2},
        {"prompt": {"state": "closed", "messages": ["system 2", "system 1"]}},
        {"prompt": {"state": "", "messages": ["system 1"]}, "deleted_before": 2},
    ],
)
def test_a_header_the_last_step_would_refuse_is_refused_before_any_write(
    capsys, server, namespace, store, tmp_path, change
):
    head, lines = exported(capsys, server, namespace, store, tmp_path)
    change = dict(change)
    if isinstance(change.get("turns"), str):
        field, value = {
            "first start 2**51": ("start", 2**51),
            "first last_seq past": ("last_seq", head["last_seq"] + 5),
            "first outcome exploded": ("outcome", "exploded"),
            "first id with a tab": ("id", "a\tb"),
            "first id of 100 KB": ("id", "t" * 100_000),
        }[change["turns"]]
        change["turns"] = [dict(head["turns"][0], **{field: value}), *head["turns"][1:]]
    if "prompt" in change:
        numbers = [int(text.split()[1]) for text in change["prompt"]["messages"]]
        messages = [
            SystemMessage(id=f"p{n}", date=DATE, content="be nice").to_dict() | {"seq_id": n}
            for n in numbers
        ]
        change["prompt"] = {"state": change["prompt"]["state"], "messages": messages}
        change.setdefault("deleted_before", 20)
    head.update(change)
    path = tmp_path / "edited.jsonl"
    path.write_text(sealed(head, [json.loads(line) for line in lines]), encoding="utf-8")
    refused_in_one_line(*run(capsys, server, namespace, "import", "copy", str(path)))
    assert written(server, namespace, "copy") == []


def test_a_kept_prompt_message_over_max_message_bytes_is_refused_before_any_write(
    server, namespace, server_only
):
    config = StoreConfig(namespace=namespace, max_message_bytes=4096)
    with MessageStore.from_url(server.url, config) as store:
        prompt = [SystemMessage(id="p1", date=DATE, content="x" * 8000).to_dict() | {"seq_id": 1}]
        head = header(2, deleted_before=2, prompt={"state": "closed", "messages": prompt})
        text = sealed(head, [user(2)])
        with pytest.raises(errors.KVStoreError):
            backup.import_lines(store, "copy", io.StringIO(text), progress_out=io.StringIO())
    assert written(server, namespace, "copy") == []


@pytest.mark.parametrize(
    "fields",
    [
        {"id": ""},
        {"id": "a\tb"},
        {"id": "x\x00y"},
        {"id": "i" * 300_000},
        {"otid": "o\nt"},
        {"otid": ""},
        {"turn_id": "bad\tturn"},
        {"turn_id": "t" * 100_000},
        {"seq_id": 2**51},
        {"seq_id": 9},
    ],
)
def test_ids_append_refuses_are_refused_before_any_write(
    capsys, server, namespace, tmp_path, server_only, fields
):
    """The second message carries it: the first run, holding both, is never sent."""
    messages = [user(1), user(2, **fields)]
    path = tmp_path / "bad.jsonl"
    path.write_text(sealed(header(2), messages), encoding="utf-8")
    refused_in_one_line(*run(capsys, server, namespace, "import", "copy", str(path)))
    assert written(server, namespace, "copy") == []


def test_a_duplicate_in_the_first_run_is_refused_before_any_write(
    capsys, server, namespace, tmp_path, server_only
):
    for duplicate in ([user(1), user(2, id="m1")], [user(1, otid="o"), user(2, otid="o")]):
        path = tmp_path / "dup.jsonl"
        path.write_text(sealed(header(2), duplicate), encoding="utf-8")
        refused_in_one_line(*run(capsys, server, namespace, "import", "copy", str(path)))
        assert written(server, namespace, "copy") == []
    path.write_text(sealed(header(2), [user(1), user(1, id="again")]), encoding="utf-8")
    refused_in_one_line(*run(capsys, server, namespace, "import", "copy", str(path)))
    assert written(server, namespace, "copy") == []


def test_export_fails_without_an_end_line_when_it_lists_fewer_than_stored(
    capsys, server, namespace, store, tmp_path
):
    thread = store.thread("t")
    thread.append([UserMessage(content=f"m{i}") for i in range(10)])
    client = redis.Redis.from_url(server.url)
    try:
        manifest = f"{namespace}:{{t}}:open:m"
        assert client.exists(manifest)
        client.delete(manifest)
        client.rpush(manifest, "x")  # damaged: the reader finds no messages there
    finally:
        client.close()
    out = tmp_path / "t.jsonl"
    status, err = run(capsys, server, namespace, "export", "t", "-o", str(out))
    # After its progress line, the error.
    refused_in_one_line(status, err.strip().splitlines()[-1])
    assert "it stores 10" in err
    assert not out.exists() or "kvstore_backup_end" not in out.read_text(encoding="utf-8")
    # To standard output: the lines are out, the end line never.
    assert main(["export", "t", "--url", server.url, "--namespace", namespace]) == 1
    assert "kvstore_backup_end" not in capsys.readouterr().out


def test_a_file_that_is_not_utf8_is_one_line_and_writes_nothing(
    capsys, server, namespace, tmp_path, server_only
):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"message_type":"user_message","content":"caf\xe9"}\n')
    status, err = run(capsys, server, namespace, "import", "t", str(path))
    refused_in_one_line(status, err)
    assert "UTF-8" in err
    refused_in_one_line(*import_stdin(server, namespace, "t", b"\xff\xfe\x00garbage\n"))
    assert written(server, namespace, "t") == []


def test_a_backup_cut_inside_a_character_is_incomplete(capsys, server, namespace, store, tmp_path):
    exported(capsys, server, namespace, store, tmp_path)
    data = (tmp_path / "source.jsonl").read_bytes()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(data[: data.rindex("😀".encode()) + 2])
    refused_in_one_line(*run(capsys, server, namespace, "import", "copy", str(cut)))
    with open(cut, encoding="utf-8") as lines, pytest.raises(errors.BackupIncomplete):
        backup.import_lines(store, "copy2", lines, progress_out=io.StringIO())
    status, err = import_stdin(server, namespace, "copy3", data[: data.rindex("😀".encode()) + 2])
    refused_in_one_line(status, err)
    assert "cut short" in err
