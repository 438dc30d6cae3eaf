"""Timeouts: a tiny socket timeout, a paused server, redis-py's default retry left on.

redis-py re-sends a timed-out command up to 10 times by default, and a timed-out script may
already have run: every re-send of an append must be a harmless replay. The caller sees success
or OutcomeUnknown, never a duplicate; an OutcomeUnknown call re-sent with its otids stores once.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvstore import MessageStore, StoreConfig, UserMessage, errors

from ..support.layout_check import check_layout
from .support import dedicated_server, fresh_namespace

TIMEOUT = 0.05


def _text(message) -> str:
    return message.content if isinstance(message.content, str) else message.content[0].text


def _connections(admin: redis.Redis) -> int:
    """Connections the server accepted so far: redis-py re-sends a timed-out call on a new one."""
    return int(admin.info("stats")["total_connections_received"])


class Calls:
    """Each append made: its content, otid and what the caller saw."""

    def __init__(self) -> None:
        self.made: list[tuple[str, str | None, str]] = []
        self.lock = threading.Lock()

    def append(self, thread, content: str, otid: str | None) -> str:
        began = time.monotonic()
        try:
            thread.append(UserMessage(content=content, otid=otid))
            outcome = "success" if time.monotonic() - began < TIMEOUT else "success after a timeout"
        except errors.OutcomeUnknown:
            outcome = "OutcomeUnknown"
        except Exception as exc:
            outcome = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
        with self.lock:
            self.made.append((content, otid, outcome))
        return outcome


def test_paused_server_gives_success_or_outcome_unknown_never_a_duplicate(kind):
    with dedicated_server(kind, "--enable-debug-command", "yes") as server:
        admin = redis.Redis(port=server.port)
        namespace = fresh_namespace()
        config = StoreConfig(namespace=namespace, window_size=8, chunk_size=4)

        def impatient_store(connected: bool = False) -> MessageStore:
            # Default retry (10 re-sends with backoff) and a 50 ms socket timeout.
            client = redis.Redis(port=server.port, socket_timeout=TIMEOUT)
            if connected:
                client.ping()  # a pooled connection, its handshake done
            return MessageStore(client, config)

        thread = impatient_store().thread("paused")
        thread.append(UserMessage(content="warm up"))  # loads the script
        calls = Calls()
        connections = _connections(admin)

        # 1. Short pauses of both kinds at random, while appends run back to back.
        stop = threading.Event()
        pauses = Counter()

        def pauser():
            rng = random.Random(3)
            control = redis.Redis(port=server.port)
            while not stop.is_set():
                time.sleep(rng.uniform(0.05, 0.25))
                if rng.random() < 0.5:
                    control.execute_command("CLIENT", "PAUSE", rng.randint(60, 400), "WRITE")
                    pauses["CLIENT PAUSE WRITE"] += 1
                else:
                    control.execute_command("DEBUG", "SLEEP", round(rng.uniform(0.06, 0.4), 3))
                    pauses["DEBUG SLEEP"] += 1

        background = threading.Thread(target=pauser)
        background.start()
        deadline, i = time.monotonic() + 3.0, 0
        while time.monotonic() < deadline:
            calls.append(thread, f"short {i}", f"s{i}" if i % 2 == 0 else None)
            i += 1
        stop.set()
        background.join()
        admin.execute_command("CLIENT", "UNPAUSE")
        short_phase = Counter(outcome for _, _, outcome in calls.made)
        short_connections = _connections(admin) - connections - 1

        # 2. A pause longer than the whole retry budget: the caller must get OutcomeUnknown.
        admin.execute_command("CLIENT", "PAUSE", 30000, "WRITE")
        try:
            long_pause = calls.append(thread, "long pause", "long-pause")
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
        assert long_pause == "OutcomeUnknown", long_pause

        # 3. A DEBUG SLEEP long enough that many re-sends queue up in the server's sockets and
        # all run when it wakes: one with an otid, one without, from two clients at once. Their
        # connections are made first: a client whose first connect meets the sleep never sends
        # the append (ConnectionFailed, truly), which is not what this phase is about.
        racing = [impatient_store(connected=True), impatient_store(connected=True)]
        connections = _connections(admin)
        sleeper = threading.Thread(
            target=lambda: redis.Redis(port=server.port).execute_command("DEBUG", "SLEEP", 3)
        )
        sleeper.start()
        time.sleep(0.05)
        racers = [
            threading.Thread(
                target=calls.append,
                args=(racing[0].thread("paused"), "long sleep", "long-sleep"),
            ),
            threading.Thread(
                target=calls.append,
                args=(racing[1].thread("paused"), "long sleep, no otid", None),
            ),
        ]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join()
        sleeper.join()
        time.sleep(0.2)
        sleep_connections = _connections(admin) - connections - 1
        sleep_outcomes = [outcome for _, _, outcome in calls.made[-2:]]

        # Re-send every OutcomeUnknown call that carried an otid, as the error tells the caller to.
        patient = MessageStore.from_url(server.url, config).thread("paused")
        resent = 0
        for content, otid, outcome in list(calls.made):
            if outcome == "OutcomeUnknown" and otid is not None:
                patient.append(UserMessage(content=content, otid=otid))
                resent += 1

        stored = Counter(_text(m) for m in patient.iter())
        outcomes = Counter(outcome for _, _, outcome in calls.made)
        failures = []
        for content, otid, outcome in calls.made:
            copies = stored[content]
            if outcome.startswith("success") or otid is not None:
                if copies != 1:
                    failures.append(
                        f"{content!r} ({outcome}, otid {otid}) is stored {copies} times"
                    )
            elif outcome == "OutcomeUnknown":
                if copies > 1:
                    failures.append(
                        f"{content!r} (OutcomeUnknown, no otid) is stored {copies} times"
                    )
            else:
                failures.append(f"{content!r}: the caller saw {outcome}")
        check_layout(redis.Redis(port=server.port), patient.keys, config)
        print(
            f"\ntimeouts [{kind}]: {int(TIMEOUT * 1000)} ms socket timeout, redis-py's default retry."
            f" {sum(short_phase.values())} appends under {dict(pauses)} (60-400 ms each):"
            f" {dict(short_phase)}, {short_connections} reconnections to re-send."
            f" One append under a 30 s CLIENT PAUSE WRITE: {long_pause} (re-sent with its otid: stored once)."
            f" Two appends (otid / none) under a 3 s DEBUG SLEEP: {sleep_outcomes},"
            f" {sleep_connections} reconnections. In all {dict(outcomes)}; duplicates stored:"
            f" {sum(1 for c in stored.values() if c > 1)}"
        )
        assert not failures, "\n".join(failures)


def test_a_read_of_an_unreachable_server_raises_a_typed_error(kind):
    """Reads never report OutcomeUnknown, but what they raise is still one of kvstore's errors."""
    with dedicated_server(kind, "--enable-debug-command", "yes") as server:
        config = StoreConfig(namespace=fresh_namespace(), window_size=8, chunk_size=4)
        store = MessageStore(
            redis.Redis(port=server.port, socket_timeout=TIMEOUT, retry=Retry(NoBackoff(), 0)),
            config,
        )
        thread = store.thread("reads")
        stored = thread.append([UserMessage(content=f"m{i}") for i in range(30)])
        reads = {
            "stats": thread.stats,
            "newest page": lambda: thread.list(limit=5, order="desc"),
            "page after a cursor": lambda: thread.list(after=stored[3].id, limit=5),
            "turn page": lambda: thread.list(turn_id="none"),
            "get": lambda: thread.get(stored[0].id),
            "context": thread.context,
            "snapshot": thread.snapshot,
        }
        failures, seen = [], Counter()
        for situation in ("paused (DEBUG SLEEP)", "killed"):
            for name, read in reads.items():
                if situation == "killed":
                    server.kill()
                else:
                    sleeper = threading.Thread(
                        target=lambda: redis.Redis(port=server.port).execute_command(
                            "DEBUG", "SLEEP", 0.3
                        )
                    )
                    sleeper.start()
                    time.sleep(0.03)
                try:
                    read()
                    failures.append(f"{name} on a {situation} server succeeded")
                except errors.KVStoreError as exc:
                    seen[type(exc).__name__] += 1
                except Exception as exc:
                    failures.append(
                        f"{name} on a {situation} server raised {type(exc).__module__}.{type(exc).__name__}: {exc}"
                    )
                if situation == "killed":
                    server.start()
                else:
                    sleeper.join()
        print(
            f"\nunreachable reads [{kind}]: {2 * len(reads)} reads, typed errors {dict(seen)}, {len(failures)} untyped"
        )
        assert not failures, "\n".join(failures)


@pytest.mark.parametrize("otid", ["req-1", None], ids=["same otid", "exc.messages"])
def test_re_sending_after_outcome_unknown_stores_once(kind, otid):
    """README: after OutcomeUnknown, "re-sending `exc.messages` (or the same messages with the same
    otids) stores nothing twice". The server sleeps (DEBUG SLEEP) with the first call in its
    socket buffer, so that call runs after its caller gave up: the case OutcomeUnknown exists for."""
    with dedicated_server(kind, "--enable-debug-command", "yes") as server:
        config = StoreConfig(namespace=fresh_namespace())
        # No retry, so the first call gives up at its first timeout (the default retry would only
        # take longer to reach the same OutcomeUnknown).
        impatient = MessageStore(
            redis.Redis(port=server.port, socket_timeout=0.1, retry=Retry(NoBackoff(), 0)), config
        )
        thread = impatient.thread("resend")
        thread.append(UserMessage(content="warm up"))  # loads the script
        message = UserMessage(content="sent twice", otid=otid)
        sleeper = threading.Thread(
            target=lambda: redis.Redis(port=server.port).execute_command("DEBUG", "SLEEP", 0.5)
        )
        sleeper.start()
        time.sleep(0.05)
        with pytest.raises(errors.OutcomeUnknown) as unknown:
            thread.append(message)
        sleeper.join()
        patient = MessageStore.from_url(server.url, config).thread("resend")
        assert [_text(m) for m in patient.iter()] == ["warm up", "sent twice"], (
            "the first call did not run"
        )
        again = patient.append(message if otid else unknown.value.messages)
        stored = list(patient.iter())
        copies = [_text(m) for m in stored].count("sent twice")
        print(
            f"\nre-send after OutcomeUnknown [{kind}]: re-sent with {'its otid' if otid else 'exc.messages'},"
            f" stored {copies} times"
        )
        assert copies == 1
        assert again == [stored[1]]
