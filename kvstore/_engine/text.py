"""text(): a value the server sent (bytes, with decode_responses=False) as a str; and whether a
str can go to the server (its UTF-8 form: a lone surrogate has none)."""

from __future__ import annotations

from typing import Any

from .. import errors


def text(value: Any, what: str = "a stored value") -> str:
    """Bytes decoded (UTF-8), None as "", anything else (an int, a str) as str() gives it. Bytes
    no client wrote (not UTF-8) are a RecordError naming `what`, never a UnicodeDecodeError."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise errors.RecordError(f"{what} is not UTF-8: {value!r:.80}") from None
    return "" if value is None else str(value)


def sendable(value: str) -> bool:
    """Whether `value` has a UTF-8 form the server can take (a lone surrogate has none)."""
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def unsendable_key(value: Any, path: str = "") -> str | None:
    """The path of the first dict key in `value` (nested in dicts and lists) with no UTF-8 form."""
    if isinstance(value, dict):
        for key, item in value.items():
            key_path = f"{path}.{key!r}" if path else repr(key)
            if isinstance(key, str) and not sendable(key):
                return key_path
            found = unsendable_key(item, key_path)
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = unsendable_key(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None
