"""The append's floor: what its server commands cost with no logic around them.

    python -m benchmarks.floor [--quick] [--url URL] [--json PATH]

An append's server time is its commands plus the Lua around them (argument parsing, checks,
planning, building the next command's arguments). This benchmark splits the two: on each server,
interleaved in rounds, over many calls of each (server time from INFO commandstats, as
benchmarks/server_cost.py):

- kvstore's append of one 1 KB message (events on, the defaults), on threads of its own;
- ``commands today``: a script that runs exactly the commands a typical layout-3 append runs
  (HMGET of meta's 19 fields, HMGET of the id map, APPEND of the manifest line and of the
  record, HSET of the id, HSET of meta's changed fields, XADD of the event, PTTL of the stream),
  with the same bytes and no logic but the sequence;
- ``packed``: the commands of a layout whose meta keeps its hot numbers in one packed field and
  whose open chunk frames its records (HGET, HSETNX of the id, one APPEND, HSET, XADD), with
  events and without;
- the bare 4-write script (benchmarks/_common.py: BARE_SCRIPT) with the same record bytes.

The gap between kvstore's append and ``commands today`` is what a leaner script body can win;
the gap between ``commands today`` and ``packed`` is what the stored format costs. Nothing here
is kvstore's code path but the first row: the two middle rows are measures of the commands
alone, for the layout work (docs/BENCHMARKS.md, "The append's floor").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis

from kvstore import UserMessage

from ._common import (
    BARE_SCRIPT,
    Fixture,
    MessagePool,
    bare_keys,
    collect_per_server,
    log,
    ratio,
    render_ratios,
    standalone_main,
)
from ._engine import encode_record

# The commands of a typical layout-3 append (one message, no turn, events on), in its order,
# with its argument shapes. KEYS: meta, ids, open manifest, open records, events.
COMMANDS_TODAY = """\
local m = redis.call('HMGET', KEYS[1], 'layout', 'last_seq', 'stored', 'bytes', 'media',
  'window_bytes', 'deleting', 'checked', 'tokens', 'restoring', 'open_first', 'open_last',
  'open_count', 'open_bytes', 'open_media', 'open_tokens', 'events', 'born', 'open_manifest_bytes')
local seq, events = tonumber(m[2] or 0) + 1, tonumber(m[17] or 0) + 1
if redis.call('HMGET', KEYS[2], ARGV[1])[1] then return 0 end
redis.call('APPEND', KEYS[3], seq .. '\\t' .. ARGV[1] .. '\\t\\t0\\t' .. #ARGV[2] .. '\\t\\t34\\n')
redis.call('APPEND', KEYS[4], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], seq)
redis.call('HSET', KEYS[1], 'last_seq', seq, 'stored', seq, 'bytes', seq * #ARGV[2], 'tokens',
  seq * 34, 'open_last', seq, 'open_count', seq % 32, 'open_bytes', #ARGV[2], 'open_tokens', 34,
  'open_manifest_bytes', 60, 'events', events)
redis.call('XADD', KEYS[5], 'MAXLEN', '~', 1000, events .. '-' .. seq, 'k', 'added', 'a', seq,
  'b', seq, 't', '', 'g', '1796357461416310')
if redis.call('PTTL', KEYS[5]) < 86400000 then redis.call('PEXPIRE', KEYS[5], 129600000) end
if seq % 32 == 0 then redis.call('DEL', KEYS[3], KEYS[4]) end
return seq
"""

# The same append on a packed meta and a framed open chunk; ARGV[3] '1' for events on.
PACKED = """\
local h, seq, stored, bytes, tokens, count, events = redis.call('HGET', KEYS[1], 'h'), 0, 0, 0, 0, 0, 0
if h then seq, stored, bytes, tokens, count, events = struct.unpack('>I4I4I8I8I4I8', h) end
seq = seq + 1
if redis.call('HSETNX', KEYS[2], ARGV[1], seq) == 0 then return 0 end
redis.call('APPEND', KEYS[4], struct.pack('>I4', #ARGV[2]) .. ARGV[2])
if ARGV[3] == '1' then events = events + 1 end
redis.call('HSET', KEYS[1], 'h', struct.pack('>I4I4I8I8I4I8', seq, seq, bytes + #ARGV[2],
  tokens + 34, (count + 1) % 32, events))
if ARGV[3] == '1' then
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', 1000, events .. '-' .. seq, 'k', 'added', 'a', seq,
    'b', seq, 't', '', 'g', '1796357461416310')
end
if seq % 32 == 0 then redis.call('DEL', KEYS[4]) end
return seq
"""

NAMES = ("append", "commands_today", "packed_events", "packed_no_events", "bare_script")
LABELS = {
    "append": "kvstore append (events on)",
    "commands_today": "its commands alone, no logic",
    "packed_events": "packed meta, framed chunk, event",
    "packed_no_events": "packed meta, framed chunk, no event",
    "bare_script": "bare 4-write script",
}


@dataclass(frozen=True)
class Params:
    threads: int  # the threads (key sets) each operation goes round
    calls: int  # per operation and round
    rounds: int  # interleaved rounds; the median round counts


DEFAULT = Params(threads=100, calls=2000, rounds=5)
QUICK = Params(threads=50, calls=500, rounds=3)


def script_usec(client: redis.Redis) -> tuple[int, int]:
    """(calls, usec) of the script commands so far."""
    stats = client.info("commandstats")
    calls = usec = 0
    for name in ("cmdstat_fcall", "cmdstat_evalsha"):
        calls += int(stats.get(name, {}).get("calls", 0))
        usec += int(stats.get(name, {}).get("usec", 0))
    return calls, usec


class Floor(Fixture):
    params: Params

    def operations(self) -> dict[str, Callable[[int], Any]]:
        """Each operation: call i of it."""
        p, client, ns = self.params, self.client, self.ns
        stamped = UserMessage(content=self.texts[0]).model_copy(
            update={"id": f"message-{uuid.uuid4()}", "date": datetime.now(UTC)}
        )
        blob = encode_record(stamped)
        today, packed, bare = (client.script_load(s) for s in (COMMANDS_TODAY, PACKED, BARE_SCRIPT))
        threads = [self.store.thread(f"floor-{t}") for t in range(p.threads)]
        pool = MessagePool(self.texts, p.calls * p.rounds + 1)
        ids = iter(f"message-{uuid.uuid4()}" for _ in range(5 * p.calls * p.rounds))

        def keys(kind: str, i: int) -> list[str]:
            tag = f"{ns}:{kind}:{{{i % p.threads}}}"
            return [f"{tag}:{part}" for part in ("meta", "ids", "open:m", "open:d", "events")]

        return {
            "append": lambda i: threads[i % p.threads].append(pool.take()),
            "commands_today": lambda i: client.evalsha(today, 5, *keys("t", i), next(ids), blob),
            "packed_events": lambda i: client.evalsha(packed, 5, *keys("p", i), next(ids), blob, 1),
            "packed_no_events": lambda i: client.evalsha(
                packed, 5, *keys("q", i), next(ids), blob, 0
            ),
            "bare_script": lambda i: client.evalsha(
                bare, 4, *bare_keys(f"{ns}:b:{{{i % p.threads}}}"), next(ids), blob
            ),
        }

    def measure(self) -> dict[str, Any]:
        p = self.params
        operations = self.operations()
        for fn in operations.values():  # warm: scripts loaded, threads made
            for i in range(p.threads):
                fn(i)
        per_round: dict[str, list[float]] = {name: [] for name in NAMES}
        for r in range(p.rounds):
            log(f"  round {r + 1} of {p.rounds}: {p.calls:,} calls of each")
            for name in NAMES:
                calls, usec = script_usec(self.client)
                for i in range(p.calls):
                    operations[name](i)
                after_calls, after_usec = script_usec(self.client)
                per_round[name].append((after_usec - usec) / (after_calls - calls))
        return {
            name: {"usec_per_call": statistics.median(values), "rounds": values}
            for name, values in per_round.items()
        }


def run_server(url: str, params: Params, own: bool) -> dict[str, Any]:
    with Floor(url, params, own) as bench:
        version = bench.version
        log(f"{version} at {url}: {params.threads} threads, {params.rounds} rounds")
        results = bench.measure()
    bare = results["bare_script"]["usec_per_call"]

    def over_bare(name: str) -> float:
        return float(results[name]["usec_per_call"] / bare)

    return {
        "server": version,
        "results": results,
        "ratios": [
            ratio(
                "floor_append_vs_bare", "kvstore append / bare script", over_bare("append"), None
            ),
            ratio(
                "floor_commands_today_vs_bare",
                "its commands alone / bare script",
                over_bare("commands_today"),
                None,
            ),
            ratio(
                "floor_packed_vs_bare",
                "packed meta + framed chunk, event / bare script",
                over_bare("packed_events"),
                None,
            ),
            ratio(
                "floor_packed_no_events_vs_bare",
                "packed meta + framed chunk, no event / bare script",
                over_bare("packed_no_events"),
                None,
            ),
        ],
    }


def render(result: dict[str, Any]) -> str:
    r = result["results"]
    lines = [f"== {result['server']} ==", "server µs per call (median round)"]
    for name in NAMES:
        lines.append(f"  {LABELS[name]:<40} {r[name]['usec_per_call']:8.1f}")
    lines.append("")
    lines += render_ratios(result["ratios"], "ratios")
    return "\n".join(lines)


def collect(args: argparse.Namespace) -> dict[str, Any]:
    params = QUICK if args.quick else DEFAULT
    return collect_per_server("The append's floor", args, params, run_server, render)


def main(argv: list[str] | None = None) -> int:
    return standalone_main("floor", __doc__, collect, argv)


if __name__ == "__main__":
    sys.exit(main())
