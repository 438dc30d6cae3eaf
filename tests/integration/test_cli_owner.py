"""`--owner` on the commands that name one thread (docs/OWNERS.md): the command acts on the
owner's thread, a bad owner id is one line and exit 1 before a store is opened, and without
--owner an owned thread stays out of reach (it is another thread)."""

from __future__ import annotations

import pytest

from kvstore import AssistantMessage, MessageStore, StoreConfig, UserMessage
from kvstore.cli.main import main as cli

from ..support.backup_files import one_error_line

OWNER = "user-42"
# Every command that names one thread (`kvstore --help`), with the rest of its arguments.
THREAD_COMMANDS = {
    "inspect": ["inspect", "session-7"],
    "export": ["export", "session-7"],
    "import": ["import", "session-7", "-"],
    "fork": ["fork", "session-7", "copy", "--at", "1"],
}


@pytest.fixture
def store(backend, server_only, server, namespace):
    with MessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as made:
        chat = made.thread("session-7", owner=OWNER)
        chat.append([UserMessage(content="hi"), AssistantMessage(content="hello")])
        chat.append(UserMessage(content="and tomorrow?"))
        chat.set_info(title="Oslo", metadata={"model": "small"})
        yield made


def _at(server, namespace) -> list[str]:
    return ["--url", server.url, "--namespace", namespace]


@pytest.mark.parametrize("command", sorted(THREAD_COMMANDS))
def test_every_thread_command_takes_an_owner(command, capsys):
    with pytest.raises(SystemExit) as ended:
        cli([command, "--help"])
    assert ended.value.code == 0
    assert "--owner OWNER" in capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(THREAD_COMMANDS))
@pytest.mark.parametrize("owner", ["", "user 42", "#user", "x" * 201, "user|42"])
def test_a_bad_owner_is_one_line_before_a_store_is_opened(command, owner, capsys):
    # An unreachable URL: a check made after connecting would say "cannot reach" instead.
    args = [*THREAD_COMMANDS[command], "--owner", owner, "--url", "redis://127.0.0.1:1"]
    assert cli(args) == 1
    line = one_error_line(capsys)
    assert line.startswith("kvstore: ") and "owner" in line, line
    assert "cannot reach" not in line


def test_without_the_owner_the_owned_thread_is_another_thread(store, server, namespace, capsys):
    for args in (THREAD_COMMANDS["inspect"], THREAD_COMMANDS["export"]):
        assert cli([*args, *_at(server, namespace)]) == 1
        assert "'session-7' not found" in one_error_line(capsys)


def test_fork_with_the_owner_makes_a_thread_of_the_same_owner(store, server, namespace, capsys):
    args = ["fork", "session-7", "copy", "--at", "2", "--owner", OWNER, *_at(server, namespace)]
    assert cli(args) == 0
    assert "into copy: 2 messages" in capsys.readouterr().err
    copy = store.thread("copy", owner=OWNER)
    assert [m.content for m in copy.iter()] == ["hi", "hello"]
    assert {info.thread_id for info in store.threads(OWNER).threads} == {"session-7", "copy"}
    assert store.thread("copy").stats().stored_messages == 0  # no unowned "copy" was made


def test_fork_of_an_owned_thread_without_the_owner_makes_nothing(store, server, namespace, capsys):
    args = ["fork", "session-7", "copy", "--at", "1", *_at(server, namespace)]
    assert cli(args) == 1
    one_error_line(capsys)
    assert [info.thread_id for info in store.threads(OWNER).threads] == ["session-7"]


@pytest.mark.parametrize("target_owner", [OWNER, "user-43"])
def test_an_owned_backup_round_trips_into_an_owner(
    target_owner, store, server, namespace, tmp_path, capsys
):
    backup = tmp_path / "chat.jsonl"
    at = _at(server, namespace)
    assert cli(["export", "session-7", "--owner", OWNER, "-o", str(backup), *at]) == 0
    assert cli(["import", "restored", str(backup), "--owner", target_owner, *at]) == 0
    source = [m.model_dump() for m in store.thread("session-7", owner=OWNER).iter()]
    restored = [m.model_dump() for m in store.thread("restored", owner=target_owner).iter()]
    assert restored == source
    assert "restored" in {info.thread_id for info in store.threads(target_owner).threads}
    # Nothing reached the unowned thread of either id.
    assert not store.thread("restored").stats().stored_messages
    # A file of plain message lines goes to the owner's thread too, once however often.
    plain = tmp_path / "plain.jsonl"
    plain.write_text(
        '{"message_type":"user_message","content":"one"}\n'
        '{"message_type":"assistant_message","content":"two"}\n'
    )
    for _ in range(2):
        assert cli(["import", "plain", str(plain), "--owner", target_owner, *at]) == 0
    assert [m.content for m in store.thread("plain", owner=target_owner).iter()] == ["one", "two"]
    assert not store.thread("plain").stats().stored_messages
    # The owner's thread exported as LangChain's JSON.
    langchain = tmp_path / "chat.json"
    export = [
        "export",
        "session-7",
        "--owner",
        OWNER,
        "--format",
        "langchain",
        "-o",
        str(langchain),
    ]
    assert cli([*export, *at]) == 0
    assert "and tomorrow?" in langchain.read_text()


def test_inspect_with_the_owner_shows_the_owned_thread(store, server, namespace, capsys):
    assert cli(["inspect", "session-7", "--owner", OWNER, *_at(server, namespace)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"thread session-7 of owner {OWNER} (namespace {namespace}, layout 3)")
    assert "  messages stored   3 " in out
