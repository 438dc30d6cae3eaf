"""How fast the importers move a Redis chat history into kvstore (docs/MIGRATING.md).

    python -m benchmarks.imports [--messages 10000] [--sessions 100]

On a fresh Valkey (and Debian's Redis where installed), with messages LangChain's and
LlamaIndex's own classes serialize (~200 bytes of text each, every fifth an AI message with a
tool call and its tool return): one session of ``--messages`` messages, then ``--sessions``
sessions of 100, imported with kvstore.importers into the same server; then the same import
run again (everything already stored). Prints messages imported per second and the times.
Needs the test extra's langchain-core and llama-index-core.
"""

from __future__ import annotations

import argparse
import json
import time

import redis

from kvstore import MessageStore, StoreConfig
from kvstore.importers import import_langchain, import_llamaindex

from . import _servers


def langchain_records(count: int, session: int) -> list[bytes]:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage, message_to_dict

    text = "Some words of a conversation about the weather in Oslo and elsewhere. " * 3
    records = []
    for n in range(count):
        if n % 5 == 3:
            message = AIMessage(
                "",
                tool_calls=[{"name": "weather", "args": {"city": "Oslo"}, "id": f"c{session}-{n}"}],
            )
        elif n % 5 == 4:
            message = ToolMessage("cloudy, 4 °C", tool_call_id=f"c{session}-{n - 1}")
        elif n % 2:
            message = AIMessage(f"{n}: {text}")
        else:
            message = HumanMessage(f"{n}: {text}")
        records.append(json.dumps(message_to_dict(message)).encode())
    return records


def llamaindex_records(count: int) -> list[bytes]:
    from llama_index.core.llms import ChatMessage

    text = "Some words of a conversation about the weather in Oslo and elsewhere. " * 3
    return [
        ChatMessage(role="user" if n % 2 == 0 else "assistant", content=f"{n}: {text}")
        .model_dump_json()
        .encode()
        for n in range(count)
    ]


def timed(label: str, run, messages: int) -> float:
    started = time.perf_counter()
    results = run()
    elapsed = time.perf_counter() - started
    assert not any(r.error for r in results), [r.error for r in results if r.error]
    imported = sum(r.imported for r in results)
    rate = f"{messages / elapsed:,.0f} source messages/s" if elapsed else "-"
    print(f"  {label:<44} {elapsed * 1000:>9,.0f} ms  {rate}  ({imported:,} imported now)")
    return elapsed


def run_on(url: str, messages: int, sessions: int) -> None:
    source = redis.Redis.from_url(url)
    store = MessageStore.from_url(url, StoreConfig(namespace="bench-import"))
    with source.pipeline(transaction=False) as pipe:
        # LPUSH one at a time, oldest first, as RedisChatMessageHistory.add_message does
        pipe.lpush("message_store:long", *langchain_records(messages, 0))
        for session in range(sessions):
            pipe.lpush(f"message_store:s{session}", *langchain_records(100, session + 1))
        pipe.rpush("llama:long", *llamaindex_records(messages))
        pipe.execute()
    timed(
        f"langchain, 1 session of {messages:,}",
        lambda: import_langchain(store, source, "message_store:long"),
        messages,
    )
    timed(
        f"langchain, {sessions} sessions of 100",
        lambda: import_langchain(store, source, "message_store:s*"),
        sessions * 100,
    )
    timed(
        f"llamaindex, 1 chat of {messages:,}",
        lambda: import_llamaindex(store, source, "llama:long"),
        messages,
    )
    timed(
        "langchain, all again (nothing to store)",
        lambda: import_langchain(store, source),
        messages + sessions * 100,
    )
    store.close()
    source.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--sessions", type=int, default=100)
    args = parser.parse_args()
    _servers.stop_on_sigterm()
    for name, binary in _servers.available():
        with _servers.running(name, binary) as server:
            print(f"{name} on {server.url}")
            run_on(server.url, args.messages, args.sessions)


if __name__ == "__main__":
    main()
