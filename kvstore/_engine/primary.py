"""A durable write on a cluster client: its script and the WAIT (or WAITAOF) after it on one
connection to the primary that owns the thread's slot. A cluster pipeline sends WAIT, which
names no key, to whichever node it picks; here both go to the key's node, as a standalone
client's pipeline sends them.

A refusal of the script (MOVED, ASK, TRYAGAIN, CLUSTERDOWN: nothing ran) refreshes the client's
slot map and is raised as redis-py's ClusterError, which the executor backs off on and sends
again. A connection that failed refreshes the map too before its error goes on, so the caller's
re-send (the outcome is unknown then) finds the slot's new primary after a failover.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from redis.asyncio.cluster import PipelineCommand
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .drivers import Step, wire

# MovedError is an AskError.
_REFUSALS = (AskError, TryAgainError, ClusterDownError)
_LOST = (RedisConnectionError, RedisTimeoutError)


class OnPrimary(Step):
    """Commands on one connection to the primary of `key`'s slot (a cluster client); each
    command's error comes back in its reply's place, as Pipeline(raise_on_error=False) does."""

    __slots__ = ("commands", "key")

    def __init__(self, key: str, commands: Sequence[Sequence[Any]]) -> None:
        self.key, self.commands = key, commands

    def __call__(self, store: Any) -> Any:
        client = store.client
        if isinstance(client, AsyncRedisCluster):
            return _on_async_node(client, self.key, self.commands)
        pipe = client.get_node_from_key(self.key).redis_connection.pipeline(transaction=False)
        for command in self.commands:
            pipe.execute_command(*wire(command))
        try:
            replies = pipe.execute(raise_on_error=False)
        except _LOST:
            _refresh(client)
            raise
        if isinstance(replies[0], _REFUSALS):
            _refresh(client)
            raise _refused(replies[0])
        return replies


async def _on_async_node(client: Any, key: str, commands: Sequence[Sequence[Any]]) -> Any:
    await client.initialize()  # the slot map, read on the client's first call (once)
    node = client.get_node_from_key(key)
    queued = [PipelineCommand(i, *wire(command)) for i, command in enumerate(commands)]
    try:
        await node.execute_pipeline(queued)
        lost = next((c.result for c in queued if isinstance(c.result, _LOST)), None)
        if lost is not None:
            raise lost
    except _LOST:
        await _refresh_async(client)
        raise
    replies = [command.result for command in queued]
    if isinstance(replies[0], _REFUSALS):
        await _refresh_async(client)
        raise _refused(replies[0])
    return replies


def _refused(reply: Exception) -> ClusterError:
    refusal = ClusterError(f"the thread's primary refused the durable write: {reply}")
    refusal.__cause__ = reply
    return refusal


def _refresh(client: Any) -> None:
    """The slot map read again; a cluster that cannot answer leaves it as it was (the error the
    caller gets is the one that made the refresh)."""
    with contextlib.suppress(RedisError):
        client.nodes_manager.initialize()


async def _refresh_async(client: Any) -> None:
    with contextlib.suppress(RedisError):
        await client.nodes_manager.initialize()
