"""The executor against a client stub that answers at once: a cluster's refusals are waited out,
within a bound, on both drivers."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ClusterError

from kvstore import errors
from kvstore._engine import executor
from kvstore._engine.core import Eval
from kvstore._engine.scripts import SCRIPTS
from kvstore.store import AsyncMessageStore, MessageStore


class RefusingClient:
    """Refuses the first `refusals` commands as a cluster whose slot moves does, then answers."""

    connection_pool = None

    def __init__(self, refusals: int) -> None:
        self.refusals, self.sent = refusals, []

    def answer(self, command):
        self.sent.append(command[0])
        if self.refusals:
            self.refusals -= 1
            raise ClusterError("TTL exhausted.")
        return b"ok"

    def execute_command(self, *command):
        return self.answer(command)


class AsyncRefusingClient(RefusingClient):
    async def execute_command(self, *command):
        return self.answer(command)


def one_call():
    return (yield Eval(SCRIPTS["locate"], ("k",), ("seq", "1")))


def run(store_class, client):
    store = store_class(client)
    store.functions = False
    result = store.run(one_call())
    return asyncio.run(result) if store_class is AsyncMessageStore else result


@pytest.mark.parametrize(
    ("store_class", "client_class"),
    [(MessageStore, RefusingClient), (AsyncMessageStore, AsyncRefusingClient)],
)
def test_a_refused_call_is_sent_again_until_it_goes_through(store_class, client_class, monkeypatch):
    slept = []
    sleep = (
        (lambda s: slept.append(s) or asyncio.sleep(0))
        if store_class is AsyncMessageStore
        else slept.append
    )
    monkeypatch.setattr(store_class, "_sleep", staticmethod(sleep))
    client = client_class(refusals=3)
    assert run(store_class, client) == b"ok"
    assert client.sent == ["EVALSHA"] * 4
    assert slept == [0.02, 0.04, 0.08]


@pytest.mark.parametrize(
    ("store_class", "client_class"),
    [(MessageStore, RefusingClient), (AsyncMessageStore, AsyncRefusingClient)],
)
def test_a_call_refused_past_the_bound_raises_server_error(store_class, client_class, monkeypatch):
    monkeypatch.setattr(executor, "CLUSTER_REFUSAL_SECONDS", 0.05)
    with pytest.raises(errors.ServerError, match="the cluster refused the call"):
        run(store_class, client_class(refusals=10**6))
