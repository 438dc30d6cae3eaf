"""Test hosts of our own: network namespaces joined by veth pairs, links cut by taking one down.

``NetLab(hosts=6)`` makes one namespace per host, each with an address of its own on its
loopback (10.213.N.1, .2, …, N of this run), and a full mesh of veth pairs: one link between every two hosts,
and one between each host and this process's namespace (the clients' side, which has the address
10.213.N.254 on each of its link ends). Every address is reached over the one link to its
host (a /32 route per link), so taking a link down cuts exactly those two ends apart and nothing
else: `cut(a, b)`, `heal(a, b)`, `isolate(a)`. No route leads anywhere but to these addresses (this namespace's
route to them all is `unreachable` but over their links);
`close()` removes every namespace and interface made (and a lab left by a killed run is removed
by the next one).

Needs root (CAP_NET_ADMIN) and `ip` (iproute2).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from itertools import combinations

PREFIX = "kvp"  # every namespace and root-side interface a lab makes starts with this
NETWORKS = "10.213"  # a lab takes the /24 10.213.<20 + its pid % 200>.0: two runs can coexist
CLIENTS = -1  # the clients' side, as a host index


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=10)


def available() -> str | None:
    """Why a lab cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    try:
        _ip("netns", "list")
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`ip netns` is not usable: {exc}"
    return None


def remove_stale() -> None:
    """Removes the namespaces and interfaces of labs whose process is gone."""
    for line in _ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        owner = name[len(PREFIX) :].split("h")[0]
        if name.startswith(PREFIX) and owner.isdigit() and not _running(int(owner)):
            _ip("netns", "del", name, check=False)
    for line in _ip("-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        owner = name[len(PREFIX) :].split("c")[0]
        if name.startswith(PREFIX) and owner.isdigit() and not _running(int(owner)):
            _ip("link", "del", name, check=False)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class NetLab:
    """`hosts` namespaces in a full mesh, plus the clients' side (this namespace)."""

    def __init__(self, hosts: int) -> None:
        if not 1 <= hosts <= 20:
            raise ValueError("1..20 hosts")
        remove_stale()
        self.tag = str(os.getpid())
        self.network = f"{NETWORKS}.{20 + os.getpid() % 200}"
        self.hosts = hosts
        self.namespaces = [f"{PREFIX}{self.tag}h{i}" for i in range(hosts)]
        self._links: dict[tuple[int, int], tuple[str, str]] = {}  # (a, b) -> (ns, dev) of a's end
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def address(self, host: int) -> str:
        return f"{self.network}.{254 if host == CLIENTS else host + 1}"

    def _build(self) -> None:
        # Nothing for the lab's addresses ever leaves by this namespace's default route: a cut
        # link's address is unreachable, not sent to the gateway.
        _ip("route", "replace", "unreachable", f"{self.network}.0/24")
        for i, ns in enumerate(self.namespaces):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/32", "dev", "lo")
        for a, b in combinations(range(self.hosts), 2):
            self._link(a, f"l{b}", b, f"l{a}")
        for i in range(self.hosts):
            # The clients' address lives on their end of each link (a link down keeps it).
            _ip(
                "link",
                "add",
                f"{PREFIX}{self.tag}c{i}",
                "type",
                "veth",
                "peer",
                "name",
                "c",
                "netns",
                self.namespaces[i],
            )
            _ip("addr", "add", f"{self.address(CLIENTS)}/32", "dev", f"{PREFIX}{self.tag}c{i}")
            self._route(i, "c", CLIENTS, f"{PREFIX}{self.tag}c{i}")

    def _link(self, a: int, a_dev: str, b: int, b_dev: str) -> None:
        """A veth pair between hosts a and b (both namespaces of the lab)."""
        _ip(
            "link",
            "add",
            a_dev,
            "netns",
            self.namespaces[a],
            "type",
            "veth",
            "peer",
            "name",
            b_dev,
            "netns",
            self.namespaces[b],
        )
        self._route(a, a_dev, b, b_dev)

    def _route(self, a: int, a_dev: str, b: int, b_dev: str) -> None:
        """Each end's address routed over the link from the other end."""
        for host, dev, other in ((a, a_dev, b), (b, b_dev, a)):
            self._links[(host, other)] = (self.namespaces[host] if host != CLIENTS else "", dev)
        self.heal(a, b)

    def _scope(self, host: int) -> list[str]:
        return ["-n", self.namespaces[host]] if host != CLIENTS else []

    def cut(self, a: int, b: int) -> None:
        """Takes the link between hosts a and b down, both ends (CLIENTS for the clients' side):
        each end's route to the other goes with it, so neither reaches the other any way."""
        for host, other in ((a, b), (b, a)):
            _ip(*self._scope(host), "link", "set", self._links[(host, other)][1], "down")

    def heal(self, a: int, b: int) -> None:
        """Brings the link back up, both ends, with their routes."""
        for host, other in ((a, b), (b, a)):
            dev = self._links[(host, other)][1]
            _ip(*self._scope(host), "link", "set", dev, "up")
            _ip(
                *self._scope(host),
                "route",
                "replace",
                f"{self.address(other)}/32",
                "dev",
                dev,
                "src",
                self.address(host),
            )

    def isolate(self, host: int) -> None:
        """Cuts every link of `host` (the clients' side included)."""
        for other in [CLIENTS, *range(self.hosts)]:
            if other != host:
                self.cut(host, other)

    def heal_all(self) -> None:
        for a, b in self._links:
            if a < b:  # each link once (the clients' side is -1)
                self.heal(a, b)

    def exec_prefix(self, host: int) -> list[str]:
        """The command prefix that runs a program on `host`."""
        return ["ip", "netns", "exec", self.namespaces[host]]

    def close(self) -> None:
        _ip("route", "del", "unreachable", f"{self.network}.0/24", check=False)
        for ns in self.namespaces:  # deleting a namespace deletes the veth ends inside it
            _ip("netns", "del", ns, check=False)
        for i in range(self.hosts):
            _ip("link", "del", f"{PREFIX}{self.tag}c{i}", check=False)

    def __enter__(self) -> NetLab:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.close()
