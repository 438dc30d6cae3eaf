"""kvstore: chat and agent conversations in Redis or Valkey, one atomic Lua script per write."""

from . import errors, events
from ._engine.health_report import HealthReport
from .async_thread import AsyncThread
from .config import StoreConfig
from .events import TurnLease
from .messages import (
    ApprovalRequestMessage,
    ApprovalResponseMessage,
    AssistantMessage,
    CompactionStats,
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
    ToolReturn,
    ToolReturnMessage,
    UserMessage,
    parse_message,
)
from .models import (
    AppendResult,
    ErasureReceipt,
    MessagesPage,
    OwnerUsage,
    ThreadInfo,
    ThreadSnapshot,
    ThreadsPage,
    ThreadStats,
    TurnResult,
    TurnState,
)
from .request_turns import RequestTurn
from .store import AsyncMessageStore, MessageStore
from .thread import Thread

__all__ = [
    "AppendResult",
    "ApprovalRequestMessage",
    "ApprovalResponseMessage",
    "AssistantMessage",
    "AsyncMessageStore",
    "AsyncThread",
    "CompactionStats",
    "ErasureReceipt",
    "EventMessage",
    "HealthReport",
    "HiddenReasoningMessage",
    "ImageContent",
    "Message",
    "MessageStore",
    "MessagesPage",
    "OwnerUsage",
    "ReasoningMessage",
    "RequestTurn",
    "StoreConfig",
    "SummaryMessage",
    "SystemMessage",
    "TextContent",
    "Thread",
    "ThreadInfo",
    "ThreadSnapshot",
    "ThreadStats",
    "ThreadsPage",
    "ToolCall",
    "ToolCallMessage",
    "ToolReturn",
    "ToolReturnMessage",
    "TurnLease",
    "TurnResult",
    "TurnState",
    "UserMessage",
    "errors",
    "events",
    "parse_message",
]
