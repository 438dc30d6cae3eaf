"""text(): a value the server sent (bytes, with decode_responses=False) as a str."""

from __future__ import annotations

from typing import Any


def text(value: Any) -> str:
    """Bytes decoded (UTF-8), None as "", anything else (an int, a str) as str() gives it."""
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)
