"""A store's connections pack commands of bytes and str with hiredis directly
(kvstore/_engine/packing.py): the bytes sent, and the errors raised, are redis-py's own."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore._engine.failures import track_sends
from kvstore._engine.packing import _QuickPacker


def _connections(**kwargs):
    """A connection of a client a store tracks, and one of a plain client, alike otherwise."""
    tracked = redis.Redis(**kwargs)
    assert track_sends(tracked)
    plain = redis.Redis(**kwargs)
    return (
        tracked.connection_pool.make_connection(),
        plain.connection_pool.make_connection(),
    )


TRACKED, PLAIN = _connections()

NAMES = st.sampled_from(["FCALL", "HMGET", b"MGET", "CLIENT SETINFO", b"FUNCTION LOAD", "é"])
ARGUMENTS = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=20),  # lone surrogates among: refused by both
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.binary(max_size=20).map(bytearray),
    st.binary(max_size=20).map(memoryview),
    st.booleans(),
    st.none(),
)
COMMANDS = st.tuples(NAMES, st.lists(ARGUMENTS, max_size=8)).map(lambda c: (c[0], *c[1]))


def _packed(pack, *args):
    """What `pack` returns (joined bytes), or the type of what it raises."""
    try:
        return b"".join(bytes(chunk) for chunk in pack(*args))
    except Exception as exc:  # the same type from both packers
        return type(exc)


def test_a_store_s_connections_pack_with_hiredis_directly():
    assert isinstance(TRACKED._command_packer, _QuickPacker)
    assert not isinstance(PLAIN._command_packer, _QuickPacker)


@settings(max_examples=400, deadline=None)
@given(COMMANDS)
def test_a_command_packs_to_what_redis_py_packs(command):
    assert _packed(TRACKED.pack_command, *command) == _packed(PLAIN.pack_command, *command)


@settings(max_examples=200, deadline=None)
@given(st.lists(COMMANDS, min_size=1, max_size=6))
def test_a_pipeline_packs_to_what_redis_py_packs(commands):
    assert _packed(TRACKED.pack_commands, commands) == _packed(PLAIN.pack_commands, commands)


def test_an_append_s_command_takes_hiredis_and_a_redis_py_command_does_not(monkeypatch):
    """The fast path is taken for a store's commands (bytes and str only), and not for one
    that holds an int, a memoryview or a name with a space: those go to redis-py's packer."""
    slow = []
    packer = TRACKED._command_packer
    monkeypatch.setattr(packer, "slow", _Recording(packer.slow, slow))
    keys = [f"kv:{{t}}:part{i}" for i in range(14)]
    TRACKED.pack_command("FCALL", "kvstore_append", b"14", *keys, b"0", "", b"x" * 2000)
    assert slow == []
    for command in (("SELECT", 0), ("SET", "k", memoryview(b"v")), ("CLIENT SETINFO", "a", "b")):
        TRACKED.pack_command(*command)
    assert [c[0] for c in slow] == ["SELECT", "SET", "CLIENT SETINFO"]


class _Recording:
    def __init__(self, packer, calls):
        self.packer, self.calls = packer, calls

    def pack(self, *args):
        self.calls.append(args)
        return self.packer.pack(*args)


@pytest.mark.parametrize(
    "kwargs", [{"encoding": "latin-1"}, {"encoding_errors": "replace"}, {"encoding": "utf-16"}]
)
def test_a_client_with_another_encoding_keeps_redis_py_s_packer(kwargs):
    tracked, plain = _connections(**kwargs)
    assert not isinstance(tracked._command_packer, _QuickPacker)
    command = ("SET", "é", "\udc80" if "encoding_errors" in kwargs else "ü")
    assert _packed(tracked.pack_command, *command) == _packed(plain.pack_command, *command)


def test_an_asyncio_store_s_connections_pack_the_same():
    async def pack():
        tracked, plain = redis.asyncio.Redis(), redis.asyncio.Redis()
        assert track_sends(tracked)
        mine = tracked.connection_pool.make_connection()
        theirs = plain.connection_pool.make_connection()
        assert isinstance(mine._command_packer, _QuickPacker)
        command = ("FCALL", "f", b"1", "kv:{t}:m", "é", b"\x00\xff")
        assert _packed(mine.pack_command, *command) == _packed(theirs.pack_command, *command)
        both = [command, ("HMGET", "k", 1, 2.5)]
        assert _packed(mine.pack_commands, both) == _packed(theirs.pack_commands, both)
        await tracked.aclose()
        await plain.aclose()

    asyncio.run(pack())
