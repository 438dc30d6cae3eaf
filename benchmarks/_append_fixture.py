"""The append benchmark's fixture on one server: the threads, JSON lists and baseline keys it
fills before anything is timed, and the JSON list's reads.

Its threads: "thread of 100" is a pool of threads, each filled with SMALL messages, that take
SMALL_THREAD_APPENDS measured appends each in turn, so the thread appended to always holds
100-200 messages; the batch appends and kvstore's script alone have pools of their own; the page
reads use one more thread that no append touches; "the big thread" is filled to `Params.big`.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import redis

from kvstore import Thread, UserMessage
from kvstore.messages import MESSAGE_LIST_ADAPTER

from ._common import BARE_KEYS, BARE_SCRIPT, TEXTS, Fixture, log, new_messages
from ._engine import core, encode_record

PAGE = 50
SMALL = 100  # messages in the small threads
SMALL_THREAD_APPENDS = 100  # measured appends per small thread, so it holds 100-200 messages
BATCH = 10  # messages in one batch append


@dataclass(frozen=True)
class Params:
    calls: int  # measured calls per variant
    warmup: int  # unrecorded rounds before them
    big: int  # messages in the big thread
    whole_calls: dict[int, int]  # whole-list reads: list size -> measured calls
    server_calls: int  # calls per operation for the server-time figures


class Bench(Fixture):
    """The threads, lists and keys of one run on one server."""

    params: Params

    def __init__(self, url: str, params: Params, own: bool) -> None:
        super().__init__(url, params, own)
        self.messages = [UserMessage(content=t) for t in self.texts]
        self.threads: list[Thread] = []
        self.keys: list[str] = []

    def key(self, name: str) -> str:
        key = f"{self.ns}:{{bench}}:{name}"
        self.keys.append(key)
        return key

    def thread(self, name: str) -> Thread:
        thread = self.store.thread(name)
        self.threads.append(thread)
        return thread

    def pool(self, name: str, calls_per_thread: int) -> list[Thread]:
        """Enough threads of SMALL messages for every call (warm-up included), `calls_per_thread`
        calls each."""
        size = math.ceil((self.params.warmup + self.params.calls) / calls_per_thread) + 1
        threads = [self.thread(f"{name}-{i}") for i in range(size)]
        for thread in threads:
            self.fill(thread, SMALL)
        return threads

    # --- filling

    def fill(self, thread: Thread, count: int) -> list:
        """Appends `count` messages in batches no larger than one call's rollover moves, so the
        thread ends in its steady state (window of 64-96, the rest in chunks); returns the stored
        messages of a thread of up to 1,000."""
        batch = min(
            self.config.max_batch_messages, self.config.max_chunks_per_call * self.config.chunk_size
        )
        stored, done = [], 0
        while done < count:
            n = min(batch, count - done)
            stored_now = thread.append(new_messages(self.texts, n, done))
            if count <= 1000:
                stored += stored_now
            done += n
        return stored

    def json_list(self, name: str, count: int) -> str:
        key = self.key(name)
        now = datetime.now(UTC)
        pipe = self.client.pipeline(transaction=False)
        for i in range(count):
            message = UserMessage(
                id=f"message-{uuid.uuid4()}", date=now, content=self.texts[i % TEXTS], seq_id=i + 1
            )
            pipe.rpush(key, message.to_json())
            if i % 1000 == 999:
                pipe.execute()
        pipe.execute()
        return key

    def setup(self) -> None:
        log(f"  filling: {SMALL}-message threads, a {self.params.big:,}-message thread, JSON lists")
        small_messages = self.fill_threads()
        self.fill_lists(small_messages)
        self.fill_baselines()
        self.build_script_requests()

    def fill_threads(self) -> list:
        """kvstore's threads; returns the messages of the one the page reads use."""
        p = self.params
        self.read_small = self.thread("read-100")
        small_messages = self.fill(self.read_small, SMALL)
        self.small_pool = self.pool("append-100", SMALL_THREAD_APPENDS)
        # Batch appends: each pool thread takes SMALL_THREAD_APPENDS / BATCH calls of BATCH messages.
        self.batch_pool = self.pool("batch-100", SMALL_THREAD_APPENDS // BATCH)
        self.big = self.thread("big")
        started = time.perf_counter()
        self.fill(self.big, p.big)
        log(f"  {p.big:,} messages stored in {time.perf_counter() - started:.1f} s")
        self.big_before = self.big.stats()
        limit = self.config.window_size + self.config.chunk_size
        if self.big_before.window_messages > limit:
            raise RuntimeError(
                f"the big thread's window holds {self.big_before.window_messages} messages"
            )
        return small_messages

    def fill_lists(self, small_messages: list) -> None:
        """The list layout, holding the very messages kvstore returns for the small thread, and
        lists of the big thread's size and of each whole-list size."""
        self.list_100 = self.key("list-100")
        self.client.rpush(self.list_100, *(m.to_json() for m in small_messages))
        self.lists = {self.params.big: self.json_list(f"list-{self.params.big}", self.params.big)}
        for size in self.params.whole_calls:
            if size not in self.lists:
                self.lists[size] = self.json_list(f"list-{size}", size)

    def fill_baselines(self) -> None:
        """The baselines' keys: the bytes of a real record, a hash, a 4-write script."""
        p = self.params
        stamped = self.messages[0].model_copy(
            update={"id": f"message-{uuid.uuid4()}", "date": datetime.now(UTC)}
        )
        self.blob = encode_record(stamped)
        self.json_bytes = len(stamped.to_json())
        self.raw_key = self.key("raw")
        self.raw_batch_key = self.key("raw-batch")
        self.script_keys = [self.key(n) for n in BARE_KEYS]
        self.script_sha = self.client.script_load(BARE_SCRIPT)
        self.ids = [
            f"message-{uuid.uuid4()}" for _ in range(p.warmup + p.calls + p.server_calls + 10)
        ]

    def build_script_requests(self) -> None:
        """kvstore's own append script with its arguments built before the clock starts: the
        append minus its client-side work. The requests come from the core itself, each with a
        fresh message id, for a pool of small threads of their own."""
        pool = self.pool("script-100", SMALL_THREAD_APPENDS)
        refs = [core.ThreadRef.of(self.config, f"script-100-{i}") for i in range(len(pool))]
        self.script_requests = []
        for i in range(self.params.warmup + self.params.calls):
            operation = core.append(
                refs[i // SMALL_THREAD_APPENDS], new_messages(self.texts, 1, i), None
            )
            request = next(operation)
            operation.close()
            self.script_requests.append(request)

    def bare_script(self, client: redis.Redis, message_id: str) -> int:
        """One call of the bare 4-write script on `client`, with the record's bytes."""
        return client.evalsha(self.script_sha, 4, *self.script_keys, message_id, self.blob)

    # --- reading

    def list_page(self, key: str) -> list:
        raw = self.client.lrange(key, -PAGE, -1)
        raw.reverse()  # newest first, like order="desc"
        return MESSAGE_LIST_ADAPTER.validate_python([json.loads(item) for item in raw])

    def list_whole(self, key: str) -> list:
        raw = self.client.lrange(key, 0, -1)
        return MESSAGE_LIST_ADAPTER.validate_python([json.loads(item) for item in raw])

    def check(self) -> None:
        """Every read variant returns the page it claims to, before anything is timed. A kvstore
        page that does not is left out of the run (`pages_ok` False, and said), not timed."""
        for key in (self.list_100, self.lists[self.params.big]):
            if len(self.list_page(key)) != PAGE:
                raise RuntimeError("list page is not 50 messages")
        self.pages_ok = True
        for thread, stored in ((self.read_small, SMALL), (self.big, self.params.big)):
            page = thread.list(limit=PAGE, order="desc")
            sequences = [m.seq_id for m in page.messages]
            if sequences != list(range(stored, stored - PAGE, -1)) or not page.has_more:
                log(f"  NOT MEASURED: kvstore's newest page read {sequences[:3]}... of {stored}")
                self.pages_ok = False
        if not self.pages_ok:
            return
        kvstore_page = [
            m.to_dict() for m in self.read_small.list(limit=PAGE, order="desc").messages
        ]
        list_page = [m.to_dict() for m in self.list_page(self.list_100)]
        if kvstore_page != list_page:
            raise RuntimeError("kvstore and the JSON list do not hold the same messages")

    def cleanup(self) -> None:
        for thread in self.threads:
            thread.delete()
        for start in range(0, len(self.keys), 100):
            self.client.delete(*self.keys[start : start + 100])
