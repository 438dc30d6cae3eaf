"""Appends per second with 4 worker processes: one standalone server vs a 3-primary cluster.

    python -m tests.cluster.throughput [--seconds 5] [--workers 4] [--rounds 3]

Each worker appends one ~1 KB message per call to 8 threads of its own, round robin (32 threads
in all, spread over the cluster's slots by their ids), with the default StoreConfig (window 64,
chunk 32: a rollover every 32 appends per thread). All workers start together at a barrier, append
for the same fixed time, and report how many appends were acknowledged; the figure is the total
divided by that time. The same worker processes measure the standalone server first, then the
cluster, so both runs share the machine equally. Neither has replicas.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
import uuid
from dataclasses import dataclass

THREADS_PER_WORKER = 8
CONTENT = "x" * 1000


@dataclass
class Target:
    name: str  # "standalone" or "cluster"
    url: str | None  # standalone
    ports: list[int] | None  # cluster
    round: int = 0

    @property
    def namespace_suffix(self) -> str:
        return f"{self.name}-{self.round}"


def _worker(
    worker: int, targets: list[Target], namespace: str, seconds: float, barrier, results
) -> None:
    from redis.cluster import ClusterNode, RedisCluster

    from kvstore import MessageStore, StoreConfig, UserMessage

    for target in targets:
        config = StoreConfig(namespace=f"{namespace}-{target.namespace_suffix}")
        if target.url:
            store = MessageStore.from_url(target.url, config)
        else:
            nodes = [ClusterNode("127.0.0.1", p) for p in target.ports]
            store = MessageStore(RedisCluster(startup_nodes=nodes, decode_responses=False), config)
        threads = [store.thread(f"w{worker}-t{i}") for i in range(THREADS_PER_WORKER)]
        for thread in threads:  # warm up: connections, slot map, scripts loaded
            thread.append(UserMessage(content=CONTENT))
        barrier.wait()
        count, deadline, cpu = 0, time.monotonic() + seconds, time.process_time()
        while time.monotonic() < deadline:
            threads[count % THREADS_PER_WORKER].append(UserMessage(content=CONTENT))
            count += 1
        results.put((target.namespace_suffix, worker, count, time.process_time() - cpu))
        barrier.wait()
        store.close()


def _server_cpu(ports: list[int]) -> float:
    """CPU seconds (user + system) the servers on `ports` have used so far."""
    import redis

    total = 0.0
    for port in ports:
        with redis.Redis(port=port) as client:
            info = client.info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def measure(
    kind: str, binary: str, seconds: float = 5.0, workers: int = 4, rounds: int = 1
) -> dict:
    """Appends/s on one standalone `kind` server and on a 3-primary cluster of it: the median of
    `rounds` runs of each, alternating (standalone, cluster, standalone, ...) so a load that comes
    and goes on the machine weighs on both alike.

    Also checks that every acknowledged append is stored: the threads' message counts add up."""
    from kvstore import MessageStore, StoreConfig

    from ..support.servers import ServerProcess
    from .harness import Cluster

    standalone = ServerProcess(f"{kind}-throughput", binary).start()
    cluster = Cluster(kind, binary).start(primaries=3, replicas=0)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(workers + 1)
    results = context.Queue()
    namespace = f"tp{uuid.uuid4().hex[:8]}"
    targets = [
        target
        for r in range(rounds)
        for target in (
            Target("standalone", standalone.url, None, r),
            Target("cluster", None, [n.port for n in cluster.nodes], r),
        )
    ]
    processes = [
        context.Process(
            target=_worker, args=(w, targets, namespace, seconds, barrier, results), daemon=True
        )
        for w in range(workers)
    ]
    try:
        for process in processes:
            process.start()
        runs: dict[str, list[tuple[float, float, float, float]]] = {"standalone": [], "cluster": []}
        for target in targets:
            servers = [standalone.port] if target.url else [n.port for n in cluster.nodes]
            barrier.wait(timeout=120)  # all warmed up: go
            cpu_before = _server_cpu(servers)
            barrier.wait(timeout=seconds + 60)  # all done
            cpu = _server_cpu(servers) - cpu_before
            counts = [results.get(timeout=10) for _ in range(workers)]
            total = sum(count for _, _, count, _ in counts)
            client_cpu = sum(used for _, _, _, used in counts)
            # Appends/s; the CPU time per append of the servers and of the clients (kvstore +
            # redis-py in the workers); the cores the servers kept busy.
            runs[target.name].append(
                (total / seconds, cpu / total * 1e6, client_cpu / total * 1e6, cpu / seconds)
            )
            config = StoreConfig(namespace=f"{namespace}-{target.namespace_suffix}")
            store = (
                MessageStore.from_url(target.url, config)
                if target.url
                else MessageStore(cluster.client(), config)
            )
            stored = sum(
                store.thread(f"w{w}-t{i}").stats().stored_messages
                for w in range(workers)
                for i in range(THREADS_PER_WORKER)
            )
            assert stored == total + workers * THREADS_PER_WORKER, (target.name, stored, total)
            if target.url:
                store.close()
        figures: dict = {}
        for name, measured in runs.items():
            median = sorted(measured)[len(measured) // 2]
            figures[name] = median[0]
            figures[f"{name}_server_us_per_append"] = median[1]
            figures[f"{name}_client_us_per_append"] = median[2]
            figures[f"{name}_server_cores"] = median[3]
            figures[f"{name}_runs"] = [round(m[0]) for m in measured]
        per_primary: dict[str, int] = {}
        for w in range(workers):
            for i in range(THREADS_PER_WORKER):
                node = cluster.owner(cluster.keyslot(f"{{w{w}-t{i}}}"))
                per_primary[node.name] = per_primary.get(node.name, 0) + 1
        figures["threads_per_primary"] = sorted(per_primary.values())
        for process in processes:
            process.join(30)
        return figures
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
        cluster.teardown()
        standalone.cleanup()


def main() -> None:
    from .harness import cluster_binaries

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for kind, binary in cluster_binaries().items():
        figures = measure(kind, binary, args.seconds, args.workers, args.rounds)
        ratio = figures["cluster"] / figures["standalone"]
        print(
            f"{kind}: {args.workers} workers, median of {args.rounds} runs of {args.seconds:g} s: standalone"
            f" {figures['standalone']:,.0f} appends/s {figures['standalone_runs']}, 3-primary cluster"
            f" {figures['cluster']:,.0f} appends/s {figures['cluster_runs']} (x{ratio:.2f});"
            f" threads per primary {figures['threads_per_primary']}"
        )
        for name in ("standalone", "cluster"):
            print(
                f"  {name}: CPU per append: servers {figures[f'{name}_server_us_per_append']:.0f} µs, clients"
                f" {figures[f'{name}_client_us_per_append']:.0f} µs; servers busy"
                f" {figures[f'{name}_server_cores']:.2f} cores"
            )


if __name__ == "__main__":
    main()
