"""The messages kvstore stores: the eleven list-API message types, their parts, inline media.

Shape
    Each message type is a pydantic v2 model named as in the list API (``UserMessage``,
    ``ToolReturnMessage`` …) and discriminated by ``message_type``, which defaults to the type's
    own value, so ``UserMessage(content="hi")`` works. :data:`Message` is the union of all eleven
    and :func:`parse_message` the one entry point for untrusted input (a dict, JSON text or
    bytes). ``to_dict()`` / ``to_json()`` give the list API's JSON shape: ``None`` fields are left
    out, ``message_type`` and the ``type`` of every part and source are always written.

Unknown fields are kept
    Every model keeps the fields it does not declare, at every level (a message, a content part,
    an image source, a tool call, a tool return, an approval item, compaction stats …): they are
    validated as JSON values (like ``event_data``), stored in the record, counted in its size, and
    written back out by ``to_dict()`` / ``to_json()`` where they were. So a message a newer list
    API (or SDK) sends with a field this version does not know is stored whole instead of refused.
    :func:`unknown_fields` lists their paths (``content[0].colour``); a store made with
    ``StoreConfig(unknown_fields="refuse")`` refuses a message that has any, naming each
    (:class:`kvstore.errors.UnknownField`). An :class:`Attachment`'s (and its tools') own keys
    are part of its shape (``data_source`` instead of ``file_id`` …): never unknown. An unknown
    field whose value is ``null`` is left out, like every ``null`` field.

``null`` is absent
    ``null`` for an optional field reads as if the field were not given, literals included: a
    ``"type": null`` (as the Letta SDK's ``model_dump()`` writes for a part built without one) is
    inferred as below, a ``"source": null`` stays absent. ``message_type`` is the one field that
    must be given: it tells the eleven types apart.

Parts without a ``type``
    In the API the ``type`` of a content part, image source, and approval item is optional, so a
    missing ``type`` is inferred from the shape: a part with ``source`` is an image, otherwise
    text; a source with ``url`` is a URL, with ``file_id`` a Letta file, with ``data`` base64; an
    approval item with ``approve`` is an :class:`ApprovalReturn`, otherwise a :class:`ToolReturn`.
    A ``tool_call`` holding all of ``arguments``, ``name`` and ``tool_call_id`` is a
    :class:`ToolCall`, anything less a :class:`ToolCallDelta`. The inferred ``type`` is written
    out (it is the only one the shape allows); nothing else is filled in on the way in or out.

Thread-message fields
    Every message also carries ``status`` (in_progress, incomplete, completed),
    ``incomplete_details``, ``completed_at``, ``incomplete_at``, ``attachments``, ``assistant_id``
    and ``metadata`` (at most 16 pairs, keys ≤ 64 characters, values ≤ 512 characters). On a
    :class:`ToolReturnMessage`, ``status`` keeps its list-API meaning: ``success`` or ``error``.

Timestamps
    ``date``, ``completed_at`` and ``incomplete_at`` accept ISO 8601 strings, datetimes and unix
    seconds (int or float); naive values are taken as UTC; they dump as ISO 8601 strings (the list
    API's shape). An aware value keeps its own UTC offset. ``to_thread_message()`` gives OpenAI's
    thread-message shape instead, with unix seconds.

``incomplete_details.reason``
    Any string is kept. OpenAI's thread messages allow five (:data:`INCOMPLETE_REASONS`); a store
    must not refuse a message the day an API adds a sixth, so the five are not enforced when a
    message is stored, only by ``to_thread_message()``, whose output must validate as OpenAI's.

Inline media
    An inline part is an :class:`ImageContent` whose source carries ``data`` (a
    :class:`Base64Image`, or a :class:`LettaImage` with data), wherever a message holds content
    parts: ``content``, ``tool_returns[i].tool_return`` and ``approvals[i].tool_return``. Its size
    is the length of the DECODED bytes, computed from the base64 text without decoding it
    (``len * 3 // 4`` minus the padding), so a 5 MiB limit means 5 MiB of image, whatever the
    encoding overhead. The contents are not checked to be valid base64. See :func:`inline_parts`,
    :func:`check_inline_parts` and :func:`strip_inline_media`.

Mutability
    Messages are ordinary mutable models with ``validate_assignment`` on, so ``msg.status =
    "done"`` fails at once. A list or dict changed in place (``msg.metadata.update(...)``) is not
    seen by that, so the store validates what it encodes, not the object it is given
    (``kvstore._engine.record.encode_message``): a message made invalid after it was built is refused
    with InvalidMessage naming the field. The store changes one thing on a caller's message:
    ``append`` sets the ``id`` it makes on a message that has none, before the call is sent (the
    call's idempotency token). What ``append`` returns is the validated copy that was stored,
    sharing nothing else with the caller's.

Free-form JSON
    ``event_data`` and unknown fields (an :class:`Attachment`'s own keys included) hold JSON
    values only, nesting at most ``MAX_JSON_DEPTH`` (64) levels. Integers of any size up to
    ``MAX_JSON_INT_BITS`` (4096) bits are kept exactly: msgpack packs 64 bits natively, and the
    record holds a larger one as a msgpack extension (kvstore/_engine/record.py).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    GetCoreSchemaHandler,
    Tag,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import core_schema, from_json

from kvstore.errors import InlineMediaTooLarge, InvalidMessage, RoleBasedMessage

__all__ = [
    "INCOMPLETE_REASONS",
    "MAX_EVENT_DATA_DEPTH",
    "MAX_JSON_DEPTH",
    "MAX_JSON_INT_BITS",
    "MAX_METADATA_KEY_CHARS",
    "MAX_METADATA_PAIRS",
    "MAX_METADATA_VALUE_CHARS",
    "MESSAGE_ADAPTER",
    "MESSAGE_LIST_ADAPTER",
    "ApprovalRequestMessage",
    "ApprovalResponseMessage",
    "ApprovalReturn",
    "AssistantMessage",
    "Attachment",
    "AttachmentTool",
    "Base64Image",
    "BaseMessage",
    "CompactionStats",
    "ContentPart",
    "EventMessage",
    "HiddenReasoningMessage",
    "ImageContent",
    "ImageSource",
    "IncompleteDetails",
    "LettaImage",
    "Message",
    "ReasoningMessage",
    "SummaryMessage",
    "SystemMessage",
    "TextContent",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallMessage",
    "ToolReturn",
    "ToolReturnMessage",
    "URLImage",
    "UserMessage",
    "base64_decoded_size",
    "check_inline_parts",
    "inline_media_bytes",
    "inline_parts",
    "parse_message",
    "strip_inline_media",
    "unknown_fields",
]

MAX_METADATA_PAIRS = 16
"""The most key-value pairs a message's `metadata` may hold."""
MAX_METADATA_KEY_CHARS = 64
"""The most characters of one `metadata` key."""
MAX_METADATA_VALUE_CHARS = 512
"""The most characters of one `metadata` value."""
# Free-form JSON (event_data, unknown fields) nests at most this deep: deeper is a bug or
# an attack, and pydantic's serializer (~255 levels) and msgpack (~500) refuse to go much further,
# so the limit is enforced where the caller can still be told which field is at fault.
MAX_JSON_DEPTH = 64
"""The deepest free-form JSON (`event_data`, unknown fields) may nest."""
MAX_EVENT_DATA_DEPTH = MAX_JSON_DEPTH  # the name it had when event_data was the only such field
"""The former name of MAX_JSON_DEPTH."""
# JSON has no integer size; Python's int parsing stops at 4300 digits (and pydantic's JSON parser
# with it), so a bound is needed for the value to come back from JSON text: 4096 bits is 1234
# digits, far past any count or id and with room for a 4096-bit key.
MAX_JSON_INT_BITS = 4096
"""The most bits an integer in free-form JSON (`event_data`, unknown fields) may have."""
INCOMPLETE_REASONS = ("content_filter", "max_tokens", "run_cancelled", "run_expired", "run_failed")
"""The five `incomplete_details.reason` values OpenAI's thread messages allow (others are kept)."""

# How many validation errors an InvalidMessage spells out; the rest stay in `.errors`.
_ERRORS_SHOWN = 5


# --- field types ------------------------------------------------------------------------------


def _assume_utc(value: datetime) -> datetime:
    # One stored instant per value, whatever zone the writing process runs in.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


Timestamp = Annotated[datetime, AfterValidator(_assume_utc)]


def _check_metadata(value: dict[str, str]) -> dict[str, str]:
    if len(value) > MAX_METADATA_PAIRS:
        raise ValueError(
            f"metadata holds {len(value)} pairs; at most {MAX_METADATA_PAIRS} are allowed"
        )
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise ValueError(
                f"metadata key {key[:16]!r}… is {len(key)} characters; "
                f"keys are at most {MAX_METADATA_KEY_CHARS}"
            )
        if len(item) > MAX_METADATA_VALUE_CHARS:
            raise ValueError(
                f"metadata value of {key!r} is {len(item)} characters; "
                f"values are at most {MAX_METADATA_VALUE_CHARS}"
            )
    return value


Metadata = Annotated[dict[str, str], AfterValidator(_check_metadata)]


def _check_json(value: Any, field: str) -> None:
    """Raise ValueError unless ``value`` is a JSON value nesting at most MAX_JSON_DEPTH levels.

    Walks with an explicit stack: a recursive walk would itself hit RecursionError on the input it
    is meant to reject. Only JSON values are allowed, so the dump reads back identical.
    """
    if _plain_json(value, 1):
        return
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"{field} nests deeper than {MAX_JSON_DEPTH} levels")
            for key, item in node.items():
                if not isinstance(key, str):
                    raise ValueError(f"{field} keys must be strings, not {type(key).__name__}")
                stack.append((item, depth + 1))
        elif isinstance(node, list):
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"{field} nests deeper than {MAX_JSON_DEPTH} levels")
            stack.extend((item, depth + 1) for item in node)
        elif isinstance(node, float):
            if node != node or node in (float("inf"), float("-inf")):
                raise ValueError(f"{field} holds a NaN or infinite number, which JSON cannot carry")
        elif isinstance(node, int) and node.bit_length() > MAX_JSON_INT_BITS:
            raise ValueError(
                f"{field} holds an integer of {node.bit_length()} bits; at most "
                f"{MAX_JSON_INT_BITS} are kept (JSON parsers read no longer numbers)"
            )
        elif node is not None and not isinstance(node, (str, int, bool)):
            raise ValueError(f"{field} holds a {type(node).__name__}, which is not a JSON value")


def _plain_json(node: Any, depth: int) -> bool:
    """Whether ``node`` is a JSON value within the bounds, built of the exact builtin types only.

    The quick check every read runs (unknown fields are validated on each page): False is no
    verdict, only "walk it" (_check_json then finds the error, or accepts a subclass). Recursive,
    as deep as MAX_JSON_DEPTH at most.
    """
    kind = type(node)
    if kind is str or kind is bool or node is None:
        return True
    if kind is dict:
        if depth > MAX_JSON_DEPTH:
            return False
        for key, item in node.items():
            if type(key) is not str:
                return False
            if type(item) is not str and not _plain_json(item, depth + 1):
                return False
        return True
    if kind is list:
        if depth > MAX_JSON_DEPTH:
            return False
        for item in node:
            if type(item) is not str and not _plain_json(item, depth + 1):
                return False
        return True
    if kind is int:
        bits: int = node.bit_length()
        return bits <= MAX_JSON_INT_BITS
    return kind is float and math.isfinite(node)


def _check_json_tree(value: dict[str, Any]) -> dict[str, Any]:
    _check_json(value, "event_data")
    return value


def _check_json_field(value: Any) -> Any:
    _check_json(value, "the field")
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_check_json_tree)]
JsonField = Annotated[Any, AfterValidator(_check_json_field)]


class _NullIsAbsent:
    """Marks a one-value ``Literal`` field (the ``type`` of a part, source or approval item):
    ``null`` reads as absent, so as its one value; anything else must be that value.

    Built from pydantic-core's own schemas (a union of the literal and "None, then the default"),
    not a Python validator: these fields are validated on every part of every page read.
    """

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> Any:
        literal = handler(source)
        (value,) = literal["expected"]
        null = core_schema.chain_schema(
            [
                core_schema.none_schema(),
                core_schema.with_default_schema(literal, default=value, on_error="default"),
            ]
        )
        return core_schema.union_schema(
            [literal, null],
            mode="left_to_right",
            custom_error_type="literal_error",  # "Input should be 'text'", as the literal's own
            custom_error_context={"expected": repr(value)},
            serialization=core_schema.simple_ser_schema("str"),
        )


_NULL_IS_ABSENT = _NullIsAbsent()


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")

    # Fields a model does not declare are kept, each a JSON value (checked like event_data).
    __pydantic_extra__: dict[str, JsonField]


def _declared_type(value: Any) -> Any:
    """The ``type`` a part, source or approval item states, for dicts and built models alike."""
    if isinstance(value, dict):
        return value.get("type")
    return getattr(value, "type", None)


# --- content parts ----------------------------------------------------------------------------


class TextContent(_Model):
    """A text content part: ``{"type": "text", "text": ...}``; `signature` identifies the
    reasoning tied to the text, when a model sends one.

    Example: ``TextContent(text="Here is the chart:")``"""

    type: Annotated[Literal["text"], _NULL_IS_ABSENT] = "text"
    text: str
    signature: str | None = None


class URLImage(_Model):
    """An image source that is a URL; it holds no inline media.

    Example: ``ImageContent(source=URLImage(url="https://example.com/chart.png"))``"""

    type: Annotated[Literal["url"], _NULL_IS_ABSENT] = "url"
    url: str


class Base64Image(_Model):
    """An image source with its bytes inline, base64 encoded: inline media, counted against
    ``max_inline_part_bytes`` and the thread's ``max_inline_media_bytes`` (decoded size).

    Example: ``Base64Image(data="iVBORw0KGgo...", media_type="image/png")``"""

    type: Annotated[Literal["base64"], _NULL_IS_ABSENT] = "base64"
    data: str
    media_type: str
    detail: str | None = None


class LettaImage(_Model):
    """An image source naming a stored file (`file_id`); with `data` it is inline media too.

    Example: ``LettaImage(file_id="file-123")``"""

    type: Annotated[Literal["letta"], _NULL_IS_ABSENT] = "letta"
    file_id: str
    data: str | None = None
    detail: str | None = None
    media_type: str | None = None


# Union tags are the class names, not the `type` values: pydantic puts the tag into error
# locations, and a tag like "text" would read as the field `text` in the path we report.
_SOURCE_TAGS = {"url": "URLImage", "base64": "Base64Image", "letta": "LettaImage"}


def _source_tag(value: Any) -> str | None:
    kind = _declared_type(value)
    if kind is None and isinstance(value, dict):
        if "url" in value:
            kind = "url"
        elif "file_id" in value:
            kind = "letta"
        elif "data" in value:
            kind = "base64"
    return _SOURCE_TAGS.get(kind) if isinstance(kind, str) else None


ImageSource = Annotated[
    Annotated[URLImage, Tag("URLImage")]
    | Annotated[Base64Image, Tag("Base64Image")]
    | Annotated[LettaImage, Tag("LettaImage")],
    Discriminator(
        _source_tag,
        custom_error_type="image_source",
        custom_error_message=(
            "an image source needs type 'url' (with url), 'base64' (with data and media_type) "
            "or 'letta' (with file_id)"
        ),
    ),
]
"""An image source: URLImage, Base64Image or LettaImage (told apart by ``type``, or by its fields)."""


class ImageContent(_Model):
    """An image content part: ``{"type": "image", "source": ...}`` with a URLImage,
    Base64Image or LettaImage source (a source without ``type`` is told apart by its fields).

    Example: ``ImageContent(source={"url": "https://example.com/a.png"})``"""

    type: Annotated[Literal["image"], _NULL_IS_ABSENT] = "image"
    source: ImageSource


_PART_TAGS = {"text": "TextContent", "image": "ImageContent"}


def _part_tag(value: Any) -> str | None:
    kind = _declared_type(value)
    if kind is None and isinstance(value, dict):
        kind = "image" if "source" in value else "text"
    return _PART_TAGS.get(kind) if isinstance(kind, str) else None


ContentPart = Annotated[
    Annotated[TextContent, Tag("TextContent")] | Annotated[ImageContent, Tag("ImageContent")],
    Discriminator(
        _part_tag,
        custom_error_type="content_part",
        custom_error_message=(
            "a content part needs type 'text' (with text) or 'image' (with source)"
        ),
    ),
]
"""A content part: TextContent or ImageContent (told apart by ``type``, or by ``source``)."""


def _string_or_parts(value: Any) -> str | None:
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "parts"
    return None


_STRING_OR_PARTS_ERROR = "must be a string or a list of content parts"

Content = Annotated[
    Annotated[str, Tag("string")] | Annotated[list[ContentPart], Tag("parts")],
    Discriminator(
        _string_or_parts,
        custom_error_type="content",
        custom_error_message=_STRING_OR_PARTS_ERROR,
    ),
]
# The API allows only text parts in assistant content.
AssistantContent = Annotated[
    Annotated[str, Tag("string")] | Annotated[list[TextContent], Tag("parts")],
    Discriminator(
        _string_or_parts,
        custom_error_type="content",
        custom_error_message=_STRING_OR_PARTS_ERROR,
    ),
]


# --- tool calls, returns, approvals -----------------------------------------------------------


class ToolCall(_Model):
    """A complete tool call: its JSON `arguments` (a string), the tool's `name`, and the
    `tool_call_id` its ToolReturnMessage answers.

    Example: ``ToolCall(name="weather", arguments='{"city": "Oslo"}', tool_call_id="call-1")``"""

    arguments: str
    name: str
    tool_call_id: str


class ToolCallDelta(_Model):
    """A tool call as streamed: any field may still be missing.

    Example: ``ToolCallDelta(name="weather")``"""

    arguments: str | None = None
    name: str | None = None
    tool_call_id: str | None = None


_TOOL_CALL_FIELDS = ("arguments", "name", "tool_call_id")


def _tool_call_tag(value: Any) -> str | None:
    if isinstance(value, (ToolCall, ToolCallDelta)):
        return type(value).__name__
    if isinstance(value, dict):
        complete = all(isinstance(value.get(name), str) for name in _TOOL_CALL_FIELDS)
        return "ToolCall" if complete else "ToolCallDelta"
    return None


AnyToolCall = Annotated[
    Annotated[ToolCall, Tag("ToolCall")] | Annotated[ToolCallDelta, Tag("ToolCallDelta")],
    Discriminator(
        _tool_call_tag,
        custom_error_type="tool_call",
        custom_error_message="a tool call must be an object with arguments, name and tool_call_id",
    ),
]


def _tool_calls_tag(value: Any) -> str | None:
    if isinstance(value, list):
        return "list"
    if isinstance(value, (dict, ToolCallDelta)):
        return "ToolCallDelta"
    return None


ToolCalls = Annotated[
    Annotated[list[ToolCall], Tag("list")] | Annotated[ToolCallDelta, Tag("ToolCallDelta")],
    Discriminator(
        _tool_calls_tag,
        custom_error_type="tool_calls",
        custom_error_message="tool_calls must be a list of tool calls or one tool call delta",
    ),
]


class ToolReturn(_Model):
    """One tool's result inside ``ToolReturnMessage.tool_returns`` or
    ``ApprovalResponseMessage.approvals``: `status` "success" or "error", and `tool_return`, a
    string or a list of content parts (which may hold inline images).

    Example: ``ToolReturn(status="success", tool_call_id="call-1", tool_return="4 °C")``"""

    type: Annotated[Literal["tool"], _NULL_IS_ABSENT] = "tool"
    status: Literal["success", "error"]
    tool_call_id: str
    tool_return: Content
    stdout: list[str] | None = None
    stderr: list[str] | None = None


class ApprovalReturn(_Model):
    """One approval decision inside ``ApprovalResponseMessage.approvals``.

    Example: ``ApprovalReturn(approve=True, tool_call_id="call-1")``"""

    type: Annotated[Literal["approval"], _NULL_IS_ABSENT] = "approval"
    approve: bool
    tool_call_id: str
    reason: str | None = None


_APPROVAL_TAGS = {"approval": "ApprovalReturn", "tool": "ToolReturn"}


def _approval_tag(value: Any) -> str | None:
    kind = _declared_type(value)
    if kind is None and isinstance(value, dict):
        kind = "approval" if "approve" in value else "tool"
    return _APPROVAL_TAGS.get(kind) if isinstance(kind, str) else None


ApprovalItem = Annotated[
    Annotated[ApprovalReturn, Tag("ApprovalReturn")] | Annotated[ToolReturn, Tag("ToolReturn")],
    Discriminator(
        _approval_tag,
        custom_error_type="approval",
        custom_error_message=(
            "an approval item needs type 'approval' (with approve) or 'tool' (a tool return)"
        ),
    ),
]


class CompactionStats(_Model):
    """The list API's statistics of a compaction, carried by a SummaryMessage
    (``Thread.compact(..., stats=...)`` takes one, or a dict).

    Example::

        CompactionStats(context_window=128000, messages_count_before=900,
                        messages_count_after=12, trigger="context_window_exceeded")"""

    context_window: int
    messages_count_after: int
    messages_count_before: int
    trigger: str
    context_tokens_after: int | None = None
    context_tokens_before: int | None = None


# --- thread-message fields --------------------------------------------------------------------


class IncompleteDetails(_Model):
    """Why a message is incomplete (``status="incomplete"``).

    Example: ``IncompleteDetails(reason="max_tokens")``"""

    reason: str


class AttachmentTool(_Model):
    """A tool a file was attached for (``{"type": "file_search"}``); other keys are kept
    as given (JSON values).

    Example: ``AttachmentTool(type="code_interpreter")``"""

    type: str


class Attachment(_Model):
    """A file attached to a message and the tools it was added to; other keys are kept as given
    (JSON values nesting at most MAX_JSON_DEPTH levels)."""

    file_id: str | None = None
    tools: list[AttachmentTool] | None = None


# --- messages ---------------------------------------------------------------------------------


class BaseMessage(_Model):
    """Fields every message type carries, and its JSON output."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    message_type: str
    id: str | None = None
    date: Timestamp | None = None
    name: str | None = None
    otid: str | None = None
    run_id: str | None = None
    step_id: str | None = None
    sender_id: str | None = None
    seq_id: int | None = None
    is_err: bool | None = None
    status: Literal["in_progress", "incomplete", "completed"] | None = None
    incomplete_details: IncompleteDetails | None = None
    completed_at: Timestamp | None = None
    incomplete_at: Timestamp | None = None
    attachments: list[Attachment] | None = None
    assistant_id: str | None = None
    metadata: Metadata | None = None

    def to_dict(self) -> dict[str, Any]:
        """The message in the list API's JSON shape (``None`` fields left out).

        What a web backend returns for a message: ``model_dump()`` (and FastAPI's default
        response) writes every unset field as ``null`` instead (docs/API.md, "FastAPI").

        Example: ``UserMessage(content="hi").to_dict()`` is
        ``{"message_type": "user_message", "content": "hi"}``.
        """
        return self.model_dump(mode="json", exclude_none=True)

    def to_json(self) -> str:
        """The message as list-API JSON text (``None`` fields left out), as :meth:`to_dict`.

        Example: ``UserMessage(content="hi").to_json()`` is
        ``'{"message_type":"user_message","content":"hi"}'``.
        """
        return self.model_dump_json(exclude_none=True)

    def to_thread_message(self, thread_id: str) -> dict[str, Any]:
        """The message in the thread-message shape of OpenAI's Assistants API, as its
        ``openai.types.beta.threads.Message`` validates it: ``object: "thread.message"``, a
        ``role``, content blocks, and unix seconds (an int) for ``created_at`` (the message's
        ``date``), ``completed_at`` and ``incomplete_at``.

        Only a :class:`UserMessage` or :class:`AssistantMessage` has one (roles ``user`` and
        ``assistant``). Text parts become ``text`` blocks (no annotations), a URL image an
        ``image_url`` block, a base64 image an ``image_url`` block with a ``data:`` URL, a Letta
        file an ``image_file`` block; an image ``detail`` other than auto, low or high is left
        out. A message without ``status`` is ``"completed"``. Sub-second digits are cut off.
        Attachments and metadata are carried as stored; unknown fields are left out.

        Raises InvalidMessage when the message has no such shape: another type, no ``id`` or
        ``date`` (a stored message has both), an ``incomplete_details.reason`` that is not one
        of :data:`INCOMPLETE_REASONS`, or an attachment tool other than ``code_interpreter`` and
        ``file_search``.

        Example::

            page = thread.list(limit=20)
            data = [m.to_thread_message("thread-42") for m in page.messages
                    if m.message_type in ("user_message", "assistant_message")]
        """
        return _thread_message(self, thread_id)


class SystemMessage(BaseMessage):
    """A system prompt or notice.

    Example: ``SystemMessage(content="You are a helpful assistant.")``"""

    message_type: Literal["system_message"] = "system_message"
    content: str


class UserMessage(BaseMessage):
    """A message from the user: `content` is a string or a list of text and image parts.

    Example::

        UserMessage(content="What's the weather in Oslo?", otid="req-1")
        UserMessage(content=[TextContent(text="This chart:"),
                             ImageContent(source=URLImage(url="https://example.com/c.png"))])"""

    message_type: Literal["user_message"] = "user_message"
    content: Content


class ReasoningMessage(BaseMessage):
    """The model's reasoning, shown to the user or not; `source` says whether a
    reasoner model made it or prompting did (absent when not said).

    Example: ``ReasoningMessage(reasoning="The user wants today's forecast.")``"""

    message_type: Literal["reasoning_message"] = "reasoning_message"
    reasoning: str
    source: Literal["reasoner_model", "non_reasoner_model"] | None = None
    signature: str | None = None


class HiddenReasoningMessage(BaseMessage):
    """Reasoning the provider redacted or the API omitted (`state`).

    Example: ``HiddenReasoningMessage(state="redacted")``"""

    message_type: Literal["hidden_reasoning_message"] = "hidden_reasoning_message"
    state: Literal["redacted", "omitted"]
    hidden_reasoning: str | None = None


class ToolCallMessage(BaseMessage):
    """The model asks for a tool call (`tool_call`, a ToolCall or, while streaming, a
    ToolCallDelta; `tool_calls` for several).

    Example::

        ToolCallMessage(tool_call=ToolCall(name="weather", arguments='{"city": "Oslo"}',
                                           tool_call_id="call-1"))"""

    message_type: Literal["tool_call_message"] = "tool_call_message"
    tool_call: AnyToolCall
    tool_calls: ToolCalls | None = None


class ToolReturnMessage(BaseMessage):
    """A tool's result. `status` is the list API's: "success" or "error" (how the call
    ended), not a thread-message status; `tool_returns` holds one ToolReturn per tool when
    several ran.

    Example: ``ToolReturnMessage(status="success", tool_call_id="call-1", tool_return="4 °C")``"""

    message_type: Literal["tool_return_message"] = "tool_return_message"
    # The list API's meaning of `status` (how the tool call ended), not the thread-message one.
    status: Literal["success", "error"]  # type: ignore[assignment]  # another meaning, on purpose
    tool_call_id: str
    tool_return: str
    stdout: list[str] | None = None
    stderr: list[str] | None = None
    tool_returns: list[ToolReturn] | None = None


class AssistantMessage(BaseMessage):
    """The model's reply: `content` is a string or a list of text parts (no images).

    Example: ``AssistantMessage(content="Cloudy, 4 °C.", otid="reply-1")``"""

    message_type: Literal["assistant_message"] = "assistant_message"
    content: AssistantContent


class ApprovalRequestMessage(BaseMessage):
    """The model asks the user to approve a tool call before it runs.

    Example::

        ApprovalRequestMessage(tool_call=ToolCall(name="pay", arguments="{}", tool_call_id="c-1"))"""

    message_type: Literal["approval_request_message"] = "approval_request_message"
    tool_call: AnyToolCall
    tool_calls: ToolCalls | None = None


class ApprovalResponseMessage(BaseMessage):
    """The user's answer to an approval request: `approve` (and `reason`), or one
    ApprovalReturn / ToolReturn per tool call in `approvals`.

    Example::

        ApprovalResponseMessage(approval_request_id="message-1", approve=False, reason="no")"""

    message_type: Literal["approval_response_message"] = "approval_response_message"
    approval_request_id: str | None = None
    approvals: list[ApprovalItem] | None = None
    approve: bool | None = None
    reason: str | None = None


class SummaryMessage(BaseMessage):
    """A summary of the thread up to a sequence, stored by ``Thread.compact``; the model input
    (``Thread.context``) starts with the latest one.

    Example: ``thread.compact("The user asked about Oslo.", last_sequence=40)`` returns one."""

    message_type: Literal["summary_message"] = "summary_message"
    summary: str
    compaction_stats: CompactionStats | None = None


class EventMessage(BaseMessage):
    """An event for the developer (a compaction), not part of the model input; `event_data` is
    a JSON object nesting at most MAX_JSON_DEPTH levels.

    Example: ``EventMessage(event_type="compaction", event_data={"messages_removed": 30})``"""

    message_type: Literal["event_message"] = "event_message"
    event_type: Literal["compaction"]
    event_data: JsonObject


Message = Annotated[
    SystemMessage
    | UserMessage
    | ReasoningMessage
    | HiddenReasoningMessage
    | ToolCallMessage
    | ToolReturnMessage
    | AssistantMessage
    | ApprovalRequestMessage
    | ApprovalResponseMessage
    | SummaryMessage
    | EventMessage,
    Field(discriminator="message_type"),
]
"""Any of the eleven message types, discriminated by ``message_type``.

Use it as a type (``list[Message]``, a FastAPI ``response_model``); :func:`parse_message`
validates one from a dict, JSON text or bytes."""

# Built once: building a TypeAdapter compiles the whole schema.
MESSAGE_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)
"""Validates and dumps one :data:`Message` (pydantic's TypeAdapter, built once)."""
MESSAGE_LIST_ADAPTER: TypeAdapter[list[Message]] = TypeAdapter(list[Message])
"""Validates and dumps a list of messages, e.g. ``MESSAGE_LIST_ADAPTER.validate_json(text)``."""


# --- parsing and errors -----------------------------------------------------------------------


def parse_message(data: Mapping[str, Any] | str | bytes | BaseMessage) -> Message:
    """Validate one message from a dict, JSON text or bytes; a built message is returned as is
    (the store validates it again when it encodes it, which catches changes made in place).

    Raises InvalidMessage naming the offending field (pydantic's error is its ``__cause__`` and its
    error list is ``.errors``).
    """
    if isinstance(data, BaseMessage):
        return data  # type: ignore[return-value]  # validated when it was built
    if isinstance(data, (str, bytes, bytearray)):
        # pydantic-core's parser caps nesting depth; json.loads would raise RecursionError instead.
        try:
            data = from_json(data, allow_inf_nan=False)
        except ValueError as exc:
            raise InvalidMessage(f"message is not valid JSON: {exc}") from exc
    try:
        return MESSAGE_ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise invalid_message(exc, data) from exc


def invalid_message(exc: ValidationError, data: Any) -> InvalidMessage:
    """An InvalidMessage whose text names each failing field as a path into ``data``; a
    RoleBasedMessage for a chat message (``role``, no ``message_type``)."""
    kind = data.get("message_type") if isinstance(data, Mapping) else None
    if kind is None and isinstance(data, Mapping) and "role" in data:
        return _role_based(data, exc)
    prefix = f"invalid {kind}" if isinstance(kind, str) else "invalid message"
    error = InvalidMessage(f"{prefix}: {describe_errors(exc, data)}")
    error.errors = exc.errors(include_url=False)  # type: ignore[attr-defined]  # only errors made from a ValidationError carry it
    return error


_TYPE_NAMES = ", ".join(
    repr(cls.model_fields["message_type"].default)
    for cls in (
        SystemMessage,
        UserMessage,
        ReasoningMessage,
        HiddenReasoningMessage,
        ToolCallMessage,
        ToolReturnMessage,
        AssistantMessage,
        ApprovalRequestMessage,
        ApprovalResponseMessage,
        SummaryMessage,
        EventMessage,
    )
)


def _role_based(data: Mapping[str, Any], exc: ValidationError) -> RoleBasedMessage:
    role = data.get("role")
    shown = repr(role)[:40] if isinstance(role, str) else type(role).__name__
    error = RoleBasedMessage(
        f"this looks like an OpenAI chat message (role {shown}), not a kvstore message: kvstore "
        "messages name their type in message_type ('user_message', 'assistant_message', "
        "'tool_return_message' …); kvstore.convert.from_chat_completions(...) converts chat "
        "messages into kvstore messages"
    )
    error.errors = exc.errors(include_url=False)  # type: ignore[attr-defined]  # only errors made from a ValidationError carry it
    return error


def describe_errors(exc: ValidationError, data: Any) -> str:
    """pydantic's errors as ``path: message`` items, e.g. ``content[0].text: Field required``."""
    errors = exc.errors(include_url=False)
    shown = [
        f"{_error_path(err, data)}: {_error_text(err, data)}" for err in errors[:_ERRORS_SHOWN]
    ]
    if len(errors) > _ERRORS_SHOWN:
        shown.append(f"and {len(errors) - _ERRORS_SHOWN} more errors")
    return "; ".join(shown)


def _message_tag_error(error: Any) -> bool:
    # A message-level tag error has an empty location (or just the index in a list).
    loc = error["loc"]
    return error["type"] in ("union_tag_invalid", "union_tag_not_found") and (
        not loc or (len(loc) == 1 and isinstance(loc[0], int))
    )


def _error_text(error: Any, data: Any) -> str:
    if _message_tag_error(error):
        node = data[error["loc"][0]] if error["loc"] and isinstance(data, list) else data
        if isinstance(node, Mapping) and node.get("message_type") is None:
            # Pydantic's "Unable to extract tag" (or "Input tag 'None'") is no help to a caller.
            return f"missing or null; it names the message's type, one of {_TYPE_NAMES}"
    return str(error["msg"])


def _error_path(error: Any, data: Any) -> str:
    loc = error["loc"]
    if _message_tag_error(error):
        loc = (*loc, "message_type")  # the field at fault
    return _field_path(loc, data) or "(message)"


def _field_path(loc: tuple[int | str, ...], data: Any) -> str:
    # pydantic's locations also hold union tags ("user_message", "TextContent", "parts" …). Walking
    # the input alongside keeps only real keys and indexes, plus a trailing missing field name.
    path = ""
    node = data
    last = len(loc) - 1
    for position, item in enumerate(loc):
        if isinstance(item, int) and isinstance(node, list) and 0 <= item < len(node):
            path += f"[{item}]"
            node = node[item]
        elif isinstance(item, str) and isinstance(node, Mapping) and item in node:
            path += f".{item}" if path else item
            node = node[item]
        elif position == last and isinstance(item, str) and isinstance(node, Mapping):
            path += f".{item}" if path else item
    return path if len(path) <= 200 else path[:200] + "…"


# --- unknown fields ---------------------------------------------------------------------------


def unknown_fields(message: BaseModel) -> dict[str, str]:
    """The fields the message holds that kvstore's models do not declare (each model's own
    before those of its fields): each path (``content[0].colour``) with a hint (``did you mean 'otid'?``, or ``TextContent has no
    such field``). An attachment's own keys are part of its shape: never listed.

    Example: ``unknown_fields(parse_message({"message_type": "user_message", "content": "x",
    "otdi": "o-1"}))`` is ``{"otdi": "did you mean 'otid'?"}``.
    """
    found: dict[str, str] = {}
    _find_unknown(message, "", found)
    return found


def _find_unknown(node: Any, path: str, found: dict[str, str]) -> None:
    if isinstance(node, BaseModel):
        fields = type(node).model_fields
        if node.__pydantic_extra__ and not isinstance(node, (Attachment, AttachmentTool)):
            for key in node.__pydantic_extra__:
                close = difflib.get_close_matches(key, list(fields), n=1)
                hint = (
                    f"did you mean {close[0]!r}?"
                    if close
                    else (f"{type(node).__name__} has no such field")
                )
                found[f"{path}.{key}" if path else key] = hint
        for name in fields:
            _find_unknown(node.__dict__.get(name), f"{path}.{name}" if path else name, found)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            _find_unknown(item, f"{path}[{index}]", found)


# --- OpenAI's thread-message shape ------------------------------------------------------------

_THREAD_ROLES = {"user_message": "user", "assistant_message": "assistant"}
_IMAGE_DETAILS = ("auto", "low", "high")
_ATTACHMENT_TOOLS = ("code_interpreter", "file_search")


def _unix_seconds(value: datetime | None) -> int | None:
    return None if value is None else math.floor(value.timestamp())


def _thread_message(message: BaseMessage, thread_id: str) -> dict[str, Any]:
    role = _THREAD_ROLES.get(message.message_type)
    if role is None:
        raise InvalidMessage(
            f"a {message.message_type} has no OpenAI thread-message shape: only user and "
            "assistant messages do"
        )
    if message.id is None or message.date is None:
        raise InvalidMessage(
            f"this {message.message_type} has no {'id' if message.id is None else 'date'}: a "
            "thread message needs both (a stored message has them)"
        )
    details = message.incomplete_details
    if details is not None and details.reason not in INCOMPLETE_REASONS:
        raise InvalidMessage(
            f"incomplete_details.reason {details.reason[:64]!r} has no OpenAI thread-message "
            f"equivalent: it allows {', '.join(INCOMPLETE_REASONS)}"
        )
    for attachment in message.attachments or ():
        for tool in attachment.tools or ():
            if tool.type not in _ATTACHMENT_TOOLS:
                raise InvalidMessage(
                    f"attachment tool {tool.type[:64]!r} has no OpenAI thread-message equivalent:"
                    f" it allows {' and '.join(_ATTACHMENT_TOOLS)}"
                )
    content = message.content  # type: ignore[attr-defined]  # a user or assistant message
    parts = [TextContent(text=content)] if isinstance(content, str) else content
    return {
        "id": message.id,
        "object": "thread.message",
        "created_at": _unix_seconds(message.date),
        "thread_id": thread_id,
        "role": role,
        "content": [_thread_block(part) for part in parts],
        "status": message.status or "completed",
        "assistant_id": message.assistant_id,
        "run_id": message.run_id,
        "attachments": None
        if message.attachments is None
        else [
            attachment.model_dump(mode="json", exclude_none=True)
            for attachment in message.attachments
        ],
        "metadata": message.metadata,
        "completed_at": _unix_seconds(message.completed_at),
        "incomplete_at": _unix_seconds(message.incomplete_at),
        "incomplete_details": None if details is None else {"reason": details.reason},
    }


def _thread_block(part: TextContent | ImageContent) -> dict[str, Any]:
    if isinstance(part, TextContent):
        return {"type": "text", "text": {"value": part.text, "annotations": []}}
    source = part.source
    detail = getattr(source, "detail", None)
    image: dict[str, Any] = {}
    if isinstance(source, URLImage):
        kind, image["url"] = "image_url", source.url
    elif isinstance(source, Base64Image):
        kind, image["url"] = "image_url", f"data:{source.media_type};base64,{source.data}"
    else:
        kind, image["file_id"] = "image_file", source.file_id
    if detail in _IMAGE_DETAILS:
        image["detail"] = detail
    return {"type": kind, kind: image}


# --- inline media -----------------------------------------------------------------------------

M = TypeVar("M", bound=BaseMessage)


def base64_decoded_size(data: str) -> int:
    """How many bytes ``data`` decodes to, from its length alone (no decoding)."""
    padding = 2 if data.endswith("==") else 1 if data.endswith("=") else 0
    return max(0, len(data) * 3 // 4 - padding)


def _part_lists(message: BaseMessage) -> Iterator[tuple[str, list[Any]]]:
    """Every list of content parts the message holds, with its path, in message order."""
    if isinstance(message, UserMessage) and isinstance(message.content, list):
        yield "content", message.content
    if isinstance(message, ToolReturnMessage):
        items: list[Any] = list(message.tool_returns or ())
        field = "tool_returns"
    elif isinstance(message, ApprovalResponseMessage):
        items = list(message.approvals or ())
        field = "approvals"
    else:
        return
    for index, item in enumerate(items):
        if isinstance(item, ToolReturn) and isinstance(item.tool_return, list):
            yield f"{field}[{index}].tool_return", item.tool_return


def _inline_size(part: Any) -> int | None:
    """The decoded size of an inline image part, or None for any other part."""
    if isinstance(part, ImageContent):
        source = part.source
        if isinstance(source, (Base64Image, LettaImage)) and source.data is not None:
            return base64_decoded_size(source.data)
    return None


def inline_parts(message: BaseMessage) -> list[tuple[str, int]]:
    """Each inline media part as ``(path, decoded bytes)``, e.g. ``("content[2]", 3145728)``."""
    found = []
    for path, parts in _part_lists(message):
        for index, part in enumerate(parts):
            size = _inline_size(part)
            if size is not None:
                found.append((f"{path}[{index}]", size))
    return found


def inline_media_bytes(message: BaseMessage) -> int:
    """The decoded bytes of all the message's inline media parts."""
    return sum(size for _, size in inline_parts(message))


def check_inline_parts(message: BaseMessage, max_part_bytes: int) -> int:
    """Raise InlineMediaTooLarge if any one inline part decodes to more than ``max_part_bytes``.

    Returns the message's inline media bytes (what :func:`inline_media_bytes` returns), so a
    caller that checks does not walk the parts twice.
    """
    total = 0
    for path, size in inline_parts(message):
        total += size
        if size > max_part_bytes:
            error = InlineMediaTooLarge(
                f"inline image at {path} is {size} bytes decoded; one inline part may hold at "
                f"most {max_part_bytes} bytes (max_inline_part_bytes)"
            )
            error.errors = []  # type: ignore[attr-defined]  # same surface as other InvalidMessage
            raise error
    return total


def strip_inline_media(message: M, bytes_to_free: int) -> M:
    """A copy whose inline parts are replaced, first to last, by a text part naming what was
    removed, until at least ``bytes_to_free`` decoded bytes are gone (or no inline part is left).

    The message itself is not changed; with nothing to free it is returned as is.
    """
    if bytes_to_free <= 0 or not inline_parts(message):
        return message
    stripped = message.model_copy(deep=True)
    freed = 0
    for _, parts in _part_lists(stripped):
        for index, part in enumerate(parts):
            if freed >= bytes_to_free:
                return stripped
            size = _inline_size(part)
            if size is not None:
                parts[index] = TextContent(text=_removed_note(part.source, size))
                freed += size
    return stripped


def _removed_note(source: Base64Image | LettaImage, size: int) -> str:
    media_type = source.media_type or "unknown media type"
    file_note = f", file {source.file_id}" if isinstance(source, LettaImage) else ""
    return f"[image removed: {media_type}, {size} bytes{file_note}, thread inline media limit]"
