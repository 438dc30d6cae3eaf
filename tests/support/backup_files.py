"""Backup files written by hand, as `kvstore export` writes them (docs/BACKUPS.md): a header, the
message lines and the end line that proves them whole; and the CLI's one-line refusals."""

from __future__ import annotations

import hashlib
import json

DATE = "2026-01-01T00:00:00Z"


def sealed(head: dict, lines: list[dict], end_format: int = 1) -> str:
    """A backup file of these lines, with the end line (of `end_format`) that proves it whole."""
    texts = [json.dumps(head)] + [json.dumps(line) for line in lines]
    digest = hashlib.sha256("".join(t + "\n" for t in texts).encode())
    end = {"kvstore_backup_end": end_format, "messages": len(lines), "sha256": digest.hexdigest()}
    return "\n".join([*texts, json.dumps(end)]) + "\n"


def header(last_seq: int, fmt: int = 1, **fields) -> dict:
    """The header of a backup of thread "x" whose last sequence is `last_seq`."""
    return {
        "kvstore_backup": fmt,
        "thread": "x",
        "messages": last_seq,
        "last_seq": last_seq,
        "summary_last": 0,
        "summary_seq": 0,
        "deleted_before": 0,
        "turn": None,
        "turns": [],
        "prompt": None,
        **fields,
    }


def user(seq: int, **fields) -> dict:
    """A user message's line of format 1 (the message itself, with its sequence)."""
    body = {"message_type": "user_message", "id": f"m{seq}", "date": DATE, "seq_id": seq}
    return body | {"content": f"c{seq}", **fields}


def one_error_line(capsys) -> str:
    """The one line a refused CLI command writes to stderr (its progress lines aside)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if not line.startswith("  ")]  # progress lines
    assert len(lines) == 1, err
    return lines[0]
