"""Commands packed by hiredis directly, for the connections of a store's own pool.

redis-py's hiredis packer looks at every argument in Python before hiredis packs them (a
memoryview anywhere, a bytearray, then its encoder's chain of type checks and ``str.encode``):
22-34 µs for an append's command of 27 arguments, where hiredis alone takes 3-4
(docs/BENCHMARKS.md, "Commands packed by hiredis directly"). The commands a
store sends are all bytes and str (kvstore/_engine/drivers.py: ``wire`` makes every int bytes),
which hiredis packs itself exactly as that encoder would: bytes as they are, str as UTF-8 with
a lone surrogate refused (UnicodeEncodeError). So a connection whose encoder is UTF-8 and
strict hands such a command to hiredis at once; any other argument (an int, a float, a
memoryview: redis-py's own commands send them) or a command name with a space in it
(``"CLIENT SETINFO"``, split in two by redis-py) goes to redis-py's packer as before.
"""

from __future__ import annotations

import codecs
from typing import Any

import hiredis  # redis[hiredis] is a dependency
import redis.connection

# The packer redis-py gives a connection when hiredis is there (none before redis-py 5.1: then
# every connection keeps its own).
_SERIALIZER: Any = getattr(redis.connection, "HiredisRespSerializer", None)

__all__ = ["QuickPacking"]


_PLAIN = frozenset((bytes, str))


class _QuickPacker:
    """redis-py's packer (`slow`) with hiredis first for commands of bytes and str."""

    __slots__ = ("slow",)

    def __init__(self, slow: Any) -> None:
        self.slow = slow

    def pack(self, *args: Any) -> list[bytes]:
        name = args[0] if args else None
        if type(name) is str:
            plain = " " not in name
        elif type(name) is bytes:
            plain = b" " not in name
        else:
            plain = False
        if plain and _PLAIN.issuperset(map(type, args)):
            return [hiredis.pack_command(args)]
        return self.slow.pack(*args)  # type: ignore[no-any-return]  # redis-py is unannotated


def _utf8_strict(encoder: Any) -> bool:
    try:
        name = codecs.lookup(encoder.encoding).name
    except (AttributeError, LookupError, TypeError):
        return False
    return name == "utf-8" and encoder.encoding_errors == "strict"


class QuickPacking:
    """Mixed into a connection class (sync or asyncio) before redis-py's: its packer takes
    commands of bytes and str to hiredis directly. A connection without redis-py's hiredis
    packer, or with another encoding, keeps its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        packer = getattr(self, "_command_packer", None)
        encoder = getattr(self, "encoder", None)
        if _SERIALIZER is not None and type(packer) is _SERIALIZER and _utf8_strict(encoder):
            self._command_packer = _QuickPacker(packer)
