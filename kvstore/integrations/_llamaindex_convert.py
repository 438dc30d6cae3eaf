"""LlamaIndex ChatMessage dicts and kvstore messages, one for one, both ways.

One ChatMessage is one kvstore message, so a chat store's positions are the thread's: text and
images are stored natively, a tool-calling step as a tool_call_message (its text in a
``content`` field), and what has no kvstore field (``additional_kwargs``, another role's name,
other blocks, how several text blocks split) in the message's metadata as the importers keep it
(kvstore/importers/records.py: ``split_fields``)."""

from __future__ import annotations

import json
from typing import Any

from ..importers.llamaindex import _LLAMA_ROLES, _llama_image
from ..importers.openai_agents import POPPED_FIELD
from ..importers.records import joined_fields, split_fields
from ..messages import (
    AssistantMessage,
    Base64Image,
    HiddenReasoningMessage,
    ImageContent,
    Message,
    SystemMessage,
    TextContent,
    ToolCall,
    ToolCallMessage,
    ToolReturnMessage,
    URLImage,
    UserMessage,
)

DELETED = "llamaindex_deleted"
"""The metadata key of a message delete_message retracted: reads leave it out."""

NATIVE_CALLS = "native_tool_calls"
"""The kept field saying a tool call message's ``additional_kwargs["tool_calls"]`` is its
native calls (kept once there, beside the other kwargs kept)."""

TEXTS = "texts"
"""The kept field giving the lengths of the text blocks joined (by newlines) in the text of a
system, tool or tool call message, when reading that text back as one block would not give them
(several blocks, none, or a tool call step's empty one)."""

_ROLE_OF = {
    "system_message": "system",
    "user_message": "user",
    "assistant_message": "assistant",
    "tool_call_message": "assistant",
    "tool_return_message": "tool",
    "reasoning_message": "assistant",
    "summary_message": "system",
}


def tombstone() -> HiddenReasoningMessage:
    """What a deleted message is replaced by (same id and sequence; reads skip it): a hidden
    reasoning step, which kvstore's converters and the other adapters leave out too, as the
    Agents session's retraction is. (Tombstones written before were empty assistant messages
    with the same mark: this store still skips them.)"""
    return HiddenReasoningMessage(state="omitted", metadata={DELETED: "1"})


def _retracted(message: Any) -> bool:
    """Whether the Agents session's pop_item retracted this stored message (its model's extra
    field, or its dict's key)."""
    if isinstance(message, dict):
        return bool(message.get(POPPED_FIELD))
    return bool((message.__pydantic_extra__ or {}).get(POPPED_FIELD))


def to_kvstore(record: dict[str, Any], key: str = "", text_field: bool = True) -> Message:
    """The kvstore message of one ChatMessage (``ChatMessage.model_dump(mode="json")``).

    A tool-calling step's text is held by a ``content`` field of the tool_call_message, which
    kvstore keeps as an unknown field; `text_field` False (a store refusing unknown fields)
    keeps its blocks in the metadata instead."""
    role = str(record.get("role"))
    kind = _LLAMA_ROLES.get(role, "user")
    kwargs = record.get("additional_kwargs") or {}
    blocks = record.get("blocks") or []
    parts: list[TextContent | ImageContent] = []
    kept: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        native = _native_part(block, kind)
        if native is None:
            kept.append({"index": index, "block": block})  # as the importer keeps them
        else:
            parts.append(native)
    fields: dict[str, Any] = {}
    if kind != role:
        fields["role"] = role
    calls = _tool_calls(kwargs) if kind == "assistant" else []
    if calls and kwargs.get("tool_calls") == _call_dicts(calls):
        # The stored calls give these back as they are: kept once, in the native fields (so
        # long arguments do not count against the metadata's bound).
        kwargs = {name: value for name, value in kwargs.items() if name != "tool_calls"}
        if kwargs:
            fields[NATIVE_CALLS] = True
    if kwargs:
        fields["additional_kwargs"] = kwargs
    texts = [part.text for part in parts if isinstance(part, TextContent)]
    text = "\n".join(texts)
    if calls and not text_field:  # the store refuses unknown fields: no field for the text
        fields["all_blocks"] = blocks
    elif calls or kind in ("system", "tool"):
        # The text is in the message's own field (joined by newlines); what it is split into,
        # when reading it back as one block would not give the blocks, is kept as the lengths.
        if texts != ([text] if text or not calls else []):
            fields[TEXTS] = [len(part) for part in texts]
        if kept:
            fields["blocks"] = kept
    elif kept:
        fields["blocks"] = kept
    meta = split_fields(fields, key, 0) if fields else None
    if kind == "system":
        return SystemMessage(content=text, metadata=meta)
    if kind == "tool":
        call_id = str(kwargs.get("tool_call_id") or "")
        return ToolReturnMessage(
            status="success", tool_call_id=call_id, tool_return=text, metadata=meta
        )
    if calls:
        many = calls if len(calls) > 1 else None
        said: dict[str, Any] = {"content": text} if text and text_field else {}
        return ToolCallMessage(tool_call=calls[0], tool_calls=many, metadata=meta, **said)
    if kind == "user":
        content: Any = texts[0] if len(parts) == 1 and texts else parts
        return UserMessage(content=content, metadata=meta)
    content = texts[0] if len(parts) == 1 and texts else parts
    return AssistantMessage(content=content, metadata=meta)


def _native_part(block: Any, kind: str) -> TextContent | ImageContent | None:
    """A block as a content part when reading it back gives the same block, else None."""
    if not isinstance(block, dict):
        return None
    if block.get("block_type") == "text" and set(block) == {"block_type", "text"}:
        return TextContent(text=str(block["text"]))
    if block.get("block_type") == "image" and kind == "user":
        image = _llama_image(block)
        if image is not None and _image_block(image) == block:
            return image
    return None


def _tool_calls(kwargs: dict[str, Any]) -> list[ToolCall]:
    calls = []
    for call in kwargs.get("tool_calls") or []:
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        calls.append(
            ToolCall(
                name=str(function.get("name") or ""),
                tool_call_id=str(call.get("id") or "") if isinstance(call, dict) else "",
                arguments=str(function.get("arguments") or "{}"),
            )
        )
    return calls


def _call_dicts(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """``additional_kwargs["tool_calls"]`` as a read of the stored calls gives it back."""
    return [
        {
            "id": call.tool_call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for call in calls
    ]


def _image_block(image: ImageContent) -> dict[str, Any]:
    source = image.source
    if isinstance(source, Base64Image):
        image_b64, url, mime, detail = source.data, None, source.media_type, source.detail
    else:
        image_b64, url, mime, detail = None, getattr(source, "url", None), None, None
    return {
        "block_type": "image",
        "image": image_b64,
        "path": None,
        "url": url,
        "image_mimetype": mime,
        "detail": detail,
    }


def to_chat(message: Message) -> dict[str, Any] | None:
    """The ChatMessage dict of a stored message (None for a deleted one): the fields kept in
    its metadata first, then its native fields."""
    metadata = getattr(message, "metadata", None)
    if (metadata and DELETED in metadata) or _retracted(message):
        return None
    fields = joined_fields(metadata)
    kind = message.message_type
    role = fields.get("role") or _ROLE_OF.get(kind, "assistant")
    kwargs = fields.get("additional_kwargs") or {}
    if not kwargs or fields.get(NATIVE_CALLS) or metadata.get("source") == "llamaindex":  # type: ignore[union-attr]
        # Only what the native fields do not hold was kept (tool calls, their ids and the name
        # are native there).
        kwargs = {**_native_kwargs(message), **kwargs}
    if "all_blocks" in fields:  # as this adapter kept blocks before TEXTS
        blocks = fields["all_blocks"]
    else:
        lengths = fields.get(TEXTS)
        blocks = _native_blocks(message) if lengths is None else _split(message, lengths)
        for kept in fields.get("blocks") or []:
            blocks.insert(kept["index"], kept["block"])
    return {"role": role, "additional_kwargs": kwargs, "blocks": blocks}


# The types whose ChatMessage chat_dict makes from a stored dict: a string content is one block.
_PLAIN_ROLES = {
    "user_message": "user",
    "assistant_message": "assistant",
    "system_message": "system",
}


def chat_dict(message: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
    """:func:`to_chat` of a stored message's dict, without building the message: (True, the
    ChatMessage dict, or None for a deleted message) for a user, assistant or system message
    with a string content and no fields kept in its metadata, else (False, None)."""
    metadata = message.get("metadata")
    if (metadata and DELETED in metadata) or _retracted(message):
        return True, None
    role = _PLAIN_ROLES.get(message.get("message_type"))  # type: ignore[arg-type]  # any value
    content = message.get("content")
    if role is None or type(content) is not str or (metadata and "source_fields" in metadata):
        return False, None
    name = message.get("name")
    kwargs = {"name": name} if name else {}
    return True, {"role": role, "additional_kwargs": kwargs, "blocks": [_text_block(content)]}


def _text_block(text: str) -> dict[str, Any]:
    return {"block_type": "text", "text": text}


def _native_kwargs(message: Message) -> dict[str, Any]:
    """additional_kwargs of a message stored by another writer (no kept fields)."""
    if isinstance(message, ToolCallMessage):
        calls = message.tool_calls if isinstance(message.tool_calls, list) else [message.tool_call]
        return {
            "tool_calls": [
                {
                    "id": getattr(call, "tool_call_id", None),
                    "type": "function",
                    "function": {
                        "name": getattr(call, "name", None),
                        "arguments": getattr(call, "arguments", None),
                    },
                }
                for call in calls
            ]
        }
    named = {"name": message.name} if message.name else {}
    if isinstance(message, ToolReturnMessage) and message.tool_call_id:
        return {"tool_call_id": message.tool_call_id, **named}
    return named


def _split(message: Message, lengths: list[int]) -> list[dict[str, Any]]:
    """The text blocks to_kvstore joined into the message's text, by their kept lengths."""
    text = getattr(message, "content", None)
    if isinstance(message, ToolReturnMessage):
        text = message.tool_return
    text = text or ""
    if not isinstance(text, str) or sum(lengths) + max(len(lengths) - 1, 0) != len(text):
        raise ValueError(f"the kept text lengths {lengths} do not split the message's text")
    blocks, start = [], 0
    for length in lengths:
        blocks.append(_text_block(text[start : start + length]))
        start += length + 1
    return blocks


def _native_blocks(message: Message) -> list[dict[str, Any]]:
    content: Any = getattr(message, "content", None)
    if content is None:
        text = getattr(message, "reasoning", None) or getattr(message, "summary", None)
        if text is None and isinstance(message, ToolReturnMessage):
            text = message.tool_return
        if text is None:
            return []
        content = text if isinstance(text, str) else json.dumps(text)
    if isinstance(content, str):
        return [{"block_type": "text", "text": content}]
    blocks = []
    for part in content:
        if isinstance(part, ImageContent) and isinstance(part.source, Base64Image | URLImage):
            blocks.append(_image_block(part))
        elif isinstance(part, TextContent):
            blocks.append({"block_type": "text", "text": part.text})
    return blocks
