"""The store on a 3-primary cluster, sync and async, through RedisCluster clients: every
operation on threads whose keys land on each primary, every key of a thread in one slot, scripts
loaded where they run, and NOSCRIPT after a failover handled."""

from __future__ import annotations

import random

import pytest
from redis.crc import key_slot

from kvstore import (
    AssistantMessage,
    StoreConfig,
    SummaryMessage,
    ToolCallMessage,
    ToolReturnMessage,
    UserMessage,
    errors,
)
from kvstore._engine.scripts import SCRIPTS

from ..support import model
from ..support.layout_check import check_layout
from .harness import Cluster, Node, thread_ids_on_each_primary

SMALL = dict(window_size=8, chunk_size=4, chunk_max_bytes=2048)


def text(n: int, tag: str) -> str:
    return (tag + " " + "x" * n)[:n] if n > len(tag) else tag


def assert_in_one_slot(cluster: Cluster, thread, owner: Node) -> list[str]:
    """Every key of the thread hashes to one slot, by the server's own CLUSTER KEYSLOT, and lives
    on the primary that owns that slot (and on no other). Returns the keys."""
    slot = key_slot(thread.keys.meta.encode())
    assert cluster.owner(slot) is owner
    prefix = thread.keys.meta[: -len("meta")]
    found = list(cluster.keys_of(prefix + "*"))
    assert found, "the thread has no keys"
    for node, key in found:
        assert node is owner, f"{key} is on {node.name}, not on {owner.name} which owns slot {slot}"
        assert int(owner.admin.execute_command("CLUSTER", "KEYSLOT", key)) == slot, key
    assert int(owner.admin.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) >= len(found)
    return [key for _, key in found]


def test_append_rollover_pages_and_reads_on_every_primary(
    cluster, cluster_thread, raw_cluster, namespace
):
    config = StoreConfig(namespace=namespace, **SMALL)
    for owner, thread_id in thread_ids_on_each_primary(cluster, "paging"):
        thread = cluster_thread(thread_id, **SMALL)
        rng = random.Random(thread_id)
        stored = thread.append(UserMessage(content="first, alone"))
        for step in range(30):
            size = rng.choice([20, 500, 900, 3000])  # 3000 bytes are oversized here
            count = rng.randint(1, 4)
            stored += thread.append(
                [
                    UserMessage(content=text(size, f"{step}.{i}"), otid=f"{step}.{i}")
                    for i in range(count)
                ]
            )
        assert [m.seq_id for m in stored] == list(range(1, len(stored) + 1))
        layout = check_layout(raw_cluster, thread.keys, config)
        # Closed chunks, oversized ones and the open chunk: every kind of key a thread holds.
        assert layout.chunks and layout.large and layout.open and not layout.window
        keys = assert_in_one_slot(cluster, thread, owner)
        assert any(":chunk:" in k for k in keys)

        by_seq = {m.seq_id: m for m in stored}
        sequences = sorted(by_seq)
        anchors = {
            0,
            1,
            len(sequences) // 2,
            sequences[-1],
            sequences[-1] + 3,
            *rng.sample(sequences, 4),
        }
        for limit in (1, 5, 17):
            for order in ("asc", "desc"):
                cases = [(None, None)] + [(a, None) for a in anchors] + [(None, b) for b in anchors]
                for after, before in cases:
                    page = thread.list(after=after, before=before, limit=limit, order=order)
                    want, more = model.page(sequences, after, before, limit, order)
                    assert [m.seq_id for m in page.messages] == want, (
                        thread_id,
                        limit,
                        order,
                        after,
                        before,
                    )
                    assert page.has_more == more
                    assert page.messages == [by_seq[s] for s in want]
        # Walk both ways with id cursors, page by page.
        for order in ("asc", "desc"):
            walked, after = [], None
            while True:
                page = thread.list(after=after, limit=7, order=order)
                walked += page.messages
                if not page.has_more:
                    break
                after = page.messages[-1].id
            assert walked == sorted(stored, key=lambda m: m.seq_id, reverse=order == "desc")
        assert list(thread.iter()) == stored
        for message in (stored[0], stored[len(stored) // 2], stored[-1], by_seq[min(layout.large)]):
            assert thread.get(message.id) == message
        with pytest.raises(errors.MessageNotFound):
            thread.get("message-never-stored")
        # A replayed batch (every otid stored) returns the stored messages and writes nothing.
        replay = thread.append([UserMessage(content="again", otid=stored[-1].otid)])
        assert replay == [stored[-1]]
        stats = thread.stats()
        assert stats.stored_messages == len(stored) and stats.next_sequence == len(stored) + 1
        assert stats.chunks == len(layout.chunks) + len(layout.large)
        assert stats.window_messages == len(layout.window) + len(layout.open)
        snapshot = thread.snapshot()
        assert snapshot.messages == stored[-200:] and snapshot.stats == stats
        assert thread.context() == stored


def test_turns_replace_and_remove_turn_on_every_primary(
    cluster, cluster_thread, raw_cluster, namespace
):
    config = StoreConfig(namespace=namespace, **SMALL)
    for owner, thread_id in thread_ids_on_each_primary(cluster, "turns"):
        thread = cluster_thread(thread_id, **SMALL)
        stored = thread.append(UserMessage(content="question"), turn_id="turn-1")
        assert thread.start_turn("turn-1") == 2
        stored += thread.append(
            [AssistantMessage(content=f"r{i} " + "y" * 300) for i in range(5)], turn_id="turn-1"
        )
        stored += thread.append(UserMessage(content="unrelated"))
        stored += thread.append(AssistantMessage(content="last"), turn_id="turn-1")
        result = thread.finish_turn("turn-1")
        assert (result.reply_count, result.first_sequence, result.last_sequence) == (6, 2, 8)
        assert [m.seq_id for m in thread.list(turn_id="turn-1").messages] == [1, 2, 3, 4, 5, 6, 8]
        assert [
            m.seq_id for m in thread.list(turn_id="turn-1", order="desc", limit=2).messages
        ] == [8, 6]
        assert thread.snapshot().turn.outcome == "completed"

        # A second turn pushes the first into chunks; replace one message in a chunk and one in
        # the window, then retract the first turn wherever its messages are.
        stored += thread.append(
            [AssistantMessage(content=f"t2 {i}") for i in range(12)], turn_id="turn-2"
        )
        layout = check_layout(raw_cluster, thread.keys, config)
        in_chunk = next(m for m in stored if any(m.seq_id in f for f in layout.chunks.values()))
        in_window = stored[-1]
        for old in (in_chunk, in_window):
            new = thread.replace(old.id, AssistantMessage(content="replaced " + old.id))
            assert (new.id, new.seq_id) == (old.id, old.seq_id)
            assert thread.get(old.id).content == new.content
        check_layout(raw_cluster, thread.keys, config)
        assert thread.remove_turn("turn-1") == 7
        left = [m.seq_id for m in thread.iter()]
        assert left == [7, *range(9, 21)]
        assert thread.list(turn_id="turn-1").messages == []
        check_layout(raw_cluster, thread.keys, config)
        assert_in_one_slot(cluster, thread, owner)


def test_compact_retention_context_and_delete_on_every_primary(
    cluster, cluster_thread, raw_cluster, namespace
):
    config = StoreConfig(namespace=namespace, retained_message_limit=20, **SMALL)
    for owner, thread_id in thread_ids_on_each_primary(cluster, "compact"):
        thread = cluster_thread(thread_id, retained_message_limit=20, **SMALL)
        stored = []
        for i in range(25):
            stored += thread.append(
                [UserMessage(content=f"m{i}.{j} " + "z" * 150) for j in range(4)]
            )
        summary = thread.compact("the first sixty", last_sequence=60)
        assert isinstance(summary, SummaryMessage) and summary.seq_id == 101
        layout = check_layout(raw_cluster, thread.keys, config)
        kept = layout.all_sequences()
        deleted = sorted(set(range(1, 102)) - set(kept))
        assert deleted and max(deleted) <= 60 and deleted == list(range(1, deleted[-1] + 1))
        stats = thread.stats()
        assert (
            stats.deleted_before_sequence == deleted[-1] + 1 and stats.summary_last_sequence == 60
        )
        assert thread.list(limit=3).deleted_before_sequence == min(kept)
        context = thread.context()
        assert context[0] == summary and [m.seq_id for m in context[1:]] == list(range(61, 101))
        assert thread.snapshot().summary == summary
        with pytest.raises(errors.MessageNotFound):
            thread.get(stored[0].id)
        keys = assert_in_one_slot(cluster, thread, owner)
        assert len(keys) > 9

        thread.delete()
        assert list(cluster.keys_of(thread.keys.meta[: -len("meta")] + "*")) == []
        assert thread.list().messages == []


def test_scripts_are_loaded_on_every_primary_that_runs_them(cluster, cluster_thread, mode):
    """After SCRIPT FLUSH everywhere, the first call on each primary loads its script there."""
    for node in cluster.nodes:
        node.admin.execute_command("SCRIPT", "FLUSH")
    shas = [SCRIPTS["append"].sha, SCRIPTS["page_plan"].sha, SCRIPTS["locate"].sha]
    for owner, thread_id in thread_ids_on_each_primary(cluster, "scripts"):
        thread = cluster_thread(thread_id, **SMALL)
        stored = thread.append([UserMessage(content=f"m{i}") for i in range(20)])
        # An id cursor is planned by the script (a sequence cursor by native reads).
        assert thread.list(after=stored[1].id, limit=3).messages == stored[2:5]
        assert thread.get(stored[0].id) == stored[0]
        assert owner.admin.execute_command("SCRIPT", "EXISTS", *shas) == [1, 1, 1], owner.name


def test_noscript_after_a_failover_is_handled(cluster, cluster_thread, mode):
    """CLUSTER FAILOVER promotes a replica whose script cache is empty (the cache is not
    replicated); the same store keeps writing and reading through it."""
    (owner, thread_id), *_ = thread_ids_on_each_primary(cluster, "noscript")
    thread = cluster_thread(thread_id, **SMALL)
    stored = thread.append([UserMessage(content=f"before {i}", otid=f"b{i}") for i in range(20)])
    (replica,) = cluster.replicas_of(owner)
    # A replica that never was a primary has an empty cache; this one may have been a primary
    # before an earlier test's failover, and a restarted node's cache is empty: flush it.
    replica.admin.execute_command("SCRIPT", "FLUSH")
    noscript_before = replica.info("errorstats").get("errorstat_NOSCRIPT", {}).get("count", 0)

    cluster.failover(replica)
    assert cluster.owner(key_slot(thread.keys.meta.encode())) is replica

    stored += thread.append([UserMessage(content=f"after {i}", otid=f"a{i}") for i in range(20)])
    assert [m.seq_id for m in stored] == list(range(1, 41))
    assert list(thread.iter()) == stored
    assert thread.list(after=5, limit=10, order="asc").messages == stored[5:15]
    assert thread.get(stored[3].id) == stored[3]
    assert (
        replica.info("errorstats").get("errorstat_NOSCRIPT", {}).get("count", 0) > noscript_before
    )
    assert replica.admin.execute_command("SCRIPT", "EXISTS", SCRIPTS["append"].sha) == [1]
    assert_in_one_slot(cluster, thread, replica)


def _commands_on(cluster: Cluster) -> dict[str, int]:
    """Calls per command summed over the primaries (INFO commandstats)."""
    total: dict[str, int] = {}
    for node in cluster.primaries():
        for name, stats in node.info("commandstats").items():
            total[name.removeprefix("cmdstat_")] = total.get(
                name.removeprefix("cmdstat_"), 0
            ) + int(stats["calls"])
    return total


def _sent_during(cluster: Cluster, calls) -> dict[str, int]:
    """The commands the primaries ran during `calls()`, but the INFO that reads them and the
    client's view of the cluster (CLUSTER NODES / SLOTS / SHARDS)."""
    before = _commands_on(cluster)
    calls()
    after = _commands_on(cluster)
    return {
        name: count - before.get(name, 0)
        for name, count in after.items()
        if count - before.get(name, 0) and name != "info" and not name.startswith("cluster|")
    }


def test_a_cluster_client_calls_scripts_by_sha_in_one_round_trip(cluster, cluster_thread, mode):
    """redis-py's RedisCluster finds an FCALL's slot with COMMAND GETKEYS round trips (two per
    call, measured below) and an EVALSHA's from its arguments: a cluster store keeps to EVALSHA,
    whatever StoreConfig.scripting says (docs/SCALING.md)."""
    (_owner, thread_id), *_ = thread_ids_on_each_primary(cluster, "by-sha")
    thread = cluster_thread(thread_id, **SMALL)
    (first,) = thread.append(UserMessage(content="warm up"))  # loads the scripts on this primary

    def calls() -> None:
        for i in range(10):
            thread.append(UserMessage(content=f"m{i}"))
        thread.list(after=first.id, limit=3)  # page_plan (an id cursor)

    sent = _sent_during(cluster, calls)
    print(f"\ncluster store [{cluster.kind}, {mode}]: 11 script calls sent {sent}")
    assert sent.get("evalsha") == 11
    assert not {"fcall", "fcall_ro", "function|load", "command|getkeys"} & set(sent)


def _reads_key_specs() -> bool:
    """Whether the installed redis-py resolves a movablekeys command's keys from key specs."""
    from redis._parsers.commands import CommandsParser

    return hasattr(CommandsParser, "_get_keys_from_specs")


def test_redis_py_routes_fcall_on_a_cluster_with_command_getkeys(cluster):
    """Why the cluster store does not use FCALL: redis-py's RedisCluster before 8.2 asks a node
    for an FCALL's keys (COMMAND GETKEYS, twice per call), while EVALSHA is routed by its
    arguments alone on every redis-py the package supports. From 8.2 it reads the key specs: once
    the supported floor is there, FCALL could serve cluster clients too."""
    client = cluster.client()
    try:
        source = "#!lua name=kvstore_probe\nredis.register_function('kvstore_probe', function(keys) return 1 end)"
        for node in cluster.primaries():
            node.admin.function_load(source, replace=True)
        sha = client.script_load("return 1")
        fcall = _sent_during(
            cluster, lambda: [client.fcall("kvstore_probe", 1, f"k{i}") for i in range(20)]
        )
        evalsha = _sent_during(
            cluster, lambda: [client.evalsha(sha, 1, f"k{i}") for i in range(20)]
        )
    finally:
        for node in cluster.primaries():
            node.admin.function_delete("kvstore_probe")
    print(
        f"\nredis-py RedisCluster [{cluster.kind}]: 20 FCALLs sent {fcall}; 20 EVALSHAs sent {evalsha}"
    )
    assert fcall.get("fcall") == 20
    if _reads_key_specs():
        # redis-py 8.2 finds a movablekeys command's keys in the server's key specs (COMMAND
        # DOCS/INFO, read once), so FCALL is routed without a round trip.
        assert "command|getkeys" not in fcall
    else:
        assert fcall.get("command|getkeys", 0) >= 20
    # (Replicas' REPLCONF ACKs land in the same counters now and then: only the calls' own count.)
    assert evalsha.get("evalsha") == 20 and not {"fcall", "command|getkeys"} & set(evalsha)


def test_a_fork_across_primaries_and_a_budgeted_context(
    cluster, cluster_thread, raw_cluster, namespace
):
    # A thread forked into one on each other primary: every step writes one slot, none answers
    # CROSSSLOT (the fixture checks), and the fork reads back as the source's history.
    placed = thread_ids_on_each_primary(cluster, "forking")
    (source_owner, source_id), targets = placed[0], placed[1:]
    source = cluster_thread(source_id, **SMALL)
    source.append([UserMessage(content=text(300, f"m{i}")) for i in range(40)])
    source.append(
        [
            ToolCallMessage(tool_call={"name": "w", "arguments": "{}", "tool_call_id": "c1"}),
            ToolReturnMessage(status="success", tool_call_id="c1", tool_return="ok"),
        ]
    )
    summary = source.compact("the first thirty", 30)
    later = source.append([UserMessage(content=f"later {i}") for i in range(5)])
    config = StoreConfig(namespace=namespace, **SMALL)
    for owner, target_id in targets:
        assert owner is not source_owner
        fork = source.fork(target_id, at=later[2].id)
        at = later[2].seq_id
        assert fork.stats().forked_from == source_id and fork.stats().fork_sequence == at
        assert list(fork.iter()) == [m for m in source.iter() if m.seq_id <= at]
        check_layout(raw_cluster, fork.keys, config)
        assert_in_one_slot(cluster, fork, owner)
        assert fork.context() == [m for m in source.context() if m.seq_id <= at]
        assert fork.context()[0] == summary
    budget = source.context(max_tokens=3, count_tokens=lambda m: 1)
    assert budget == [summary, *later[-2:]]  # the summary counts one token
    # A budget cutting between the call and its return leaves the return out.
    source.append(ToolReturnMessage(status="success", tool_call_id="c1", tool_return="late"))
    source.append(ToolCallMessage(tool_call={"name": "w", "arguments": "{}", "tool_call_id": "c2"}))
    source.append(ToolReturnMessage(status="success", tool_call_id="c2", tool_return="ok"))
    kinds = [m.message_type for m in source.context(max_tokens=3, count_tokens=lambda m: 1)]
    assert kinds == ["summary_message", "tool_call_message", "tool_return_message"]
    assert source.context(max_tokens=2, count_tokens=lambda m: 1) == [summary]


def test_strict_history_checks_on_each_primary(cluster, cluster_thread, raw_cluster):
    # The pairs key lives in the thread's slot: a checked append, a refusal, a turn removal and a
    # fork onto another primary each touch one slot (the fixture checks for CROSSSLOT).
    placed = thread_ids_on_each_primary(cluster, "checked")
    (_, source_id), (_, fork_id) = placed[0], placed[1]
    source = cluster_thread(source_id, history_checks="strict", **SMALL)

    def call(call_id):
        return ToolCallMessage(tool_call={"name": "w", "arguments": "{}", "tool_call_id": call_id})

    def answer(call_id):
        return ToolReturnMessage(status="success", tool_call_id=call_id, tool_return="ok")

    source.append([UserMessage(content=text(300, f"m{i}")) for i in range(20)])
    source.start_turn("t1")
    source.append([call("c1"), answer("c1"), call("c2")], turn_id="t1")
    source.finish_turn("t1")
    with pytest.raises(errors.HistoryConflict):
        source.append(answer("c1"))
    (point,) = source.append(UserMessage(content="the fork point"))
    fork = source.fork(fork_id, at=point.id)
    assert fork.stats().history_checked
    with pytest.raises(errors.HistoryConflict):
        fork.append(answer("nothing"))
    fork.append(answer("c2"))
    assert source.remove_turn("t1") == 3
    assert raw_cluster.zrange(source.keys.pairs, 0, -1) == []
    with pytest.raises(errors.HistoryConflict):
        source.append(answer("c2"))
