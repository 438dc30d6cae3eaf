"""LlamaIndex's ChatMessage JSON read into kvstore messages."""

from __future__ import annotations

import json
from typing import Any

from ..messages import (
    AssistantMessage,
    Base64Image,
    ImageContent,
    Message,
    ReasoningMessage,
    SystemMessage,
    TextContent,
    ToolCall,
    ToolCallMessage,
    ToolReturnMessage,
    URLImage,
    UserMessage,
)

_LLAMA_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "chatbot": "assistant",
    "model": "assistant",
    "tool": "tool",
    "function": "tool",
}
_CONSUMED_KWARGS = ("tool_calls", "tool_call_id", "name")


def _from_llamaindex(record: Any) -> tuple[list[Message], dict[str, Any]]:
    """The kvstore messages of one LlamaIndex ChatMessage, and the fields they do not carry."""
    if not isinstance(record, dict) or "role" not in record:
        raise ValueError("not a LlamaIndex ChatMessage ({'role': ..., 'blocks': [...]})")
    role = record["role"]
    kind = _LLAMA_ROLES.get(role, "user")
    kwargs = record.get("additional_kwargs") or {}
    fields: dict[str, Any] = {}
    if kind != role:
        fields["role"] = role
    rest = {name: value for name, value in kwargs.items() if name not in _CONSUMED_KWARGS}
    if rest:
        fields["additional_kwargs"] = rest
    for name, value in record.items():
        if name not in ("role", "additional_kwargs", "blocks", "content") and value is not None:
            fields[name] = value
    blocks = record.get("blocks")
    if blocks is None:  # an older ChatMessage: `content` text
        blocks = (
            []
            if record.get("content") is None
            else [{"block_type": "text", "text": record["content"]}]
        )
    texts, reasoning, calls, kept = _blocks(blocks, kind)
    if kept:
        fields["blocks"] = kept
    return _messages(kind, kwargs, texts, reasoning, calls), fields


def _blocks(
    blocks: list[Any], kind: str
) -> tuple[list[TextContent | ImageContent], list[Message], list[ToolCall], list[dict[str, Any]]]:
    """A ChatMessage's blocks read: its text and image parts, reasoning, tool calls, and the
    blocks kept whole in the source fields (with their index)."""
    texts: list[TextContent | ImageContent] = []
    reasoning: list[Message] = []
    calls: list[ToolCall] = []
    kept: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        block_type = block.get("block_type") if isinstance(block, dict) else None
        if block_type == "text":
            texts.append(TextContent(text=block.get("text") or ""))
        elif (
            block_type == "image" and kind == "user" and (image := _llama_image(block)) is not None
        ):
            texts.append(image)
        elif block_type == "thinking" and kind == "assistant":
            reasoning.append(ReasoningMessage(reasoning=block.get("content") or ""))
            extra = {
                k: v
                for k, v in block.items()
                if k not in ("block_type", "content") and v not in (None, {})
            }
            if extra:
                kept.append({"index": index, "block": block})
        elif block_type == "tool_call" and kind == "assistant":
            arguments = block.get("tool_kwargs")
            calls.append(
                ToolCall(
                    name=str(block.get("tool_name") or ""),
                    tool_call_id=str(block.get("tool_call_id") or ""),
                    arguments=arguments
                    if isinstance(arguments, str)
                    else json.dumps(arguments, allow_nan=False),
                )
            )
        else:
            kept.append({"index": index, "block": block})
    return texts, reasoning, calls, kept


def _messages(
    kind: str,
    kwargs: dict[str, Any],
    texts: list[TextContent | ImageContent],
    reasoning: list[Message],
    calls: list[ToolCall],
) -> list[Message]:
    """The kvstore messages of a ChatMessage of role `kind`, from its blocks read."""
    name = kwargs.get("name") if isinstance(kwargs.get("name"), str) else None
    named = {"name": name} if name else {}
    text_only = [part.text for part in texts if isinstance(part, TextContent)]
    if kind == "system":
        return [SystemMessage(content="\n".join(text_only), **named)]
    if kind == "tool":
        return [
            ToolReturnMessage(
                status="success",
                tool_call_id=str(kwargs.get("tool_call_id") or ""),
                tool_return="\n".join(text_only),
                **named,
            )
        ]
    if kind == "user":
        content: Any = (
            texts[0].text if len(texts) == 1 and isinstance(texts[0], TextContent) else texts
        )
        return [UserMessage(content=content, **named)]
    for call in kwargs.get("tool_calls") or []:
        function = call.get("function") or {} if isinstance(call, dict) else {}
        calls.append(
            ToolCall(
                name=str(function.get("name") or ""),
                tool_call_id=str(call.get("id") or ""),
                arguments=str(function.get("arguments") or "{}"),
            )
        )
    if calls:
        # A tool-calling step without text carries an empty text block (LlamaIndex turns
        # ``content=""`` into one): it is no assistant message of its own.
        text_only = [text for text in text_only if text]
    made: list[Message] = list(reasoning)
    if text_only or not calls:
        made.append(
            AssistantMessage(
                content=text_only[0]
                if len(text_only) == 1
                else [TextContent(text=text) for text in text_only],
                **named,
            )
        )
    made.extend(ToolCallMessage(tool_call=call, **named) for call in calls)
    return made


def _llama_image(block: dict[str, Any]) -> ImageContent | None:
    detail = {"detail": block["detail"]} if isinstance(block.get("detail"), str) else {}
    if isinstance(block.get("image"), str):
        return ImageContent(
            source=Base64Image(
                data=block["image"],
                media_type=block.get("image_mimetype") or "application/octet-stream",
                **detail,
            )
        )
    if isinstance(block.get("url"), str) and not detail:
        return ImageContent(source=URLImage(url=block["url"]))
    return None


# --- helpers ----------------------------------------------------------------------------------
