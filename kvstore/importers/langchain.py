"""LangChain's message JSON: its records read into kvstore messages, and kvstore messages
written back out (``to_langchain``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ..convert import SUMMARY_PREFIX
from ..messages import (
    ApprovalRequestMessage,
    ApprovalResponseMessage,
    AssistantMessage,
    Base64Image,
    BaseMessage,
    EventMessage,
    HiddenReasoningMessage,
    ImageContent,
    Message,
    ReasoningMessage,
    SummaryMessage,
    SystemMessage,
    TextContent,
    ToolCall,
    ToolCallMessage,
    ToolReturnMessage,
    URLImage,
    UserMessage,
)
from .records import joined_fields

# What messages_from_dict fills in when a field is absent: a field at its default is not kept.
_LANGCHAIN_DEFAULTS: dict[str, Any] = {
    "additional_kwargs": {},
    "response_metadata": {},
    "name": None,
    "id": None,
    "example": False,
    "tool_calls": [],
    "invalid_tool_calls": [],
    "usage_metadata": None,
    "artifact": None,
    "status": "success",
    "tool_call_chunks": [],
    "chunk_position": None,
}
_MISSING = object()
_CORE_TYPES = ("human", "ai", "system", "tool")
_CHUNK_TYPES = {
    "AIMessageChunk": "ai",
    "HumanMessageChunk": "human",
    "SystemMessageChunk": "system",
    "ToolMessageChunk": "tool",
}
_CHAT_ROLES = {"user": "human", "human": "human", "assistant": "ai", "ai": "ai", "system": "system"}


def _from_langchain(record: Any) -> tuple[list[Message], dict[str, Any]]:
    """The kvstore messages of one LangChain record, and the source fields they do not carry:
    every field that their export (:func:`to_langchain`) would not give back as it was."""
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("type"), str)
        or not isinstance(record.get("data"), dict)
    ):
        raise ValueError("not a LangChain message record ({'type': ..., 'data': {...}})")
    kind, data = record["type"], record["data"]
    base = _CHUNK_TYPES.get(kind, kind)
    if base == "chat":
        base = _CHAT_ROLES.get(data.get("role"), "human")
    elif base == "function":
        base = "tool"
    elif base not in _CORE_TYPES:  # remove, or a type of a later LangChain: kept whole
        messages: list[Message] = [SystemMessage(content=_lc_text(data.get("content", "")))]
        return messages, {"type": kind, "data": data}
    messages = _lc_messages(base, data)
    if base == "human" and kind == "chat":
        messages[0].name = (
            data.get("role") if data.get("role") not in _CHAT_ROLES else data.get("name")
        )
    if kind in ("chat", "function"):
        return messages, {
            "type": kind,
            "data": data,
        }  # kept whole: their fields differ from the core types'
    rebuilt = _lc_data(messages)
    fields = {
        name: value
        for name, value in data.items()
        if name != "type" and rebuilt.get(name, _LANGCHAIN_DEFAULTS.get(name, _MISSING)) != value
    }
    if kind != base:
        fields["type"] = kind
    return messages, fields


def _lc_messages(base: str, data: dict[str, Any]) -> list[Message]:
    content = data.get("content", "")
    name = {"name": data["name"]} if isinstance(data.get("name"), str) else {}
    if base == "human":
        return [UserMessage(content=_lc_user_content(content), **name)]
    if base == "system":
        return [SystemMessage(content=_lc_text(content), **name)]
    if base == "tool":
        status = data.get("status") if data.get("status") in ("success", "error") else "success"
        return [
            ToolReturnMessage(
                status=status,
                tool_call_id=data.get("tool_call_id") or "",
                tool_return=_lc_text(content),
                **name,
            )
        ]
    made: list[Message] = []
    calls = [call for call in data.get("tool_calls") or [] if isinstance(call, dict)]
    if content not in ("", []) or not calls:
        made.append(AssistantMessage(content=_lc_assistant_content(content), **name))
    for call in calls:
        arguments = call.get("args")
        made.append(
            ToolCallMessage(
                tool_call=ToolCall(
                    name=str(call.get("name") or ""),
                    tool_call_id=str(call.get("id") or ""),
                    arguments=json.dumps(arguments, ensure_ascii=False, allow_nan=False)
                    if isinstance(arguments, dict)
                    else "{}",
                ),
                **name,
            )
        )
    return made


def _lc_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part
            if isinstance(part, str)
            else str(part.get("text", ""))
            if isinstance(part, dict) and part.get("type") == "text"
            else ""
            for part in content
        )
    return ""


def _lc_assistant_content(content: Any) -> str | list[TextContent]:
    if isinstance(content, str):
        return content
    return [
        TextContent(text=part if isinstance(part, str) else str(part.get("text", "")))
        for part in content or []
        if isinstance(part, str) or (isinstance(part, dict) and part.get("type") == "text")
    ]


def _lc_user_content(content: Any) -> str | list[Any]:
    if isinstance(content, str):
        return content
    parts: list[Any] = []
    for part in content or []:
        if isinstance(part, str):
            parts.append(TextContent(text=part))
        elif isinstance(part, dict) and part.get("type") == "text":
            parts.append(TextContent(text=str(part.get("text", ""))))
        elif isinstance(part, dict) and (image := _lc_image(part)) is not None:
            parts.append(image)
        # anything else is kept with the source fields (the whole content differs)
    return parts


def _lc_image(part: dict[str, Any]) -> ImageContent | None:
    """An image part in OpenAI's shape (image_url) or LangChain's standard one (type image)."""
    from ..convert_in import _image_source

    if part.get("type") == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        detail = image.get("detail") if isinstance(image, dict) else None
        if isinstance(url, str):
            return ImageContent(source=_image_source(url, detail))
    if part.get("type") == "image":
        if isinstance(part.get("url"), str):
            return ImageContent(source=URLImage(url=part["url"]))
        data = part.get("base64") or (
            part.get("data") if part.get("source_type") == "base64" else None
        )
        if isinstance(data, str):
            return ImageContent(
                source=Base64Image(data=data, media_type=part.get("mime_type") or "image/png")
            )
    return None


def _lc_data(messages: list[Message]) -> dict[str, Any]:
    """The LangChain `data` a group of kvstore messages makes (the core types' fields): its
    first message's type is the group's (human, system, tool; else ai)."""
    first = messages[0]
    data: dict[str, Any] = {}
    if first.name:
        data["name"] = first.name
    if isinstance(first, UserMessage):
        data["content"] = _lc_content(first.content)
    elif isinstance(first, SystemMessage):
        data["content"] = first.content
    elif isinstance(first, SummaryMessage):
        data["content"] = SUMMARY_PREFIX + first.summary
    elif isinstance(first, ToolReturnMessage):
        data.update(content=first.tool_return, tool_call_id=first.tool_call_id, status=first.status)
    else:
        text = next((m.content for m in messages if isinstance(m, AssistantMessage)), "")
        data["content"] = (
            text if isinstance(text, str) else [{"type": "text", "text": p.text} for p in text]
        )
        data["tool_calls"] = [
            {
                "name": call.name,
                "args": _arguments(call.arguments),
                "id": call.tool_call_id,
                "type": "tool_call",
            }
            for message in messages
            if isinstance(message, ToolCallMessage)
            for call in _calls(message)
        ]
    return data


def _lc_content(content: str | list[Any]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, TextContent):
            parts.append({"type": "text", "text": part.text})
        else:
            source = part.source
            if isinstance(source, URLImage):
                url = source.url
            elif source.data is not None:
                url = f"data:{source.media_type};base64,{source.data}"
            else:
                url = f"file:{source.file_id}"
            image = {"url": url}
            if getattr(source, "detail", None):
                image["detail"] = source.detail
            parts.append({"type": "image_url", "image_url": image})
    return parts


def _arguments(text: str) -> Any:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {"arguments": text}
    return value if isinstance(value, dict) else {"arguments": value}


def _calls(message: ToolCallMessage) -> list[ToolCall]:
    calls = message.tool_calls if isinstance(message.tool_calls, list) else [message.tool_call]
    return [call for call in calls if isinstance(call, ToolCall)]


_LC_LEFT_OUT = (
    ReasoningMessage,
    HiddenReasoningMessage,
    EventMessage,
    ApprovalRequestMessage,
    ApprovalResponseMessage,
)


def langchain_left_out(messages: Iterable[Message]) -> int:
    """How many of ``messages`` :func:`to_langchain` leaves out (no LangChain type)."""
    return sum(isinstance(message, _LC_LEFT_OUT) for message in messages)


def to_langchain(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """The messages in LangChain's message JSON (what ``messages_to_dict`` writes), oldest first:
    ``messages_from_dict`` of the result gives LangChain messages. Imported messages get back
    every field they had; see the module docstring for the rest.

    Example::

        from langchain_core.messages import messages_from_dict
        history = messages_from_dict(to_langchain(thread.iter()))
    """
    out: list[dict[str, Any]] = []
    group: list[Message] = []

    def flush() -> None:
        if group:
            out.append(_lc_record(group))
            group.clear()

    for message in messages:
        if isinstance(message, _LC_LEFT_OUT):
            continue
        origin = _origin(message)
        if origin is None and isinstance(message, ToolReturnMessage) and message.tool_returns:
            flush()  # several tools' returns in one message: a LangChain tool message each
            out.extend(
                {
                    "type": "tool",
                    "data": {
                        "type": "tool",
                        "tool_call_id": item.tool_call_id,
                        "status": item.status,
                        "content": item.tool_return
                        if isinstance(item.tool_return, str)
                        else _lc_content(item.tool_return),
                    },
                }
                for item in message.tool_returns
            )
            continue
        if group:
            previous = group[-1]
            same_source = origin is not None and origin == _origin(previous)
            same_step = (
                origin is None
                and _origin(previous) is None
                and isinstance(message, ToolCallMessage)
                and isinstance(previous, (AssistantMessage, ToolCallMessage))
                and (
                    previous.step_id is None
                    or message.step_id is None
                    or previous.step_id == message.step_id
                )
            )
            if not (same_source or same_step):
                flush()
        group.append(message)
    flush()
    return out


def _origin(message: BaseMessage) -> tuple[str, str] | None:
    metadata = message.metadata or {}
    if metadata.get("source") == "langchain" and "source_position" in metadata:
        return metadata["source"], metadata["source_position"]
    return None


def _lc_record(group: list[Message]) -> dict[str, Any]:
    first = group[0]
    if isinstance(first, UserMessage):
        base = "human"
    elif isinstance(first, (SystemMessage, SummaryMessage)):
        base = "system"
    elif isinstance(first, ToolReturnMessage):
        base = "tool"
    else:
        base = "ai"
    fields = joined_fields(first.metadata) if _origin(first) else {}
    if "data" in fields:  # a type kept whole
        return {"type": fields["type"], "data": fields["data"]}
    data = _lc_data(group)
    kind = fields.pop("type", base)
    data.update(fields)
    data["type"] = kind
    return {"type": kind, "data": data}


# --- LlamaIndex -------------------------------------------------------------------------------
