"""Moving conversations in from the Redis chat histories in use, and back out to LangChain.

Sources
    LangChain community's ``RedisChatMessageHistory`` keeps a session in one Redis list,
    ``message_store:<session>``, each element a message as ``messages_to_dict`` writes it
    (``{"type": "human", "data": {...}}``), pushed with LPUSH: newest first. LlamaIndex's
    ``RedisChatStore`` keeps a chat in one list per key (the key as the caller named it), each
    element a ``ChatMessage`` as JSON (``{"role": "user", "additional_kwargs": {}, "blocks":
    [...]}``), pushed with RPUSH: oldest first. The OpenAI Agents SDK's ``RedisSession`` keeps a
    session's Responses input items in the list ``agents:session:<session>:messages`` (its
    ``key_prefix``), each item as JSON, pushed with RPUSH: oldest first.

    :func:`import_langchain`, :func:`import_llamaindex` and :func:`import_openai_agents` find the sessions with SCAN (lists
    only, matching ``pattern``), count each (LLEN) and store it as a thread of the store (its
    namespace); a LlamaIndex source's list that is no chat is left alone (``skipped``). The
    thread id is the session id (LangChain: the key without ``message_store:``) or the key
    (LlamaIndex), the session id (the Agents SDK), or what ``thread_id(key)`` returns. Source
    keys are only read (LLEN, LRANGE, PTTL); a source key's time to live is reported
    (``SessionImport.source_ttl_ms``) for the store's ``thread_ttl`` to carry on.

Types
    ==================================  ======================================================
    source                              kvstore
    ==================================  ======================================================
    human / user                        user_message (text; image parts as images)
    ai / assistant (chatbot, model)     assistant_message for its text (none for a step
                                        that only calls tools: its empty text block makes
                                        none), then one tool_call_message per tool call
    tool (and function)                 tool_return_message (``status`` error kept)
    system (and developer)              system_message
    LlamaIndex thinking block           reasoning_message, before the assistant's text
    LangChain ChatMessage (any role)    the message of its role: user, assistant, system, or
                                        user_message named after an unknown role
    ==================================  ======================================================

    An Agents SDK item is the message ``kvstore.integrations.openai_agents`` makes of it (module
    ``kvstore.importers.openai_agents``): of the type that means the same, the item itself kept
    whole in its ``openai_item`` field.

    Nothing is dropped. Every imported message carries ``metadata``: ``source``
    (``langchain`` / ``llamaindex`` / ``openai_agents``), ``source_position`` (the message's position in the
    session, the oldest 0) and, when the source message holds anything the kvstore messages do
    not (its LangChain ``id``, ``response_metadata``, ``usage_metadata``, an ``artifact``, a
    content block of another kind, a LlamaIndex audio or document block …), ``source_fields``:
    those fields as compact JSON, split over ``source_fields``, ``source_fields_2`` … (512
    characters each, the metadata limit) up to SOURCE_FIELDS_MAX characters. A message holding
    more than that is refused with InvalidMessage and its session reported as failed, never cut.

Bounded, idempotent, resumable
    Each session is read SOURCE_PAGE messages at a time and written in appends of at most
    ``batch_messages`` kvstore messages (and IMPORT_BATCH_BYTES), a source message never split
    between two appends. Every message id is made from the source, the key, the position and a
    digest of the session up to that message (``message-<uuid5>``), so running an import again
    stores nothing twice, and an id found stored proves the session unchanged up to it. A run
    reads the session and checks the thread's newest message: it is the session's message at its
    position (as the session is now), and the messages after it are appended; or every message
    of the session is stored (the thread went on after the import), and nothing is. Otherwise
    the session is reported ``SourceChanged`` and nothing of it written: it was cleared and
    refilled, edited or cut since it was imported (a list rewritten in place, as LlamaIndex's
    ``delete_message`` does, included), or the thread went on before the session's new
    messages. An interrupted run leaves each thread holding a prefix of its session; the next
    run finishes it. Positions count from the oldest message, which neither source moves when
    it appends.

Errors
    A session that cannot be imported is reported in its SessionImport (``error``,
    ``error_type``) and the next one is imported: any typed kvstore error (``HistoryConflict``
    in a strict store, ``InvalidMessage``, ``MessageTooLarge`` …), ``SourceChanged``, a source
    record that is not a message, a key that is no list any more (redis-py's ResponseError).
    A failure of the server or of a connection (ServerError and its ConnectionFailed,
    OutcomeUnknown, NotDurable, redis-py's ConnectionError and TimeoutError) ends the import
    with that error, as KeyboardInterrupt or a cancellation does; the next run finishes it.

Back out
    :func:`to_langchain` writes messages in LangChain's message JSON (``messages_to_dict``):
    an imported message gets back every field it had (``messages_from_dict`` of the output
    equals the original messages); a message stored natively maps as above, reversed, an
    assistant step (text and tool calls) making one ``ai`` message; reasoning, hidden reasoning,
    events and approvals have no LangChain type and are left out (:func:`langchain_left_out`).
"""

from __future__ import annotations

from ..errors import SourceChanged
from .api import (
    append_missing,
    append_missing_async,
    default_thread_id,
    find_sessions,
    import_langchain,
    import_langchain_async,
    import_llamaindex,
    import_llamaindex_async,
    import_openai_agents,
    import_openai_agents_async,
)
from .langchain import langchain_left_out, to_langchain
from .records import SOURCE_FIELDS_MAX
from .session import IMPORT_BATCH_BYTES, SOURCE_PAGE, SessionImport

__all__ = [
    "IMPORT_BATCH_BYTES",
    "SOURCE_FIELDS_MAX",
    "SOURCE_PAGE",
    "SessionImport",
    "SourceChanged",
    "append_missing",
    "append_missing_async",
    "default_thread_id",
    "find_sessions",
    "import_langchain",
    "import_langchain_async",
    "import_llamaindex",
    "import_llamaindex_async",
    "import_openai_agents",
    "import_openai_agents_async",
    "langchain_left_out",
    "to_langchain",
]
