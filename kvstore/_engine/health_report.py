"""HealthReport: what health() read (kvstore/_engine/health.py), and its text for a person."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, computed_field

from .scripts import LIBRARY, SCRIPTS

# What a setting that cannot be read needs: the README's application user has neither.
ADMIN_HINT = "run the check as a user allowed INFO and CONFIG GET (an admin) to read them"


class HealthReport(BaseModel):
    """The server's relevant settings; `warnings` names each one that voids a guarantee, and
    `unchecked` each one that could not be read, with why."""

    model_config = ConfigDict(frozen=True)

    server: str
    version: str | None = None
    lua: bool | None = None
    maxmemory: int | None = None
    maxmemory_policy: str | None = None
    appendonly: bool | None = None
    appendfsync: str | None = None
    save: str | None = None
    aof_last_write_ok: bool | None = None
    library: str = LIBRARY.name
    library_loaded: bool | None = None
    scripts_loaded: int | None = None
    scripts_total: int = len(SCRIPTS)
    warnings: tuple[str, ...] = ()
    unchecked: tuple[str, ...] = ()

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form; mypy rejects it
    @property
    def ok(self) -> bool:
        """Every setting was read and none voids a guarantee."""
        return not self.warnings and not self.unchecked

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form; mypy rejects it
    @property
    def complete(self) -> bool:
        """Every setting kvstore's guarantees depend on was read."""
        return not self.unchecked

    def __str__(self) -> str:
        def show(value: Any) -> str:
            return "unknown" if value is None else str(value)

        lines = [
            f"server           {self.server} {show(self.version)}",
            f"lua              {show(self.lua)}",
            f"maxmemory        {show(self.maxmemory)} (policy {show(self.maxmemory_policy)})",
            f"appendonly       {show(self.appendonly)} (appendfsync {show(self.appendfsync)})",
            f"save             {show(self.save if self.save is None else repr(self.save))}",
            *self._script_lines(),
        ]
        lines += [f"warning: {w}" for w in self.warnings]
        lines += [f"unchecked: {u}" for u in self.unchecked]
        if self.ok:
            lines.append("ok: no setting voids kvstore's guarantees")
        elif not self.warnings:
            lines.append(
                f"no setting read voids kvstore's guarantees; {len(self.unchecked)} unchecked: {ADMIN_HINT}"
            )
        return "\n".join(lines)

    def _script_lines(self) -> list[str]:
        """How kvstore's scripts reach the server: the function library, loaded by the first
        write that needs it; on the EVAL path (scripting='eval', a server without functions)
        each script, loaded by its first call. Neither is missing before that call."""
        if self.library_loaded is None:
            library = f"{self.library} loaded: unknown"
        elif self.library_loaded:
            library = f"{self.library} loaded"
        else:
            library = f"{self.library} not loaded yet: the first write loads it (FUNCTION LOAD)"
        if self.scripts_loaded is None:
            scripts = "unknown (SCRIPT EXISTS could not be read)"
        elif self.scripts_loaded:
            scripts = (
                f"{self.scripts_loaded} of {self.scripts_total} cached, for stores with"
                " scripting='eval' (each of the others loads on its first call)"
            )
        elif self.library_loaded:
            scripts = "none cached: the function library serves the calls"
        else:
            scripts = "none cached: each loads on its first call (stores with scripting='eval')"
        return [f"library          {library}", f"eval scripts     {scripts}"]
