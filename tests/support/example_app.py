"""examples/fastapi_chat as a user runs it: the embedded server (`python -m kvstore server`) and
the app under `uvicorn --workers 2`, each a process the tests can stop, kill and start again.
tests/integration/test_example_fastapi.py drives it over HTTP, test_example_browser.py in
chromium."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import redis

from kvstore.cli.process import free_port

ROOT = Path(__file__).resolve().parents[2]


def wait_until(check: Callable[[], object], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:  # not up yet
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("not up in time")
        time.sleep(0.1)


def die_with_pytest() -> None:
    """preexec_fn: Linux sends the process SIGTERM when pytest dies (even of SIGKILL), so that
    neither the server nor the app outlives the run."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def stop(process: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(sig)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Deployment:
    """The server and the app, on free ports, their data and the app's log under `root`."""

    def __init__(self, root: Path, model_delay: float = 0.02) -> None:
        self.root = root
        self.db_port, self.app_port = free_port(), free_port()
        self.db_url = f"redis://127.0.0.1:{self.db_port}/0"
        self.url = f"http://127.0.0.1:{self.app_port}"
        self.model_delay = model_delay
        self.log = root / "app.log"
        self.server: subprocess.Popen | None = None
        self.app: subprocess.Popen | None = None

    def start_server(self) -> None:
        command = [sys.executable, "-m", "kvstore", "server", "--data-dir", str(self.root / "data")]
        self.server = subprocess.Popen(
            [*command, "--port", str(self.db_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_pytest,
        )
        client = redis.Redis(port=self.db_port)
        try:
            wait_until(client.ping)
        finally:
            client.close()

    def stop_server(self) -> None:
        """Stops the server as an operator does (its data is kept for the next start)."""
        assert self.server is not None
        stop(self.server)

    def start_app(self) -> None:
        env = {
            **os.environ,
            "KVSTORE_URL": self.db_url,
            "FAKE_MODEL_DELAY": str(self.model_delay),
        }
        # The README's command: two workers, and a bounded wait for open streams on SIGTERM.
        command = [sys.executable, "-m", "uvicorn", "examples.fastapi_chat.app:app", "--workers"]
        command += ["2", "--timeout-graceful-shutdown", "3"]
        with self.log.open("ab") as log:
            self.app = subprocess.Popen(
                [*command, "--port", str(self.app_port)],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_pytest,
            )
        wait_until(lambda: httpx.get(f"{self.url}/openapi.json").status_code == 200)

    def stop_app(self) -> float:
        """Stops the app as an operator does (SIGTERM); returns the seconds it took."""
        assert self.app is not None
        started = time.monotonic()
        stop(self.app)
        return time.monotonic() - started

    def workers(self) -> list[int]:
        """The pids of the app's worker processes."""
        assert self.app is not None
        pids = Path(f"/proc/{self.app.pid}/task/{self.app.pid}/children").read_text().split()
        return [int(pid) for pid in pids]

    def kill_workers(self) -> None:
        """SIGKILL every worker, as a crash or the OOM killer does; uvicorn starts new ones."""
        for pid in self.workers():
            os.kill(pid, signal.SIGKILL)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        for process in (self.app, self.server):
            if process is not None:
                stop(process)


def deployment(root: Path, model_delay: float = 0.02) -> Iterator[Deployment]:
    """A started deployment, stopped when the test is done (the body of a fixture)."""
    deploy = Deployment(root, model_delay)
    try:
        deploy.start_server()
        deploy.start_app()
        yield deploy
    finally:
        deploy.close()


def read_events(
    stream: httpx.Response | Iterator[str], into: list[dict], until: str = "turn_finished"
) -> int:
    """Parses the SSE stream into `into` until an event of kind `until`; returns the bytes read.
    (To read on after that, pass the same ``response.iter_lines()`` each time.)"""
    lines = stream.iter_lines() if isinstance(stream, httpx.Response) else stream
    event: dict = {}
    size = 0
    for line in lines:
        size += len(line.encode()) + 1
        if line == "":
            if "event" in event:
                into.append(event)
                if event["event"] == until:
                    return size
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            event[name] = json.loads(value) if name == "data" else value
    return size
