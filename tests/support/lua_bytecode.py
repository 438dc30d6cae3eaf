"""Lua 5.1 sources compiled by the Lua 5.1 runtime lupa ships (`lupa.lua51`, a pip install), and
the two facts the script checks read from the bytecode (`string.dump`), as `luac5.1 -l -l` lists
them: every global a chunk reads or writes (GETGLOBAL / SETGLOBAL, nested functions included),
and the locals of the chunk's main function.

Redis and Valkey run Lua 5.1; the bytecode layout read here is Lua 5.1's (lundump.c / ldump.c):
a 12-byte header, then the main function, each function being its header, code, constants
(nested functions among them) and debug info (line info, locals, upvalue names).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import lupa.lua51

__all__ = ["Chunk", "LuaSyntaxError", "compile_chunk"]

HEADER = b"\x1bLua\x51\x00\x01"  # signature, version 5.1, official format, little-endian
GETGLOBAL, SETGLOBAL = 5, 7  # lopcodes.h
NIL, BOOLEAN, NUMBER, STRING = 0, 1, 3, 4  # lua.h's type tags, as constants are dumped


class LuaSyntaxError(Exception):
    """The source does not compile; the message is the compiler's."""


@dataclass
class Chunk:
    """What the checks read of a compiled chunk."""

    globals: set[tuple[str, str]] = field(default_factory=set)  # ("GETGLOBAL", name), ...
    main_locals: set[str] = field(default_factory=set)


class _Reader:
    """Lua 5.1's dump format on this machine's sizes (the header gives them)."""

    def __init__(self, data: bytes) -> None:
        if not data.startswith(HEADER):
            raise ValueError(f"not Lua 5.1 bytecode: {data[:12]!r}")
        self.data = data
        int_size, size_t_size, instruction_size, number_size, _integral = data[7:12]
        self.int = {4: "<i", 8: "<q"}[int_size]
        self.size_t = {4: "<I", 8: "<Q"}[size_t_size]
        self.instruction = {4: "<I", 8: "<Q"}[instruction_size]
        self.number_size = number_size
        self.at = 12

    def unpack(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return int(value)

    def byte(self) -> int:
        self.at += 1
        return self.data[self.at - 1]

    def string(self) -> str:
        size = self.unpack(self.size_t)  # with its trailing NUL; 0 for none
        text = self.data[self.at : self.at + size - 1] if size else b""
        self.at += size
        return text.decode("utf-8", errors="replace")

    def function(self, chunk: Chunk, main: bool) -> None:
        self.string()  # source name
        # The lines it is defined on, then its upvalue, parameter, vararg and stack sizes.
        self.at += 2 * struct.calcsize(self.int) + 4
        code = [self.unpack(self.instruction) for _ in range(self.unpack(self.int))]
        constants = [self.constant() for _ in range(self.unpack(self.int))]
        for _ in range(self.unpack(self.int)):
            self.function(chunk, main=False)
        for instruction in code:
            opcode = instruction & 0x3F
            if opcode in (GETGLOBAL, SETGLOBAL):
                name = constants[instruction >> 14]  # Bx: the global's name among the constants
                chunk.globals.add(("GETGLOBAL" if opcode == GETGLOBAL else "SETGLOBAL", str(name)))
        lines = self.unpack(self.int)  # (read before `self.at += ...` takes self.at)
        self.at += lines * struct.calcsize(self.int)  # line info
        for _ in range(self.unpack(self.int)):
            name = self.string()
            self.at += 2 * struct.calcsize(self.int)  # the pcs where it lives
            if main:
                chunk.main_locals.add(name)
        for _ in range(self.unpack(self.int)):
            self.string()  # upvalue names

    def constant(self) -> object:
        kind = self.byte()
        if kind == NIL:
            return None
        if kind == BOOLEAN:
            return bool(self.byte())
        if kind == NUMBER:
            self.at += self.number_size
            return 0
        if kind == STRING:
            return self.string()
        raise ValueError(f"unknown constant type {kind} at byte {self.at}")


_runtime = lupa.lua51.LuaRuntime(encoding=None)


def compile_chunk(source: str, name: str = "=source") -> Chunk:
    """Compiles `source` with Lua 5.1 and reads its globals and main locals from the bytecode.
    Raises LuaSyntaxError with the compiler's message when it does not compile."""
    function, error = _runtime.globals().loadstring(source.encode(), name.encode()), None
    if isinstance(function, tuple):
        function, error = function
    if function is None:
        raise LuaSyntaxError((error or b"").decode(errors="replace"))
    chunk = Chunk()
    _Reader(_runtime.globals().string.dump(function)).function(chunk, main=True)
    return chunk
