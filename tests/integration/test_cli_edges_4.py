"""The command line's edges, fourth round: a key prefix holding glob characters finds its own
sessions only, a plain file with one id or otid twice is refused, not half stored, and numbers
no command can use are one line before anything starts."""

from __future__ import annotations

import json

import pytest
from langchain_core import messages as lc

from kvstore import MessageStore, StoreConfig
from kvstore.cli.main import main as cli


def _whole_stderr_one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("kind", ["langchain", "openai-agents"])
def test_a_key_prefix_with_glob_characters_is_taken_as_it_is(
    backend, server_only, server, raw_client, namespace, capsys, kind
):
    prefix = f"{namespace}:h[1]*?"
    decoys = [f"{namespace}:h1x?", f"{namespace}:h1zz"]  # what the glob, unescaped, matches
    if kind == "langchain":
        mine, others = f"{prefix}abc", [f"{d}abc" for d in decoys]
        said = [json.dumps(lc.message_to_dict(lc.HumanMessage(content=t))) for t in ("mine", "no")]
        raw_client.lpush(mine, said[0])
    else:
        mine, others = f"{prefix}:abc:messages", [f"{d}:abc:messages" for d in decoys]
        said = [json.dumps({"role": "user", "content": t}) for t in ("mine", "no")]
        raw_client.rpush(mine, said[0])
    for other in others:
        (raw_client.lpush if kind == "langchain" else raw_client.rpush)(other, said[1])
    args = ["import-from", kind, "--url", server.url, "--namespace", namespace]
    assert cli([*args, "--key-prefix", prefix]) == 0
    out = capsys.readouterr().out
    assert mine in out and not any(other in out for other in others), out
    with MessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as store:
        assert [m.content for m in store.thread("abc").iter()] == ["mine"]


@pytest.mark.parametrize("field", ["id", "otid"])
def test_a_plain_file_with_one_id_twice_is_refused_not_half_stored(
    backend, server_only, server, namespace, tmp_path, capsys, field
):
    lines = [
        {"message_type": "user_message", "content": "one", field: "same-1"},
        {"message_type": "user_message", "content": "two", field: "same-1"},
    ]
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps(line) + "\n" for line in lines))
    at = ["--url", server.url, "--namespace", namespace]
    assert cli(["import", "t", str(plain), *at]) == 1
    line = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("  ")]
    assert len(line) == 1 and "same-1" in line[0], line
    with MessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as store:
        assert store.thread("t").stats().stored_messages == 0


@pytest.mark.parametrize(
    "args, flag",
    [
        (["server", "--port", "99999"], "--port must be 0..65535"),
        (["server", "--port", "-1"], "--port must be 0..65535"),
        (["demo", "--threads", "0"], "--threads must be at least 1"),
        (["demo", "--workers", "-2"], "--workers must be at least 1"),
        (["demo", "--turns", "0"], "--turns must be at least 1"),
        (
            ["import-from", "langchain", "--url", "redis://127.0.0.1:1", "--batch", "0"],
            "--batch must be 1..500",
        ),
        (
            ["import-from", "langchain", "--url", "redis://127.0.0.1:1", "--batch", "501"],
            "--batch must be 1..500",
        ),
    ],
)
def test_a_number_no_command_can_use_is_one_line_before_anything_starts(
    args, flag, tmp_path, capsys
):
    data_dir = tmp_path / "data"
    if args[0] in ("server", "demo"):
        args = [*args, "--data-dir", str(data_dir)]
    assert cli(args) == 1
    assert (
        _whole_stderr_one_line(capsys)
        == f"kvstore: {flag}, got {args[args.index(flag.split()[0]) + 1]}"
    )
    assert not data_dir.exists()  # no embedded server was started, nothing made
