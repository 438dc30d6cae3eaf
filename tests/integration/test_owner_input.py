"""Bad input to the owner methods, sync and async, on each server: every refusal is kvstore's
typed error, raised before anything is sent, and the keyspace is what it was (docs/OWNERS.md).
The command line refuses a bad owner id, cursor or limit in one line, before it starts the
embedded server."""

from __future__ import annotations

import json

import pytest

from kvstore import StoreConfig, UserMessage, errors
from kvstore._engine.layout.keys import OwnerKeys

from ..conftest import make_sync_store
from ..support.owners import keyspace, stores
from .test_cli import kvstore

BAD_OWNERS = ["", "x" * 201, "{", "}", "#", "|", "a b", "ann\n", "a\x00", "ünï", "-a", "a*"]
BAD_OWNERS += [7, b"ann", ["ann"], {"ann": "x"}, {"ann"}, 1.5]


@pytest.fixture
def make_store(backend, mode, namespace):
    yield from stores(backend, mode, namespace)


def sent_nothing(store, raw_client, namespace, calls, expected):
    """Each call raises `expected` (kvstore's class, never the server's or a codec's) and the
    keyspace is unchanged."""
    before = keyspace(raw_client, namespace)
    for call in calls:
        with pytest.raises(expected) as refused:
            call()
        assert type(refused.value).__module__ == "kvstore.errors", refused.value
    assert keyspace(raw_client, namespace) == before


def populated(make_store):
    store = make_store()
    chat = store.thread("chat", owner="ann")
    chat.append(UserMessage(content="hello"))
    chat.set_info(title="Hello", metadata={"model": "small"})
    return store, chat


def test_bad_owner_ids_are_refused_typed(make_store, raw_client, namespace):
    store, _ = populated(make_store)
    calls = []
    for owner in BAD_OWNERS:
        calls += [
            lambda owner=owner: store.threads(owner),
            lambda owner=owner: store.owner_usage(owner),
            lambda owner=owner: store.set_owner_quota(owner, threads=1),
            lambda owner=owner: store.erase_owner(owner),
            lambda owner=owner: store.thread("chat", owner=owner),
        ]
    sent_nothing(store, raw_client, namespace, calls, errors.InvalidOwnerId)


FORGED = [
    "",
    "garbage",
    "recent",
    "recent:",
    "recent:1",
    "recent:1:",
    "recent:abc:chat",
    "recent:-1:chat",
    "recent:+1:chat",
    "recent:1.5:chat",
    "recent:1e3:chat",
    "recent:inf:chat",
    "recent:\u0661\u0662:chat",  # Arabic-Indic digits: str.isdigit() says digits
    "recent:\u00b2:chat",  # a superscript two
    "recent:" + "9" * 400 + ":chat",
    "recent:1:{chat}",
    "recent:1:chat\n",
    "recent:1:" + "c" * 201,
    "created:1:chat",  # a cursor of the other order
]


def test_bad_listing_arguments_are_refused_typed(make_store, raw_client, namespace):
    store, _ = populated(make_store)
    cursors = [lambda after=after: store.threads("ann", after=after) for after in FORGED]
    cursors += [lambda after=after: store.threads("ann", after=after) for after in (5, b"x")]
    limits = [lambda v=v: store.threads("ann", limit=v) for v in (0, -1, 1001, 10**9, "5", 2.0)]
    limits += [lambda v=v: store.threads("ann", limit=v) for v in (True, None)]
    orders = [lambda v=v: store.threads("ann", order=v) for v in ("x", "RECENT", None, 1, [])]
    sent_nothing(store, raw_client, namespace, cursors + limits + orders, errors.InvalidCursor)
    wheres = [
        lambda v=v: store.threads("ann", where=v)
        for v in (
            [],
            "",
            "model=small",
            ["model"],
            {"model": 1},
            {1: "small"},
            {"": "small"},
            {"m" * 65: "x"},
            {"model": "x" * 513},
            {"a": "b", "c": "d"},
            {"model": "\ud800"},
        )
    ]
    sent_nothing(store, raw_client, namespace, wheres, errors.InvalidMessage)
    # A cursor's well-formed parts still page: the listing goes on below it.
    page = store.threads("ann", after="recent:9007199254740992:chat")
    assert [info.thread_id for info in page.threads] == ["chat"]


def test_titles_and_metadata_that_cannot_be_stored_are_refused_typed(
    make_store, raw_client, namespace
):
    store, chat = populated(make_store)
    calls = [
        lambda title=title, metadata=metadata: chat.set_info(title=title, metadata=metadata)
        for title, metadata in (
            ("\ud800", None),  # a lone surrogate: no UTF-8 for it
            (None, {"k": "\udfff"}),
            (None, {"\ud800": "v"}),
            ("x" * 201, None),
            (b"title", None),
            (None, []),
            (None, "model=small"),
            (None, {f"k{i}": "v" for i in range(17)}),
            (None, {"k": None}),
            (None, {"k": True}),
        )
    ]
    calls.append(lambda: store.thread("plain").set_info(title="no owner"))
    sent_nothing(store, raw_client, namespace, calls, errors.InvalidMessage)
    info = chat.info()
    assert (info.title, info.metadata) == ("Hello", {"model": "small"})


def test_bad_quotas_are_refused_typed(make_store, raw_client, namespace):
    store, _ = populated(make_store)
    calls = [
        lambda kind=kind, value=value: store.set_owner_quota("ann", **{kind: value})
        for kind in ("threads", "stored_bytes", "messages_per_minute")
        for value in (0, -1, 1.5, True, "5", 2**53 + 1, 2**64)
    ]
    sent_nothing(store, raw_client, namespace, calls, errors.ConfigError)


@pytest.mark.parametrize(
    "args, message",
    [
        (("threads", "a b"), "kvstore: owner id 'a b' may hold only"),
        (("threads", "x" * 201), "kvstore: owner id must be 1-200 characters"),
        (("erase-owner", "{ann}"), "kvstore: owner id '{ann}' may hold only"),
        (("erase-owner", "ann|x"), "kvstore: owner id 'ann|x' may hold only"),
        (("threads", "ann", "--after", "recent:1"), "kvstore: cursor 'recent:1' is not"),
        (("threads", "ann", "--after", "recent:\u0661:x"), "kvstore: cursor"),
        (("threads", "ann", "--limit", "0"), "kvstore: limit must be an int of 1-1000"),
        (("threads", "ann", "--limit", "abc"), "kvstore: limit must be an int of 1-1000"),
        (("threads", "ann", "--limit", "2.5"), "kvstore: limit must be an int of 1-1000"),
        (("threads", "ann", "--limit", "-3"), "kvstore: limit must be an int of 1-1000"),
        (("threads", "ann", "--limit", "٥"), "kvstore: limit must be an int of 1-1000"),
        (("threads", "ann", "--order", "oldest"), "kvstore: order must be 'recent' or 'created'"),
    ],
)
def test_the_command_line_refuses_bad_input_before_starting_a_server(tmp_path, args, message):
    data = tmp_path / "data"
    result = kvstore(*args, "--data-dir", str(data))
    assert result.returncode == 1, result
    assert result.stdout == ""
    assert result.stderr.startswith(message), result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr  # no server was started
    assert not data.exists() or not any(data.iterdir())


@pytest.mark.parametrize("part", ["recent", "created", "info", "usage"])
def test_a_foreign_value_at_an_owners_key_is_refused_or_left_alone_whole(
    make_store, raw_client, namespace, part
):
    """A key of the owner's directory holding a type kvstore does not keep there (something
    else wrote it): each write either refuses (LayoutError) with nothing written, or is made
    whole without touching that key; never a write made and then a Lua error."""
    store, chat = populated(make_store)
    stored = chat.append(UserMessage(content="second"))
    key = getattr(OwnerKeys.of(namespace, "ann"), part)
    raw_client.delete(key)
    raw_client.set(key, "foreign")
    writes = {
        "append": lambda: chat.append(UserMessage(content="more")),
        "append a new thread": lambda: store.thread("new", owner="ann").append(
            UserMessage(content="hi")
        ),
        "set_info": lambda: chat.set_info(title="renamed"),
        "set_info a new thread": lambda: store.thread("other", owner="ann").set_info(title="t"),
        "start_turn a new thread": lambda: store.thread("turned", owner="ann").start_turn("t1"),
        "replace": lambda: chat.replace(stored[0].id, UserMessage(content="replaced")),
        "quota": lambda: store.set_owner_quota("ann", threads=5),
        "delete": chat.delete,
    }
    for name, write in writes.items():
        before = keyspace(raw_client, namespace)
        try:
            write()
        except errors.LayoutError:
            assert keyspace(raw_client, namespace) == before, name
        assert raw_client.get(key) == b"foreign", name
    # The owner's reads and its erasure: refused typed, never the server's error text.
    before = keyspace(raw_client, namespace)
    reads = [
        lambda: store.threads("ann"),
        lambda: store.threads("ann", order="created"),
        store.thread("third", owner="ann").info,
        lambda: store.erase_owner("ann"),
        lambda: store.owner_usage("ann"),
    ]
    for read in reads:
        with pytest.raises(errors.LayoutError):
            read()
    assert keyspace(raw_client, namespace) == before


def test_the_command_line_prints_each_title_on_its_own_line_escaped(
    backend, server, server_only, namespace
):
    """A title is what the thread's user typed: a newline, a tab or a terminal escape in it
    must not forge a line of the listing or reach the terminal."""
    store = make_sync_store(backend, StoreConfig(namespace=namespace))
    try:
        forged = "evil\nc9\t999 messages\t0\tforged\x1b[31m red\x1b[0m\r\u2028"
        store.thread("c1", owner="ann").set_info(title=forged)
    finally:
        store.close()
    common = ("--url", server.url, "--namespace", namespace)
    printed = kvstore("threads", "ann", *common)
    assert printed.returncode == 0, printed.stderr
    (line,) = printed.stdout.splitlines()
    assert line.split("\t") == [
        "c1",
        "0 messages",
        line.split("\t")[2],
        "evil\\nc9\\t999 messages\\t0\\tforged\\x1b[31m red\\x1b[0m\\r\\u2028",
    ]
    as_json = kvstore("threads", "ann", "--json", *common)
    assert json.loads(as_json.stdout)["threads"][0]["title"] == forged


def test_a_malformed_directory_entry_reads_as_a_record_error(make_store, raw_client, namespace):
    store, chat = populated(make_store)
    keys = OwnerKeys.of(namespace, "ann")
    for planted in ('{"metadata": {"model": 1}}', '{"title": 7}', "[1, 2]", "not json"):
        raw_client.hset(keys.info, "chat", planted)
        with pytest.raises(errors.RecordError):
            chat.info()
        with pytest.raises(errors.RecordError):
            store.threads("ann")
    raw_client.hset(keys.usage, "t:chat", "garbage")
    raw_client.hdel(keys.info, "chat")
    with pytest.raises(errors.RecordError):
        chat.info()


def test_a_directory_score_no_int_holds_reads_as_a_record_error(make_store, raw_client, namespace):
    """A score something else wrote (inf, -inf): a RecordError naming the field, never an
    OverflowError from its int()."""
    store, chat = populated(make_store)
    keys = OwnerKeys.of(namespace, "ann")
    for score in (float("inf"), float("-inf")):
        raw_client.zadd(keys.recent, {"chat": score})
        for read in (chat.info, chat.stats, lambda: store.threads("ann")):
            with pytest.raises(errors.RecordError, match="last activity"):
                read()
