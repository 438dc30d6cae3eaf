"""The OpenAI Agents SDK's Responses input items as kvstore messages, both ways.

Each item is one kvstore message of the type that means the same (a user, system, assistant,
tool-call, tool-return or reasoning message), carrying the item itself in its ``openai_item``
field, so it comes back equal and no item type is ever dropped; a string ``content`` is stored
once, in the message. The SDK's session adapter (kvstore.integrations.openai_agents) and the
import of its ``RedisSession`` (one JSON list per session, ``<prefix>:<session>:messages``, oldest
first) both use it, so a session imported reads back through the adapter as the SDK stored it.
"""

from __future__ import annotations

from typing import Any

from ..convert import to_responses_input
from ..messages import (
    AssistantMessage,
    HiddenReasoningMessage,
    Message,
    ReasoningMessage,
    SystemMessage,
    ToolCall,
    ToolCallMessage,
    ToolReturnMessage,
    UserMessage,
)

ITEM_FIELD = "openai_item"
"""The message field that holds the Responses item as the SDK gave it."""

POPPED_FIELD = "openai_popped"
"""The field of a message the adapter's ``pop_item`` retracted: reads skip it."""

SESSION_KEY_PREFIX = "agents:session"
"""The SDK's ``RedisSession`` default ``key_prefix``."""
MESSAGES_SUFFIX = ":messages"
"""A ``RedisSession``'s items are the list at ``<key_prefix>:<session_id>:messages``."""


def item_message(item: Any, otid: str | None = None) -> Message:
    """The kvstore message an item means, carrying the item (its string content once)."""
    if not isinstance(item, dict):
        raise ValueError(f"a Responses input item is a JSON object, not {type(item).__name__}")
    kept = dict(item)
    kind = item.get("type", "message" if "role" in item else None)
    message: Message
    if kind == "message":
        content = item.get("content")
        text = content if isinstance(content, str) else _text(content)
        if isinstance(content, str) and "role" in item:
            # Held once, by the message (message_item gives it back to an item with a role).
            del kept["content"]
        message = _said(item.get("role"), text)
    elif kind == "function_call":
        call = ToolCall(
            name=str(item.get("name", "")),
            arguments=str(item.get("arguments", "")),
            tool_call_id=str(item.get("call_id", "")),
        )
        message = ToolCallMessage(tool_call=call)
    elif kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else _text(output)
        message = ToolReturnMessage(
            status="success", tool_call_id=str(item.get("call_id", "")), tool_return=text
        )
    elif kind == "reasoning":
        message = ReasoningMessage(reasoning=_text(item.get("summary")))
    else:
        # Any other item (hosted tools, computer calls, references, ...) is kept as it was.
        message = HiddenReasoningMessage(state="omitted", hidden_reasoning=str(kind))
    message.otid = otid
    setattr(message, ITEM_FIELD, kept)
    return message


def _said(role: Any, text: str) -> Message:
    if role == "user":
        return UserMessage(content=text)
    if role == "assistant":
        return AssistantMessage(content=text)
    return SystemMessage(content=text)


def _text(parts: Any) -> str:
    if not isinstance(parts, list):
        return "" if parts is None else str(parts)
    texts = [p.get("text") for p in parts if isinstance(p, dict)]
    return "\n".join(t for t in texts if isinstance(t, str))


def message_item(message: Message) -> Any:
    """The Responses item a message holds (or, written by other kvstore code, its Responses
    form; None for a message that has none)."""
    extra = message.__pydantic_extra__ or {}
    kept = extra.get(ITEM_FIELD)
    if not isinstance(kept, dict):
        # Written by other kvstore code (a summary, an import): its Responses form.
        converted = to_responses_input([message])
        return converted[0] if converted else None
    if "content" not in kept and kept.get("type", "message") == "message" and "role" in kept:
        return {**kept, "content": getattr(message, "content", "")}
    return dict(kept)


def dict_item(message: dict[str, Any]) -> tuple[bool, Any]:
    """:func:`message_item` of a stored message's dict, without building the message: (True,
    the item) when the dict holds its item as the adapter stores it (the same item
    :func:`message_item` gives its model), else (False, None): convert the model then."""
    kept = message.get(ITEM_FIELD)
    if type(kept) is not dict:
        return False, None
    if "content" not in kept and kept.get("type", "message") == "message" and "role" in kept:
        content = message.get("content", "")
        if type(content) is not str:
            return False, None  # parts: message_item hands the model's parts
        return True, {**kept, "content": content}
    return True, kept  # a fresh dict of the record: nothing else holds it


def _from_openai_agents(record: Any) -> tuple[list[Message], dict[str, Any]]:
    """The kvstore message of one stored item (the import's form: no field left over, the item
    is the message's ``openai_item``)."""
    return [item_message(record)], {}


def session_id_of(key: str, key_prefix: str = SESSION_KEY_PREFIX) -> str:
    """The session id of a ``RedisSession`` items key (the key itself if it is not one)."""
    head = f"{key_prefix}:"
    if key.startswith(head) and key.endswith(MESSAGES_SUFFIX):
        session = key[len(head) : -len(MESSAGES_SUFFIX)]
        if session:
            return session
    return key
