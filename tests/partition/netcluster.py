"""The cluster of tests/cluster/harness.py with each node on a test host of its own (NetLab), so
that links between nodes, and between a node and the clients, can be cut and healed.

Node i runs in host i's namespace, listens on that host's address only and announces it; the
clients (this process and its workers) reach every node over their own link to it. Everything
else (formation, health, failover, lookups) is the loopback harness's.
"""

from __future__ import annotations

import time

import redis
from redis.cluster import ClusterNode as ClientNode

from kvstore.errors import KVStoreError

from ..cluster.harness import Cluster, ClusterFormationError, Node
from ..support import lifetime
from .netlab import NetLab

PORT, BUS_PORT = 7000, 17000  # every node has an address of its own: the same ports everywhere


class NetNode(Node):
    """A cluster node on one of the lab's hosts."""

    def __init__(self, kind: str, binary: str, lab: NetLab, host: int, data_dir) -> None:
        super().__init__(kind, binary, PORT, BUS_PORT, data_dir)
        self.host = host
        self.ip = lab.address(host)
        self.prefix = lab.exec_prefix(host)
        self.name = f"{kind}-{self.ip}"

    @property
    def admin(self) -> redis.Redis:
        if self._admin is None:
            self._admin = redis.Redis(
                host=self.ip,
                port=self.port,
                decode_responses=True,
                socket_timeout=2,
                socket_connect_timeout=1,
            )
        return self._admin

    def start(self, timeout: float = 10) -> NetNode:
        assert self.data_dir is not None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            *self.prefix,
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            self.ip,
            "--dir",
            str(self.data_dir),
            "--logfile",
            str(self.log),
            *self.extra_args,
            "--cluster-announce-ip",
            self.ip,
        ]
        with open(self.log, "ab") as output:
            self.process = lifetime.Popen(
                command, stdin=lifetime.subprocess.DEVNULL, stdout=output, stderr=output
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise ClusterFormationError(f"{self.name} exited at start:\n{self.log_tail()}")
            try:
                self.node_id = self.admin.execute_command("CLUSTER", "MYID")
                return self
            except (redis.RedisError, OSError):
                self.close_admin()
                if time.monotonic() > deadline:
                    self.kill()
                    raise ClusterFormationError(
                        f"{self.name} did not answer in {timeout}s"
                    ) from None
                time.sleep(0.05)

    def _forget(self) -> None:  # lifetime.Popen forgets its process once reaped
        pass


class NetCluster(Cluster):
    """A cluster whose nodes are the lab's hosts 0..n-1 (primaries first)."""

    def __init__(self, kind: str, binary: str, lab: NetLab) -> None:
        super().__init__(kind, binary)
        self.lab = lab

    def _start(self, primaries: int, replicas: int, timeout: float) -> None:
        count = primaries * (1 + replicas)
        if count > self.lab.hosts:
            raise KVStoreError(f"{count} nodes need {count} hosts; the lab has {self.lab.hosts}")
        self.nodes.extend(
            NetNode(self.kind, self.binary, self.lab, i, self.root / f"node-{i}")
            for i in range(count)
        )
        for node in self.nodes:
            node.start()
        self._form(primaries, replicas, timeout)

    def _meet(self, seed: Node, node: Node) -> None:
        assert isinstance(node, NetNode)
        seed.admin.execute_command("CLUSTER", "MEET", node.ip, node.port, node.bus_port)

    @property
    def startup_nodes(self) -> list[ClientNode]:
        return [ClientNode(n.ip, n.port) for n in self.net_nodes() if n.alive]

    def addresses(self) -> list[str]:
        """host:port of every node, for worker processes."""
        return [f"{n.ip}:{n.port}" for n in self.net_nodes()]

    def net_nodes(self) -> list[NetNode]:
        return [n for n in self.nodes if isinstance(n, NetNode)]
