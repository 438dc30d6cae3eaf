"""A backup of an owned thread carries its title and metadata (docs/OWNERS.md, "Backups"): a
restore into an owner's thread sets them again, one without an owner leaves them out, and a
header whose title or metadata no thread could carry is refused before any write."""

from __future__ import annotations

import io
import json

import pytest

from kvstore import AssistantMessage, MessageStore, StoreConfig, UserMessage, errors
from kvstore.cli.backup import export, import_lines
from kvstore.cli.main import main as cli

OWNER = "user-42"
TITLE = "Weather in Oslo \u2014 \u00e6\u00f8\u00e5"
METADATA = {"model": "small", "lang": "nb", "note": "tab\there, line\nthere"}


@pytest.fixture
def store(backend, server_only, server, namespace):
    with MessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as made:
        chat = made.thread("session-7", owner=OWNER)
        chat.append([UserMessage(content="hi"), AssistantMessage(content="hello")])
        chat.set_info(title=TITLE, metadata=METADATA)
        yield made


def _backup(store) -> str:
    out = io.StringIO()
    export(store, "session-7", out, progress_out=io.StringIO(), owner=OWNER)
    return out.getvalue()


@pytest.mark.parametrize("target_owner", [OWNER, "user-43"])
def test_a_restore_into_an_owner_sets_the_title_and_metadata(store, target_owner):
    text = _backup(store)
    head = json.loads(text.splitlines()[0])
    assert head["info"] == {"title": TITLE, "metadata": METADATA}
    import_lines(
        store, "restored", io.StringIO(text), progress_out=io.StringIO(), owner=target_owner
    )
    info = store.thread("restored", owner=target_owner).info()
    assert info is not None
    assert (info.title, info.metadata, info.messages) == (TITLE, METADATA, 2)
    # Run again (an import interrupted anywhere is finished so): the same, listed once.
    import_lines(
        store, "restored", io.StringIO(text), progress_out=io.StringIO(), owner=target_owner
    )
    listed = [i for i in store.threads(target_owner).threads if i.thread_id == "restored"]
    assert [(i.title, i.metadata) for i in listed] == [(TITLE, METADATA)]


def test_the_cli_round_trip_keeps_them(store, server, namespace, tmp_path):
    backup = tmp_path / "chat.jsonl"
    at = ["--url", server.url, "--namespace", namespace]
    assert cli(["export", "session-7", "--owner", OWNER, "-o", str(backup), *at]) == 0
    store.thread("session-7", owner=OWNER).delete()
    assert cli(["import", "session-7", str(backup), "--owner", OWNER, *at]) == 0
    info = store.thread("session-7", owner=OWNER).info()
    assert info is not None and (info.title, info.metadata) == (TITLE, METADATA)


def test_only_what_was_set_is_carried(store):
    store.thread("bare", owner=OWNER).append(UserMessage(content="x"))
    out = io.StringIO()
    export(store, "bare", out, progress_out=io.StringIO(), owner=OWNER)
    assert "info" not in json.loads(out.getvalue().splitlines()[0])
    titled = store.thread("titled", owner=OWNER)
    titled.append(UserMessage(content="x"))
    titled.set_info(title="Oslo")
    out = io.StringIO()
    export(store, "titled", out, progress_out=io.StringIO(), owner=OWNER)
    assert json.loads(out.getvalue().splitlines()[0])["info"] == {"title": "Oslo", "metadata": {}}
    titled.set_info(title="", metadata={"k": "v"})  # an empty title removes it
    out = io.StringIO()
    export(store, "titled", out, progress_out=io.StringIO(), owner=OWNER)
    assert json.loads(out.getvalue().splitlines()[0])["info"] == {"metadata": {"k": "v"}}


def test_a_restore_without_an_owner_leaves_them_out(store):
    text = _backup(store)
    import_lines(store, "plain", io.StringIO(text), progress_out=io.StringIO())
    assert [m.content for m in store.thread("plain").iter()] == ["hi", "hello"]
    assert store.thread("plain").info() is None


@pytest.mark.parametrize(
    "info",
    [
        {"title": "x" * 201},
        {"title": 7},
        {"metadata": {"k": 1}},
        {"metadata": {str(i): "v" for i in range(17)}},
        {"metadata": ["k", "v"]},
        {"title": "ok", "colour": "red"},
        "Oslo",
    ],
)
def test_a_header_info_no_thread_can_carry_writes_nothing(store, info):
    lines = _backup(store).splitlines(keepends=True)
    head = json.loads(lines[0])
    head["info"] = info
    text = json.dumps(head) + "\n" + "".join(lines[1:])
    with pytest.raises(errors.InvalidMessage, match="info"):
        import_lines(store, "restored", io.StringIO(text), progress_out=io.StringIO(), owner=OWNER)
    assert store.thread("restored", owner=OWNER).stats().stored_messages == 0
    assert "restored" not in {i.thread_id for i in store.threads(OWNER).threads}
