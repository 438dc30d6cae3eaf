"""The README's least-privileged application user, made on a test server for one namespace."""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator
from pathlib import Path

import redis

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_acl_rules(namespace: str, password: str) -> list[str]:
    """The README's application user's rules (its one ACL SETUSER line), for `namespace`."""
    text = README.read_text(encoding="utf-8")
    (line,) = [ln.strip() for ln in text.splitlines() if "ACL SETUSER kvstore-app " in ln]
    line = line.replace("<password>", password).replace("<namespace>", namespace)
    return shlex.split(line)[3:]


@contextlib.contextmanager
def app_user_url(url: str, admin: redis.Redis, namespace: str) -> Iterator[str]:
    """`url` as the README's application user of `namespace` (the user is deleted after)."""
    user, password = f"app-{namespace}", f"pw-{namespace}"
    admin.execute_command("ACL", "SETUSER", user, *readme_acl_rules(namespace, password))
    try:
        yield url.replace("redis://", f"redis://{user}:{password}@", 1)
    finally:
        admin.execute_command("ACL", "DELUSER", user)
