"""Progress of a long command (export, import, migrate), and what an export writes to."""

from __future__ import annotations

import time
from typing import IO, Protocol


class TextOut(Protocol):
    """Where an export writes its text: a file, or standard output behind a guard (main.py)."""

    def write(self, text: str, /) -> int: ...


class Progress:
    """Progress of a long command on standard error: a bar redrawn in place on a terminal, and
    one line every `every` seconds (and a last one) elsewhere, so a log gets lines, not one line
    of carriage returns."""

    def __init__(
        self,
        label: str,
        total: int | None,
        out: IO[str],
        every: float = 5.0,
        terminal: bool | None = None,
        unit: str = "messages",
    ) -> None:
        self.label, self.total, self.out, self.every, self.unit = label, total, out, every, unit
        self.terminal = out.isatty() if terminal is None else terminal
        self.done = self.already = 0
        self._last = time.monotonic()
        self._shown_at: int | None = None  # the count last shown

    def update(self, new: int, already: int = 0) -> None:
        self.done += new + already
        self.already += already
        now = time.monotonic()
        if now - self._last >= (0.1 if self.terminal else self.every):
            self._last = now
            self._show()

    def close(self) -> None:
        """The last count, once (a terminal's bar only if it was drawn), then the bar's newline."""
        if self._shown_at != self.done and (self._shown_at is not None or not self.terminal):
            self._show()
        if self.terminal and self._shown_at is not None:
            print(file=self.out, flush=True)

    def _show(self) -> None:
        self._shown_at = self.done
        total = self.total
        counted = f"{self.done:,}/{total:,}" if total else f"{self.done:,}"
        if self.terminal:
            width = 30
            filled = int(width * min(self.done, total) / total) if total else 0
            print(
                f"\r  {self.label} [{'#' * filled}{'.' * (width - filled)}] {counted}",
                end="",
                file=self.out,
                flush=True,
            )
        else:
            share = f" ({100 * min(self.done, total) // total}%)" if total else ""
            print(f"  {self.label}: {counted} {self.unit}{share}", file=self.out, flush=True)
