"""The Lua sources as built: each compiles, names only the globals the server provides, and each
file includes exactly the includes it uses; every error code a script raises is mapped.

Compiled with Lua 5.1 (Redis and Valkey run Lua 5.1) from lupa, which the test extra installs
(tests/support/lua_bytecode.py): the bytecode names every global a chunk reads or writes and the
locals of its main function. Where Debian's Lua 5.1 compiler is installed (`luac5.1`, package
`lua5.1`), its listing (`luac5.1 -p -l -l`) is a second opinion that must read the same; .ci/run
installs it and sets KVSTORE_REQUIRE_LUAC=1, so there a missing compiler fails the run.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from kvstore import errors
from kvstore._engine import scripts as _scripts
from kvstore._engine.scripts import (
    ERROR_CODES,
    SCRIPT_NAMES,
    SCRIPTS,
    build_source,
    error_from_reply,
)

from ..support.lua_bytecode import Chunk, LuaSyntaxError, compile_chunk
from ..support.script_headers import script_header

# The globals Redis/Valkey's Lua gives a script that kvstore's scripts use; a new one is a
# decision (deterministic? read-only?), made by adding it here.
ALLOWED_GLOBALS = frozenset(
    {
        "redis",
        "KEYS",
        "ARGV",
        "cjson",
        "string",
        "table",
        "math",
        "tonumber",
        "tostring",
        "type",
        "ipairs",
        "pairs",
        "unpack",
        "select",
        "pcall",
        # Raises an error reply: read_limits' refusal of a malformed limits argument, in the
        # prologue, before anything is read or written.
        "error",
    }
)

LUAC = "luac5.1"
_LUA = resources.files("kvstore.lua")
INCLUDE_NAMES = sorted(
    f"includes/{entry.name.removesuffix('.lua')}"
    for entry in _LUA.joinpath("includes").iterdir()
    if entry.name.endswith(".lua")
)
_INCLUDE_LINE = re.compile(r'^--- @include "([a-z0-9_/]+)"\s*$', re.MULTILINE)
_GLOBAL_OP = re.compile(r"\s(GETGLOBAL|SETGLOBAL)\s.*;\s*(\S+)\s*$")
REQUIRE_LUAC = os.environ.get("KVSTORE_REQUIRE_LUAC") == "1"


def _compiled(source: str) -> Chunk:
    """The source compiled by Lua 5.1; a failure to compile fails the test."""
    if source.startswith("#!"):
        source = "--" + source[2:]  # the shebang is the server's, not Lua's: keep line numbers
    try:
        return compile_chunk(source)
    except LuaSyntaxError as exc:
        pytest.fail(f"Lua 5.1 does not compile it: {exc}")


def globals_of(source: str) -> set[tuple[str, str]]:
    """Every (GETGLOBAL|SETGLOBAL, name) in the compiled source, nested functions included."""
    return _compiled(source).globals


def unexpected_globals(source: str) -> list[str]:
    """The globals the source should not touch: any write, any read outside ALLOWED_GLOBALS."""
    return sorted(
        f"{op} {name}"
        for op, name in globals_of(source)
        if op == "SETGLOBAL" or name not in ALLOWED_GLOBALS
    )


def top_level_locals(source: str) -> set[str]:
    """The locals of the chunk's main function: the names a file defines for its users."""
    return _compiled(source).main_locals


def _file_text(name: str) -> str:
    """The file as written; a script's with the prologue that names its arguments, and that
    prologue's include (kvstore/_engine/scripts.py)."""
    if name.startswith("includes/"):
        return _LUA.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return _scripts._read_script(name)


def _own_text(name: str) -> str:
    """The file, its include lines removed."""
    return _INCLUDE_LINE.sub("", _file_text(name))


# The check itself.


def test_the_check_finds_an_undefined_global():
    assert unexpected_globals("local function f() return undefined_name(1) end") == [
        "GETGLOBAL undefined_name"
    ]


def test_the_check_finds_a_local_defined_after_its_user():
    source = "local function a() return b() end\nlocal function b() return 1 end\nreturn a()"
    assert unexpected_globals(source) == ["GETGLOBAL b"]


def test_the_check_finds_any_global_write():
    assert unexpected_globals("redis = nil\ncount = 1") == ["SETGLOBAL count", "SETGLOBAL redis"]


def test_the_check_allows_what_the_server_provides():
    source = "#!lua\nreturn redis.call('GET', KEYS[1]) or tonumber(ARGV[1]) or string.len('x')"
    assert unexpected_globals(source) == []


def test_the_check_reports_a_syntax_error():
    with pytest.raises(pytest.fail.Exception, match="does not compile"):
        globals_of("local x = = 1")


def test_top_level_locals():
    assert top_level_locals(
        "local A = 1\nlocal function f(x) local y = x return y end\nlocal b, c = 2\n"
    ) == {"A", "f", "b", "c"}


# The sources.


def test_the_library_keeps_room_for_a_layouts_includes():
    """The function library is one chunk, and Lua 5.1 refuses a chunk of more than 200 locals:
    its includes keep room for a new layout's (docs/ARCHITECTURE.md)."""
    from kvstore._engine.scripts import LIBRARY

    count = len(top_level_locals("--" + LIBRARY.source[2:]))  # the shebang as a comment
    print(f"\nthe library's main function holds {count} locals")
    assert count <= 185


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_script_uses_no_unexpected_global(name):
    assert unexpected_globals(SCRIPTS[name].source) == []


@pytest.mark.parametrize("name", INCLUDE_NAMES)
def test_include_built_alone_uses_no_unexpected_global(name):
    """An include stands on its own: built as if it were a script, every name it uses is defined."""
    assert unexpected_globals(build_source(name)) == []


def test_no_two_includes_define_the_same_name():
    defined: dict[str, str] = {}
    clashes = []
    for name in INCLUDE_NAMES:
        for local in top_level_locals(_own_text(name)):
            if local in defined:
                clashes.append(f"{local}: {defined[local]} and {name}")
            defined.setdefault(local, name)
    assert clashes == []


@pytest.mark.parametrize("name", [*SCRIPT_NAMES, *INCLUDE_NAMES])
def test_file_includes_exactly_what_it_uses(name):
    """Each name a file uses from an include comes from one it includes itself (not one its
    neighbours happen to include first), and each include it names gives it something."""
    defined_by = {include: top_level_locals(_own_text(include)) for include in INCLUDE_NAMES}
    included = _INCLUDE_LINE.findall(_file_text(name))
    used = {global_name for _, global_name in globals_of(_own_text(name))} - ALLOWED_GLOBALS
    not_included = sorted(
        f"{global_name} ({', '.join(i for i, names in defined_by.items() if global_name in names) or 'defined nowhere'})"
        for global_name in used
        if not any(global_name in defined_by[include] for include in included)
    )
    unused = sorted(include for include in included if not used & defined_by[include])
    assert (not_included, unused) == ([], [])


# The second opinion: Debian's luac5.1 reads the same from the same sources. Collected where it
# is installed, and always in CI (KVSTORE_REQUIRE_LUAC=1: there a missing compiler fails).


def _luac_listing(source: str) -> str:
    """`luac5.1 -p -l -l` of the source."""
    if shutil.which(LUAC) is None:
        pytest.fail(f"KVSTORE_REQUIRE_LUAC=1 but {LUAC} is not installed (apt-get install lua5.1)")
    if source.startswith("#!"):
        source = "--" + source[2:]
    done = subprocess.run(
        [LUAC, "-p", "-l", "-l", "-"], input=source, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"{LUAC} does not compile it: {done.stderr.strip()}")
    return done.stdout


def luac_reading(source: str) -> Chunk:
    """What luac5.1's listing names: the globals, and the main function's locals."""
    lines = _luac_listing(source).splitlines()
    chunk = Chunk()
    for line in lines:
        match = _GLOBAL_OP.search(line)
        if match:
            chunk.globals.add((match.group(1), match.group(2)))
    start = next(i for i, line in enumerate(lines) if line.startswith("locals ("))
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        chunk.main_locals.add(line.split("\t")[2])
    return chunk


if shutil.which(LUAC) or REQUIRE_LUAC:

    @pytest.mark.parametrize("name", [*SCRIPT_NAMES, *INCLUDE_NAMES])
    def test_luac_reads_what_the_bytecode_check_reads(name):
        sources = [_own_text(name), build_source(name)]
        if name in SCRIPTS:
            sources.append(SCRIPTS[name].source)
        for source in sources:
            assert luac_reading(source) == _compiled(source)


# The error codes.

_CODE_IN_LUA = re.compile(r"""['"](KVS_[A-Z_]+)""")


def _codes_in_lua() -> set[str]:
    codes = set()
    for name in [*SCRIPT_NAMES, *INCLUDE_NAMES]:
        codes |= set(_CODE_IN_LUA.findall(_LUA.joinpath(f"{name}.lua").read_text(encoding="utf-8")))
    return codes


def test_the_lua_raises_error_codes():
    assert {"KVS_WRONGTYPE", "KVS_MEDIA_OVER", "KVS_CURSOR_EXPIRED"} <= _codes_in_lua()


@pytest.mark.parametrize("code", sorted(_codes_in_lua()))
def test_every_error_code_in_lua_maps_to_one_typed_error(code):
    """The table names the code, and the reply raises exactly the class the table names (not a
    subclass, not a case handled apart)."""
    assert code in ERROR_CODES
    error = error_from_reply(SCRIPTS["append"], f"{code} 1 detail")
    assert type(error) is ERROR_CODES[code]
    assert not isinstance(error, (errors.ServerError, errors.PermissionDenied)), code


def test_every_mapped_error_code_is_raised_by_some_script():
    assert sorted(set(ERROR_CODES) - _codes_in_lua()) == []


def test_the_table_is_written_once():
    """A dict literal keeps the last of two entries for one code: the source names each once."""
    source = inspect.getsource(_scripts)
    table = source[source.index("ERROR_CODES: dict") :]
    table = table[: table.index("\n}\n")]
    named = re.findall(r'"(KVS_[A-Z_]+)":', table)
    assert sorted(named) == sorted(set(named)) == sorted(ERROR_CODES)


def test_error_replies_carry_their_values():
    over = error_from_reply(
        SCRIPTS["append"], "KVS_MEDIA_OVER 120 bytes of inline media are left in the thread"
    )
    assert over.available == 120
    expired = error_from_reply(
        SCRIPTS["page_plan"], "KVS_CURSOR_EXPIRED 41 no stored message has id m-1; ..."
    )
    assert expired.deleted_before_sequence == 41 and str(expired).startswith(
        "no stored message has id m-1"
    )


def test_an_unknown_error_names_the_script():
    error = error_from_reply(SCRIPTS["retain"], "ERR user_script:3: something odd")
    assert type(error) is errors.ServerError and "retain.lua" in str(error)


_DOC_ROW = re.compile(r"^\| `(KVS_[A-Z_]+)[^|]*\| `(\w+)`[^|]*\| ([^|]*) \|", re.MULTILINE)


def _documented_codes() -> dict[str, tuple[str, set[str]]]:
    """docs/LAYOUT.md's error table: code -> (class name, the scripts it names)."""
    text = (Path(__file__).parents[2] / "docs" / "LAYOUT.md").read_text(encoding="utf-8")
    rows = {}
    for code, class_name, raised_by in _DOC_ROW.findall(text):
        assert code not in rows, f"{code} has two rows"
        rows[code] = (class_name, set(re.findall(r"[a-z_]+", raised_by)))
    return rows


def test_the_documented_table_is_the_table():
    assert {code: row[0] for code, row in _documented_codes().items()} == {
        code: cls.__name__ for code, cls in ERROR_CODES.items()
    }


def _header_codes() -> dict[str, set[str]]:
    return {name: set(script_header(name).errors) for name in SCRIPT_NAMES}


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_header_names_the_codes_its_script_raises(name):
    """The Errors line names every code the script's own text raises, and none that its source
    as built (with its includes) cannot raise. (A code an include raises in a function the
    script never calls is not found here: the header says what the script can raise.)"""
    listed = set(script_header(name).errors)
    own = set(_CODE_IN_LUA.findall(_own_text(name)))
    built = set(_CODE_IN_LUA.findall(SCRIPTS[name].source))
    assert (sorted(own - listed), sorted(listed - built)) == ([], [])


def test_the_documented_table_names_the_scripts_each_header_names():
    documented = {}
    for code, (_class_name, raised_by) in _documented_codes().items():
        documented[code] = set(SCRIPT_NAMES) if raised_by == {"every", "script"} else raised_by
    from_headers = {
        code: {name for name, codes in _header_codes().items() if code in codes}
        for code in ERROR_CODES
    }
    assert documented == from_headers
