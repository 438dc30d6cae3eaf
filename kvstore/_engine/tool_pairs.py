"""Tool-call pairs, so that a history handed to a model never holds half of one.

A message *opens* ids: a tool call message its calls' ``tool_call_id``\\ s; an approval request
those too (the approved call's return answers them) and its own message id (which an approval
response names as ``approval_request_id``). A message *answers* ids: a tool return message its
``tool_call_id`` and each of its ``tool_returns``; an approval response its
``approval_request_id`` and each item of ``approvals``.

In a list given to a model, an answer whose ids were not all opened before it is an orphan: a
tool result whose call was cut away. Model APIs refuse such input. A call whose answer has not
come yet is not an orphan: it is the newest step of a turn still running.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..messages import (
    ApprovalRequestMessage,
    ApprovalResponseMessage,
    ApprovalReturn,
    Message,
    ToolCallMessage,
    ToolReturnMessage,
)

# The messages read on either side of a boundary (a summary's, a compaction's) to find the calls
# the answers after it need: a call and its answer are a few messages apart, not hundreds.
PAIR_LOOKBACK = 50

# The message types that open or answer ids (opened_ids, answered_ids).
_PAIRED = (ToolCallMessage, ApprovalRequestMessage, ToolReturnMessage, ApprovalResponseMessage)
_PAIRED_KINDS = frozenset(("tool_call_message", "tool_return_message"))  # of a plain dict


def opened_ids(message: Message | dict[str, Any]) -> tuple[str, ...]:
    """The ids later messages may answer (of a message, or of its stored dict: _dict_ids)."""
    if type(message) is dict:
        return _dict_ids(message)[0]
    if not isinstance(message, (ToolCallMessage, ApprovalRequestMessage)):
        return ()
    ids = [message.tool_call.tool_call_id]
    if isinstance(message.tool_calls, list):
        ids += [call.tool_call_id for call in message.tool_calls]
    if isinstance(message, ApprovalRequestMessage):
        ids.append(message.id)
    return tuple(
        i for i in ids if i is not None
    )  # an empty id is an id: only an exact match answers it


def answered_ids(message: Message | dict[str, Any]) -> tuple[str, ...]:
    """The ids this message answers: each must be opened by an earlier message."""
    ids: list[str | None]
    if type(message) is dict:
        return _dict_ids(message)[1]
    if isinstance(message, ToolReturnMessage):
        ids = [message.tool_call_id, *(item.tool_call_id for item in message.tool_returns or ())]
    elif isinstance(message, ApprovalResponseMessage):
        ids = [
            message.approval_request_id,
            *(item.tool_call_id for item in message.approvals or ()),
        ]
    else:
        return ()
    return tuple(i for i in ids if i is not None)


def _dict_ids(message: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What a stored message dict opens and answers. Reads hand out dicts only where validation
    would keep them as they are (record_dicts.plain_body): a tool call's ids are strs there, a
    tool return has no `tool_returns`, approvals are always models; the rest pair nothing."""
    kind = message.get("message_type")
    if kind == "tool_call_message":
        calls = [message["tool_call"], *(message.get("tool_calls") or ())]
        return tuple(call["tool_call_id"] for call in calls), ()
    if kind == "tool_return_message":
        return (), (message["tool_call_id"],)
    return (), ()


def pair_ids(message: Message) -> tuple[list[str], list[str]]:
    """What `message` opens and answers, as strict history checks track them (docs/HISTORY.md,
    "Checked updates"): ``c:<id>`` a tool call, ``p:<id>`` the approval of a tool call,
    ``a:<id>`` an approval request message (its pair ids). Each once, in the message's order."""
    opens: list[str] = []
    answers: list[str] = []
    if isinstance(message, (ToolCallMessage, ApprovalRequestMessage)):
        calls = [message.tool_call.tool_call_id]
        if isinstance(message.tool_calls, list):
            calls += [call.tool_call_id for call in message.tool_calls]
        for call in (c for c in calls if c is not None):
            opens.append(f"c:{call}")
            if isinstance(message, ApprovalRequestMessage):
                opens.append(f"p:{call}")
        if isinstance(message, ApprovalRequestMessage) and message.id is not None:
            opens.append(f"a:{message.id}")
    elif isinstance(message, ToolReturnMessage):
        calls = [message.tool_call_id, *(item.tool_call_id for item in message.tool_returns or ())]
        answers += [f"c:{call}" for call in calls if call is not None]
    elif isinstance(message, ApprovalResponseMessage):
        if message.approval_request_id is not None:
            answers.append(f"a:{message.approval_request_id}")
        for item in message.approvals or ():
            answers.append(f"p:{item.tool_call_id}")
            if not isinstance(item, ApprovalReturn):  # a tool's result given with the approval
                answers.append(f"c:{item.tool_call_id}")
    return list(dict.fromkeys(opens)), list(dict.fromkeys(answers))


def history_pairs(message: Message) -> str:
    """The pairs argument lua/includes/history.lua reads: ``-<length>:<pair id>`` per answer, then
    ``+<length>:<pair id>`` per one it opens (lengths in bytes: Lua counts bytes)."""
    opens, answers = pair_ids(message)
    parts = []
    for op, ids in (("-", answers), ("+", opens)):
        for pair_id in ids:
            parts.append(f"{op}{len(pair_id.encode())}:{pair_id}")
    return "".join(parts)


def batch_pairs(messages: list[Message]) -> str:
    """append's pairs argument: ``<length>;<pairs>`` per message, or '' when none has any."""
    each = [history_pairs(message) for message in messages]
    if not any(each):
        return ""
    return "".join(f"{len(spec.encode())};{spec}" for spec in each)


def orphans(messages: Iterable[Any], opened: Iterable[str] = ()) -> list[Any]:
    """The answers in `messages` (in order) whose ids no earlier message there, nor `opened`,
    opens."""
    seen = set(opened)
    found: list[Any] = []
    for message in messages:
        # Most messages neither open nor answer: one check passes them by.
        if type(message) is dict:
            if message.get("message_type") not in _PAIRED_KINDS:
                continue
        elif not isinstance(message, _PAIRED):
            continue
        if any(i not in seen for i in answered_ids(message)):
            found.append(message)
        seen.update(opened_ids(message))
    return found


def without_orphans(messages: list[Any]) -> list[Any]:
    """`messages` with every orphaned answer left out."""
    dropped = {id(m) for m in orphans(messages)}
    return [m for m in messages if id(m) not in dropped] if dropped else messages
