"""A backup file's own format (docs/LAYOUT.md, "Backup and restore"): its header line (the
thread's state), its end line (the count of message lines and the checksum of every line before
it), the checks that a file read back is whole and its header is one `export` wrote, and its
lines read as UTF-8 text."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any, get_args

from .. import admin, errors
from ..admin import check_metadata, check_title, check_token, checked_tokens
from ..limits import MAX_SEQUENCE
from ..messages import parse_message
from ..models import ThreadInfo, TurnOutcome

# Format 2 holds each message apart from the backup's own data about it: a message may hold an
# unknown field of any name, so format 1's `turn_id` and `tokens` beside its fields could be its.
BACKUP_FORMAT = 2
READ_FORMATS = (1, 2)
# The end line's key: {"kvstore_backup_end": 2, "messages": N, "sha256": "<hex>"}.
BACKUP_END = "kvstore_backup_end"
# A format-2 message line: {"message": {...}, "turn_id": "t9", "tokens": 34}, no other key.
MESSAGE_KEY = "message"
ENTRY_KEYS = frozenset((MESSAGE_KEY, "turn_id", "tokens"))
# What every message line has and the header and end line never do: format 1's message its
# `message_type` (it may hold an unknown field named like their keys), format 2's its wrapper.
MESSAGE_MARK = {1: "message_type", 2: MESSAGE_KEY}
# A turn record's outcome: open, or what finish_turn or an ended lease recorded.
OUTCOMES = frozenset(("open", *get_args(TurnOutcome)))


def is_header(body: object) -> bool:
    # A first line without a header is a plain message (with `message_type`), of any format.
    return isinstance(body, dict) and "kvstore_backup" in body and "message_type" not in body


def is_end_line(body: object, form: int) -> bool:
    return isinstance(body, dict) and BACKUP_END in body and MESSAGE_MARK[form] not in body


def entry(message: dict[str, Any], turn_id: str | None, tokens: int | None) -> dict[str, Any]:
    """A backed-up message as format 2 writes it (a message line, a kept prompt's message)."""
    line: dict[str, Any] = {MESSAGE_KEY: message}
    if turn_id is not None:
        line["turn_id"] = turn_id
    if tokens is not None:
        line["tokens"] = tokens
    return line


def read_entry(body: object, form: int) -> tuple[dict[str, Any], str | None, int | None]:
    """A backed-up message's fields, turn id and token count (None: none recorded), as `form`
    wrote them; ValueError for a line of another shape."""
    if not isinstance(body, dict):
        raise ValueError(f"{body!r:.80} is not a message line")
    if form == 1:  # the backup's data beside the message's fields
        body = dict(body)
        turn_id, tokens = body.pop("turn_id", None), body.pop("tokens", None)
        fields = body
    elif isinstance(body.get(MESSAGE_KEY), dict) and body.keys() <= ENTRY_KEYS:
        fields, turn_id, tokens = body[MESSAGE_KEY], body.get("turn_id"), body.get("tokens")
    else:
        raise ValueError(
            f"a message line is {{{MESSAGE_KEY!r}: {{...}}}} with at most 'turn_id' and 'tokens'"
            f" beside it, not {body!r:.80}"
        )
    if turn_id is not None and not isinstance(turn_id, str):
        raise ValueError(f"turn_id {turn_id!r:.80} is not a string")
    # A backup written before counts were kept has none: the restoring store counts them.
    if tokens is not None:
        checked_tokens(tokens, "the message")
    return fields, turn_id, tokens


def line_digest() -> Any:
    return hashlib.sha256()


def add_line(digest: Any, line: str) -> None:
    """A line as the checksum takes it: its text without its line break, then "\n" (a file
    whose line breaks became CRLF is the same backup)."""
    digest.update(line.rstrip("\r\n").encode("utf-8") + b"\n")


def header_line(
    thread_id: str, messages: int, state: admin.BackupState, info: ThreadInfo | None = None
) -> dict[str, Any]:
    """A backup's header line: the thread's state apart from its messages; an owned thread's
    title and metadata (`info`) when either is set."""
    head = {
        "kvstore_backup": BACKUP_FORMAT,
        "thread": thread_id,
        "messages": messages,
        "last_seq": state.last_seq,
        "summary_last": state.summary_last,
        "summary_seq": state.summary_seq,
        "deleted_before": state.deleted_before,
        "turn": {"id": state.turn_id, "seq": state.turn_seq, "outcome": state.turn_outcome}
        if state.turn_id
        else None,
        "turns": [
            {
                "id": t.turn_id,
                "start": t.start,
                "outcome": t.outcome,
                "replies": t.replies,
                "first": t.first,
                "count": t.count,
                "first_seq": t.first_seq,
                "last_seq": t.last_seq,
            }
            for t in state.turns
        ],
        # The system prompt retention kept aside (docs/HISTORY.md): its messages as message
        # lines are written, below deleted_before.
        "prompt": {
            "state": state.prompt_state,
            "messages": [entry(i.message.to_dict(), None, i.tokens) for i in state.prompt],
        }
        if state.prompt_state
        else None,
    }
    if info is not None and (info.title is not None or info.metadata):
        carried: dict[str, Any] = {"metadata": info.metadata}
        if info.title is not None:
            carried["title"] = info.title
        head["info"] = carried
    return head


# The header's `info`: {"title": "...", "metadata": {"key": "value"}}, either key optional.
INFO_KEYS = frozenset(("title", "metadata"))


def header_info(head: dict[str, Any]) -> tuple[str | None, dict[str, str]] | None:
    """The title (None: not set) and metadata a backup's header carries, checked as set_info
    checks them (InvalidMessage, before the restore writes anything); None when it has none."""
    info = head.get("info")
    if info is None:
        return None
    try:
        if not isinstance(info, dict) or not info.keys() <= INFO_KEYS:
            raise errors.InvalidMessage(
                f"it is {{'title': ..., 'metadata': {{...}}}}, not {info!r:.80}"
            )
        title = info.get("title")
        if title is not None:
            check_title(title)
        metadata = info.get("metadata") or {}
        check_metadata(metadata)
    except errors.InvalidMessage as exc:
        raise errors.InvalidMessage(f"line 1: the backup's info is not a thread's: {exc}") from None
    return title, dict(metadata)


def _prompt_item(body: object, form: int) -> admin.BackedUpMessage:
    """A kept prompt's message of a backup's header (as `form` writes a message line; never of
    a turn)."""
    fields, _, tokens = read_entry(body, form)
    message = parse_message(fields)
    if message.seq_id is None:
        raise ValueError("a kept prompt's message must have its seq_id")
    if message.id is not None:
        check_token("message id", message.id)
    return admin.BackedUpMessage(message.seq_id, None, message, tokens)


def check_whole(
    head: dict[str, Any],
    messages: int,
    end: tuple[int, Any] | None,
    checksum: str,
    allow_untrailed: bool,
) -> None:
    """Refuses (BackupIncomplete) a backup that does not prove it is whole, before the restore's
    last step: its end line's count and checksum must be the file's."""
    unfinished = "; the restore is not finished (the thread refuses writes until the whole backup is imported)"
    if end is None:
        if not allow_untrailed:
            raise errors.BackupIncomplete(
                f"the backup has no end line after its {messages} message lines: it may be cut short{unfinished}."
                " A backup written before end lines existed is imported with --allow-untrailed"
            )
        if head.get("messages") != messages:
            raise errors.BackupIncomplete(
                f"the backup has no end line and {messages} message lines where its header counts"
                f" {head.get('messages')!r}: it is cut short{unfinished}"
            )
        return
    number, body = end
    if body.get(BACKUP_END) != head["kvstore_backup"]:
        raise errors.InvalidMessage(
            f"line {number}: backup end line format {body.get(BACKUP_END)!r} is not the"
            f" header's ({head['kvstore_backup']!r})"
        )
    if body.get("messages") != messages:
        raise errors.BackupIncomplete(
            f"line {number}: the backup's end line counts {body.get('messages')!r} message lines, the file has"
            f" {messages} message lines{unfinished}"
        )
    if body.get("sha256") != checksum:
        raise errors.BackupIncomplete(
            f"line {number}: the backup's lines do not match its end line's checksum{unfinished}"
        )


def header_state(head: dict[str, Any]) -> admin.BackupState:
    """The state a backup's header records, every field checked here as restore_state and
    lua/restore_state.lua check it, and for consistency: restore_state sends it after every
    message is in, and a value it refuses must not stop the restore there, unfinishable."""

    def number(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEQUENCE:
            raise ValueError(f"{value!r:.80} is not a sequence or count (an int from 0 to 2**50)")
        return value

    def text(value: object) -> str:
        if not isinstance(value, str):
            raise ValueError(f"{value!r:.80} is not a string")
        return value

    def turn_id(value: object) -> str:
        check_token("turn id", text(value))  # as start_turn takes it
        return text(value)

    def outcome(value: object) -> str:
        if value not in OUTCOMES:
            raise ValueError(f"{value!r:.80} is not a turn outcome")
        return text(value)

    try:
        turn = head.get("turn") or {}
        state = admin.BackupState(
            last_seq=number(head["last_seq"]),
            summary_last=number(head.get("summary_last") or 0),
            summary_seq=number(head.get("summary_seq") or 0),
            deleted_before=number(head.get("deleted_before") or 0),
            turn_id=turn_id(turn["id"]) if turn else "",
            turn_seq=number(turn.get("seq") or 0),
            turn_outcome=outcome(turn["outcome"]) if turn else "",
            turns=[
                admin.TurnRecord(
                    turn_id(t["id"]),
                    number(t["start"]),
                    outcome(t["outcome"]),
                    number(t["replies"]),
                    number(t["first"]),
                    number(t["count"]),
                    number(t["first_seq"]),
                    number(t["last_seq"]),
                )
                for t in head.get("turns", [])
            ],
            prompt=[
                _prompt_item(m, head["kvstore_backup"])
                for m in (head.get("prompt") or {}).get("messages", [])
            ],
            prompt_state=text((head.get("prompt") or {}).get("state", "")),
        )
        _check_consistent(state)
        return state
    except (KeyError, TypeError, AttributeError, ValueError, errors.InvalidMessage) as exc:
        raise errors.InvalidMessage(
            f"line 1: the backup's header is not one export wrote ({exc!r:.300})"
        ) from None


def _check_consistent(state: admin.BackupState) -> None:
    """A header no thread could have had refused (ValueError): every sequence it names at most
    its last (a restore past it would serve none of its messages), the kept prompt as
    restore_state takes it."""
    last = state.last_seq
    beyond = [
        ("summary_last", state.summary_last, last),
        ("summary_seq", state.summary_seq, last),
        ("deleted_before", state.deleted_before, last + 1),  # everything deleted
        ("the turn's seq", state.turn_seq if state.turn_id else 0, last + 1),  # no reply yet
    ]
    for t in state.turns:
        beyond += [
            (f"turn {t.turn_id!r:.80}'s start", t.start, last + 1),
            (f"turn {t.turn_id!r:.80}'s first", t.first, last + 1),
            (f"turn {t.turn_id!r:.80}'s first_seq", t.first_seq, last),
            (f"turn {t.turn_id!r:.80}'s last_seq", t.last_seq, last),
        ]
    for what, value, most in beyond:
        if value > most:
            raise ValueError(f"{what} {value} is past the backup's last_seq {last}")
    state.check_prompt()  # as restore_state refuses it


def numbered_lines(lines: Iterable[str], progress: Any) -> Iterator[tuple[int, str]]:
    """The non-empty lines with their numbers (`progress.lines`: the last line's); a line that
    is not UTF-8 text refused. A file opened strictly fails decoding (maybe a few lines ahead:
    it decodes in blocks); standard input on a C locale hands its bytes over as lone
    surrogates."""
    source = iter(lines)
    number = 0
    while True:
        try:
            line = next(source, None)
        except UnicodeDecodeError as exc:
            raise _not_utf8(number + 1, exc.reason) from None
        if line is None:
            return
        number += 1
        progress.lines = number
        if not line.isascii():
            try:
                line.encode("utf-8")
            except UnicodeEncodeError:
                raise _not_utf8(number, _undecoded(line)) from None
        if line.strip():
            yield number, line


def _undecoded(line: str) -> str:
    """Why the bytes standard input escaped into `line` are not UTF-8."""
    try:
        line.encode("utf-8", "surrogateescape").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError) as exc:
        return str(exc.reason)
    return "invalid text"


def _not_utf8(number: int, reason: str) -> errors.InvalidMessage:
    if reason == "unexpected end of data":  # only the file's last bytes can end a character early
        return errors.BackupIncomplete(
            f"line {number}: the file ends inside a character: it is cut short; import the whole"
            " file (a restore stays unfinished until then)"
        )
    return errors.InvalidMessage(f"line {number}: the file is not UTF-8 text ({reason})")
