"""Chat Completions messages read into kvstore messages: :func:`from_chat_completions` and the
ids it makes (:func:`made_id`). kvstore.convert names both (its docstring has the mapping)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import InvalidMessage
from .messages import (
    AssistantMessage,
    Base64Image,
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

# Ids made from an id_prefix and a position: uuid5 in this namespace.
_ID_NAMESPACE = uuid.UUID("0b7f6f0e-2c55-4a7e-9a1f-6a4de3c2b9d1")
_DATA_URL = re.compile(r"data:(?P<media>[^;,]+)(?:;[^;,]*)*;base64,(?P<data>.*)", re.DOTALL)
_DETAILS = ("low", "high", "auto")


def from_chat_completions(
    messages: Iterable[Mapping[str, Any] | Any], id_prefix: str | None = None
) -> list[Message]:
    """kvstore messages for role-based Chat Completions messages (dicts, or the ``openai``
    package's models), ready for ``thread.append``.

    With ``id_prefix``, ids are made from it and each message's position, so the same input
    converts to the same ids (module docstring, "Ids"). Raises ``InvalidMessage`` naming the
    input message at fault for a role or part kvstore has no type for.

    Example::

        thread.append(from_chat_completions([{"role": "user", "content": "hi"}]))
    """
    out: list[Message] = []
    for index, raw in enumerate(messages):
        item = raw.model_dump(exclude_none=True) if hasattr(raw, "model_dump") else raw
        if not isinstance(item, Mapping):
            raise InvalidMessage(
                f"messages[{index}]: a chat message must be an object, not {type(raw).__name__}"
            )
        try:
            made = _from_chat(item, index, id_prefix)
        except InvalidMessage as exc:
            raise InvalidMessage(f"messages[{index}]: {exc}") from None
        except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
            raise InvalidMessage(f"messages[{index}] ({item.get('role')!r}): {exc}") from None
        out.extend(made)
    return out


def made_id(id_prefix: str, position: str) -> str:
    """The id :func:`from_chat_completions` gives the message at ``position`` under ``id_prefix``."""
    return f"message-{uuid.uuid5(_ID_NAMESPACE, id_prefix + chr(0) + position)}"


def _from_chat(item: Mapping[str, Any], index: int, id_prefix: str | None) -> list[Message]:
    role = item.get("role")
    common: dict[str, Any] = {"name": item["name"]} if item.get("name") else {}

    def ident(sub: int = 0) -> dict[str, Any]:
        return {"id": made_id(id_prefix, f"{index}.{sub}")} if id_prefix is not None else {}

    if role in ("system", "developer"):
        return [SystemMessage(content=_plain_text(item.get("content"), role), **common, **ident())]
    if role == "user":
        return [UserMessage(content=_user_content(item.get("content")), **common, **ident())]
    if role == "tool":
        content = item.get("content")
        return [
            ToolReturnMessage(
                status="success",
                tool_call_id=item.get("tool_call_id"),
                tool_return=_plain_text(content, role),
                **ident(),
            )
        ]
    if role == "assistant":
        step = (
            {"step_id": f"step-{made_id(id_prefix, str(index))[8:]}"}
            if id_prefix is not None
            else {}
        )
        made: list[Message] = []
        content = item.get("content")
        text = _assistant_text(content) if content not in (None, "", []) else item.get("refusal")
        calls = item.get("tool_calls") or []
        if text or not calls:
            made.append(AssistantMessage(content=text or "", **common, **step, **ident(0)))
        for number, call in enumerate(calls, 1):
            if call.get("type", "function") != "function":
                raise InvalidMessage(
                    f"tool call type {call.get('type')!r} has no kvstore equivalent"
                )
            function = call.get("function") or {}
            made.append(
                ToolCallMessage(
                    tool_call=ToolCall(
                        name=function.get("name"),
                        arguments=function.get("arguments"),
                        tool_call_id=call.get("id"),
                    ),
                    **common,
                    **step,
                    **ident(number),
                )
            )
        return made
    raise InvalidMessage(
        f"role {role!r} has no kvstore equivalent (system, developer, user, assistant, tool)"
    )


def _plain_text(content: Any, role: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" for p in content
    ):
        return "".join(p.get("text", "") for p in content)
    raise InvalidMessage(f"a {role} message's content must be a string or text parts")


def _assistant_text(content: Any) -> str | list[TextContent]:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for number, part in enumerate(content):
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(TextContent(text=part.get("text")))
            elif isinstance(part, Mapping) and part.get("type") == "refusal":
                parts.append(TextContent(text=part.get("refusal")))
            else:
                raise InvalidMessage(
                    f"content[{number}]: an assistant part must be text or refusal"
                )
        return parts
    raise InvalidMessage("an assistant message's content must be a string or a list of parts")


def _user_content(content: Any) -> str | list[Any]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidMessage("a user message's content must be a string or a list of parts")
    parts: list[Any] = []
    for number, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            parts.append(TextContent(text=part.get("text")))
        elif kind == "image_url":
            image = part.get("image_url") or {}
            parts.append(ImageContent(source=_image_source(image.get("url"), image.get("detail"))))
        else:
            raise InvalidMessage(
                f"content[{number}]: a {kind!r} part has no kvstore equivalent (text, image_url)"
            )
    return parts


def _image_source(url: Any, detail: Any) -> URLImage | Base64Image:
    if not isinstance(url, str):
        raise InvalidMessage("an image_url part needs its url")
    match = _DATA_URL.fullmatch(url)
    if match:
        return Base64Image(
            data=match["data"], media_type=match["media"], **({"detail": detail} if detail else {})
        )
    return URLImage(url=url)
