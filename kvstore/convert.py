"""Conversions between kvstore's messages and the OpenAI model APIs' message shapes.

A backend hands ``thread.context()`` to a model, and stores what the model and its users send.
These functions do the translation both ways, as plain dicts (JSON-ready, what the ``openai``
client takes); kvstore does not need the ``openai`` package for them.

To the model
    :func:`to_chat_completions` gives Chat Completions messages (``role``, ``content``,
    ``tool_calls``, ``tool_call_id``); :func:`to_responses_input` gives Responses API input
    items (``message``, ``function_call``, ``function_call_output``). Each takes a list of
    messages (models or list-API dicts), oldest first, such as ``thread.context()`` returns:

    ==========================  ======================================  ====================================
    kvstore                     Chat Completions                        Responses input
    ==========================  ======================================  ====================================
    system_message              ``system`` (or ``developer``)           ``message``, role ``system``
    user_message                ``user``: text, text and image parts    ``message``, ``input_text`` /
                                                                        ``input_image`` parts
    assistant_message           ``assistant`` (text)                    ``message``, role ``assistant``
    tool_call_message           ``assistant`` with ``tool_calls``       one ``function_call`` per call
    tool_return_message         one ``tool`` message per return         one ``function_call_output`` each
    approval_request_message    ``assistant`` with ``tool_calls``       one ``function_call`` per call
    approval_response_message   a ``tool`` message per denied call or   the same, as ``function_call_output``
                                tool return it carries (nothing for an
                                approval: the tool's return follows)
    summary_message             ``system``: SUMMARY_PREFIX + summary    the same, as a ``message``
    reasoning_message           left out                                left out
    hidden_reasoning_message    left out                                left out
    event_message               left out                                left out
    ==========================  ======================================  ====================================

    Reasoning is left out because neither API takes a client's copy of it as input (the
    Responses API's reasoning items must carry the ids it issued itself); events are for the
    developer, not the model. A tool call still being streamed (a ``ToolCallDelta``, missing its
    name, arguments or id) is left out too: the model cannot be sent an incomplete call.

    Grouping (Chat Completions): one assistant step that said something and called tools is one
    ``assistant`` message with ``content`` and several ``tool_calls``. Consecutive assistant and
    tool-call messages (reasoning between them aside) are merged into one assistant message
    unless both carry a ``step_id`` and the ids differ; a second text message, or a text after a
    tool call, starts a new one. The ``tool`` messages answering the calls follow it.

    Images: a URL image is sent as its URL, an inline image (base64 data) as a ``data:`` URL, a
    stored file without inline data (``LettaImage`` with only ``file_id``) as a ``file_id``
    (Responses) or as a text part naming the file (Chat Completions, which takes no image file
    ids). A ``detail`` of ``low``, ``high`` or ``auto`` is passed on. Chat Completions tool
    messages take text only: an image in a tool return becomes a text part naming it; the
    Responses API takes it as an ``input_image``.

From the model
    :func:`from_chat_completions` turns role-based messages (``{"role": "user", "content":
    "hi"}``, an assistant message with ``tool_calls``, a ``tool`` message, ``system`` or
    ``developer``) into kvstore messages ready for ``thread.append``: an assistant message
    becomes an assistant_message for its text (or refusal) and one tool_call_message per tool
    call, all with one ``step_id``; ``developer`` becomes a system_message. ``name`` is kept.
    Audio, file parts and the deprecated ``function`` role have no kvstore type and are refused
    with ``InvalidMessage`` naming the input at fault.

    Ids: with ``id_prefix`` every message gets an id made from it and its position in the input
    (``message-<uuid5>``; the prefix is typically the thread and the request), so sending the same
    input again makes the same ids, and ``thread.append`` of it again is a replay that stores
    nothing twice. A Chat Completions client resends the whole conversation each request: give
    the same prefix every time and append only the messages the thread does not yet hold
    (:func:`kvstore.importers.append_missing` does exactly that). Without ``id_prefix`` the ids
    are left for ``append`` to make.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from .convert_in import _DETAILS, from_chat_completions, made_id
from .messages import (
    ApprovalRequestMessage,
    ApprovalResponseMessage,
    ApprovalReturn,
    AssistantMessage,
    BaseMessage,
    EventMessage,
    HiddenReasoningMessage,
    ImageContent,
    LettaImage,
    Message,
    ReasoningMessage,
    SummaryMessage,
    SystemMessage,
    TextContent,
    ToolCall,
    ToolCallMessage,
    ToolReturn,
    ToolReturnMessage,
    URLImage,
    UserMessage,
    parse_message,
)

__all__ = [
    "DENIED_TEXT",
    "SUMMARY_PREFIX",
    "from_chat_completions",
    "made_id",
    "to_chat_completions",
    "to_responses_input",
]

SUMMARY_PREFIX = "Summary of the earlier conversation:\n"
"""What a summary_message's text is prefixed with when it is sent to a model (as a system message)."""

DENIED_TEXT = "The user denied this tool call."
"""The tool output sent for a tool call whose approval was denied (followed by the reason, if any)."""

# Message types no model input carries (module docstring).
_LEFT_OUT = (ReasoningMessage, HiddenReasoningMessage, EventMessage)


# --- to the model -----------------------------------------------------------------------------


def to_chat_completions(
    messages: Iterable[Message | Mapping[str, Any]],
    system_role: Literal["system", "developer"] = "system",
) -> list[dict[str, Any]]:
    """Chat Completions messages for ``messages`` (e.g. ``thread.context()``), oldest first.

    The mapping, the grouping of one assistant step into one message, and what is left out
    (reasoning, hidden reasoning, events, incomplete tool calls) are in the module's docstring.
    ``system_role`` is the role system messages and the summary are sent with.

    Example::

        completion = openai.chat.completions.create(
            model="gpt-4o", messages=to_chat_completions(thread.context()))
    """
    out: list[dict[str, Any]] = []
    # The assistant message being built, and the step it belongs to: merged while it continues.
    open_step: dict[str, Any] | None = None
    open_step_id: str | None = None
    requested: dict[str, list[str]] = {}  # approval request message id -> its tool call ids

    for message in _messages(messages):
        if isinstance(message, AssistantMessage):
            # A text always opens an assistant message; the step's tool calls may join it.
            open_step = {
                "role": "assistant",
                "content": _text_parts(message.content),
                **_name(message),
            }
            open_step_id = message.step_id
            out.append(open_step)
            continue
        if isinstance(message, (ToolCallMessage, ApprovalRequestMessage)):
            calls = _complete_calls(message)
            if isinstance(message, ApprovalRequestMessage) and message.id:
                requested[message.id] = [call.tool_call_id for call in calls]
            if not calls:
                continue
            if open_step is None or not _same_step(open_step_id, message.step_id):
                open_step = {"role": "assistant", "content": None, **_name(message)}
                open_step_id = message.step_id
                out.append(open_step)
            open_step.setdefault("tool_calls", []).extend(_chat_call(call) for call in calls)
            open_step_id = open_step_id or message.step_id
            continue
        if isinstance(message, _LEFT_OUT):
            continue  # neither closes nor opens a step: reasoning sits between text and calls
        open_step = None
        out.extend(_chat_messages(message, system_role, requested))
    return out


def _chat_messages(
    message: BaseMessage, system_role: str, requested: dict[str, list[str]]
) -> list[dict[str, Any]]:
    """The Chat Completions messages of a message outside an assistant step."""
    if isinstance(message, SystemMessage):
        return [{"role": system_role, "content": message.content, **_name(message)}]
    if isinstance(message, SummaryMessage):
        return [{"role": system_role, "content": SUMMARY_PREFIX + message.summary}]
    if isinstance(message, UserMessage):
        return [{"role": "user", "content": _chat_user_content(message.content), **_name(message)}]
    if isinstance(message, ToolReturnMessage):
        outputs = _tool_outputs(message)
    elif isinstance(message, ApprovalResponseMessage):
        outputs = _approval_outputs(message, requested)
    else:
        return []
    return [
        {"role": "tool", "tool_call_id": call_id, "content": _chat_tool_content(output)}
        for call_id, output in outputs
    ]


def to_responses_input(messages: Iterable[Message | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Responses API input items for ``messages`` (e.g. ``thread.context()``), oldest first:
    ``message`` items, one ``function_call`` per tool call and one ``function_call_output`` per
    tool return; reasoning, hidden reasoning and events are left out (module docstring).

    An assistant message's text parts are sent as one string, joined by newlines.

    Example::

        response = openai.responses.create(model="gpt-4o", input=to_responses_input(thread.context()))
    """
    out: list[dict[str, Any]] = []
    requested: dict[str, list[str]] = {}
    for message in _messages(messages):
        if isinstance(message, SystemMessage):
            out.append({"type": "message", "role": "system", "content": message.content})
        elif isinstance(message, SummaryMessage):
            out.append(
                {"type": "message", "role": "system", "content": SUMMARY_PREFIX + message.summary}
            )
        elif isinstance(message, UserMessage):
            parts = message.content
            content = parts if isinstance(parts, str) else [_responses_part(p) for p in parts]
            out.append({"type": "message", "role": "user", "content": content})
        elif isinstance(message, AssistantMessage):
            said = message.content
            text = said if isinstance(said, str) else "\n".join(part.text for part in said)
            out.append({"type": "message", "role": "assistant", "content": text})
        elif isinstance(message, (ToolCallMessage, ApprovalRequestMessage)):
            calls = _complete_calls(message)
            if isinstance(message, ApprovalRequestMessage) and message.id:
                requested[message.id] = [call.tool_call_id for call in calls]
            out.extend(
                {
                    "type": "function_call",
                    "call_id": call.tool_call_id,
                    "name": call.name,
                    "arguments": call.arguments,
                }
                for call in calls
            )
        elif isinstance(message, (ToolReturnMessage, ApprovalResponseMessage)):
            outputs = (
                _tool_outputs(message)
                if isinstance(message, ToolReturnMessage)
                else _approval_outputs(message, requested)
            )
            for call_id, output in outputs:
                if not isinstance(output, str):
                    output = [_responses_part(part) for part in output]
                out.append({"type": "function_call_output", "call_id": call_id, "output": output})
    return out


def _messages(messages: Iterable[Message | Mapping[str, Any]]) -> Iterable[BaseMessage]:
    for message in messages:
        yield message if isinstance(message, BaseMessage) else parse_message(message)


def _same_step(open_id: str | None, step_id: str | None) -> bool:
    return open_id is None or step_id is None or open_id == step_id


def _name(message: BaseMessage) -> dict[str, str]:
    return {"name": message.name} if message.name else {}


def _complete_calls(message: ToolCallMessage | ApprovalRequestMessage) -> list[ToolCall]:
    """The message's complete tool calls: `tool_calls` when it lists them, else `tool_call`."""
    calls = message.tool_calls if isinstance(message.tool_calls, list) else [message.tool_call]
    return [call for call in calls if isinstance(call, ToolCall)]


def _chat_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.tool_call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def _text_parts(content: str | list[TextContent]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return [{"type": "text", "text": part.text} for part in content]


def _image_url(part: ImageContent) -> str | None:
    source = part.source
    if isinstance(source, URLImage):
        return source.url
    if source.data is not None:
        return f"data:{source.media_type or 'application/octet-stream'};base64,{source.data}"
    return None


def _detail(part: ImageContent) -> dict[str, str]:
    detail = getattr(part.source, "detail", None)
    return {"detail": detail} if detail in _DETAILS else {}


def _file_note(part: ImageContent) -> str:
    source = part.source
    return f"[image: file {source.file_id}]" if isinstance(source, LettaImage) else "[image]"


def _chat_user_content(content: str | list[Any]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, TextContent):
            parts.append({"type": "text", "text": part.text})
            continue
        url = _image_url(part)
        if url is None:
            parts.append({"type": "text", "text": _file_note(part)})
        else:
            parts.append({"type": "image_url", "image_url": {"url": url, **_detail(part)}})
    return parts


def _chat_tool_content(output: str | list[Any]) -> str | list[dict[str, Any]]:
    if isinstance(output, str):
        return output
    return [
        {"type": "text", "text": part.text if isinstance(part, TextContent) else _image_note(part)}
        for part in output
    ]


def _image_note(part: ImageContent) -> str:
    url = _image_url(part)
    if url is None:
        return _file_note(part)
    if url.startswith("data:"):
        return f"[image: {getattr(part.source, 'media_type', None) or 'inline'}]"
    return f"[image: {url}]"


def _responses_part(part: Any) -> dict[str, Any]:
    if isinstance(part, TextContent):
        return {"type": "input_text", "text": part.text}
    detail = getattr(part.source, "detail", None)
    item: dict[str, Any] = {
        "type": "input_image",
        "detail": detail if detail in _DETAILS else "auto",
    }
    url = _image_url(part)
    if url is None:
        item["file_id"] = part.source.file_id
    else:
        item["image_url"] = url
    return item


def _tool_outputs(message: ToolReturnMessage) -> list[tuple[str, str | list[Any]]]:
    """(tool_call_id, output) for each tool the message returns for."""
    if message.tool_returns:
        return [(item.tool_call_id, item.tool_return) for item in message.tool_returns]
    return [(message.tool_call_id, message.tool_return)]


def _approval_outputs(
    message: ApprovalResponseMessage, requested: dict[str, list[str]]
) -> list[tuple[str, str | list[Any]]]:
    """What the model is told of an approval response: the tool returns it carries and a denial
    for each call refused; an approved call is answered by the tool's own return, later."""
    outputs: list[tuple[str, str | list[Any]]] = []
    if message.approvals:
        for item in message.approvals:
            if isinstance(item, ToolReturn):
                outputs.append((item.tool_call_id, item.tool_return))
            elif isinstance(item, ApprovalReturn) and not item.approve:
                outputs.append((item.tool_call_id, _denied(item.reason)))
    elif message.approve is False and message.approval_request_id in requested:
        outputs.extend(
            (call_id, _denied(message.reason)) for call_id in requested[message.approval_request_id]
        )
    return outputs


def _denied(reason: str | None) -> str:
    return f"{DENIED_TEXT} Reason: {reason}" if reason else DENIED_TEXT
