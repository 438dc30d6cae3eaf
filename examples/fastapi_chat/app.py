"""A chat on kvstore: `GET /` is the page, POST runs a (fake) model's turn for a message, and GET
.../events streams the thread as Server-Sent Events: the newest page first, then every change,
resumable with Last-Event-ID. Any worker serves any request: the model's output reaches every
watcher through the thread's event stream (docs/EVENTS.md). With `?user=`, threads are that
user's (docs/OWNERS.md): `GET /threads` is the sidebar, most recent first, with titles; a thread
can be deleted and forked. (A real app takes the user from its session, not from the URL.)

    pip install -e ".[examples]"
    python -m kvstore server & uvicorn examples.fastapi_chat.app:app --workers 2

KVSTORE_URL names the server (default: the one `python -m kvstore server` starts).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Header, Query, Request
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

from kvstore import AsyncMessageStore, UserMessage
from kvstore.errors import KVStoreError, TurnFenced
from kvstore.events import ThreadEvent
from kvstore.messages import BaseMessage

from .model import fake_model

URL = os.environ.get("KVSTORE_URL", "redis://127.0.0.1:6390/0")
PAGE = Path(__file__).with_name("index.html")
# How long a browser waits before it reconnects a stream that ended (SSE `retry`).
RETRY_MS = 1000
log = logging.getLogger("uvicorn.error")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with AsyncMessageStore.from_url(URL) as store:
        app.state.store = store
        yield


app = FastAPI(lifespan=lifespan)


@app.exception_handler(KVStoreError)
async def kvstore_error(request: Request, exc: KVStoreError) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=exc.http_status)


@app.middleware("http")
async def worker_header(request: Request, call_next: Any) -> Any:
    response = await call_next(request)
    response.headers["X-Worker-Pid"] = str(os.getpid())
    return response


@app.get("/", include_in_schema=False)
async def page() -> FileResponse:
    return FileResponse(PAGE, headers={"Cache-Control": "no-store"})


class UserInput(BaseModel):
    content: str = Field(min_length=1)
    # The client's id for this send, sent again when it retries: the same otid is the same turn.
    otid: str = Field(min_length=1, max_length=256)


def thread_of(thread_id: str, user: str | None) -> Any:
    """The thread `thread_id`, of `user` when one is given."""
    return app.state.store.thread(thread_id, owner=user)


@app.get("/threads")
async def list_threads(
    user: str, after: str | None = None, limit: int = Query(30, ge=1, le=100)
) -> dict[str, Any]:
    """The sidebar: the user's threads, most recent activity first, with their titles."""
    page = await app.state.store.threads(user, after=after, limit=limit)
    return page.model_dump(mode="json")


@app.delete("/threads/{thread_id}", status_code=204)
async def delete_thread(thread_id: str, user: str | None = None) -> None:
    await thread_of(thread_id, user).delete()


class ForkInput(BaseModel):
    at: int = Field(ge=1)  # the sequence the fork keeps up to
    new_thread_id: str = Field(min_length=1, max_length=200)


@app.post("/threads/{thread_id}/fork")
async def fork_thread(thread_id: str, body: ForkInput, user: str | None = None) -> dict[str, Any]:
    """A new thread holding this one's history up to `at`, titled after it."""
    thread = thread_of(thread_id, user)
    fork = await thread.fork(body.new_thread_id, at=body.at)
    if user is not None:
        info = await thread.info()
        title = info.title if info and info.title else thread_id
        await fork.set_info(title=f"{title} (fork)"[:200])
    return {"thread_id": body.new_thread_id}


@app.post("/threads/{thread_id}/messages")
async def post_message(thread_id: str, body: UserInput, user: str | None = None) -> dict[str, Any]:
    """Stores the user's message and runs the model's turn for it, once per otid: a retry of a
    finished turn answers its result; a retry of an open one takes it over (the earlier
    request, if it still runs, is fenced off and answers 409). A user's thread is titled after
    its first message."""
    thread = thread_of(thread_id, user)
    turn = await thread.hold_turn_for(UserMessage(content=body.content, otid=body.otid))
    if user is not None and turn.lease is not None:
        info = await thread.info()
        if info is None or info.title is None:
            await thread.set_info(title=body.content[:60])
    result = turn.result
    if turn.lease is not None:
        try:
            await fake_model(thread, turn.lease, body.content)
        except TurnFenced:
            raise  # a retry holds the turn now: it finishes it
        except BaseException:
            with suppress(KVStoreError):
                await thread.finish_turn(turn.lease, outcome="failed")
            raise
        result = await thread.finish_turn(turn.lease)
    return {"retried": turn.lease is None, **result.model_dump(mode="json")}


@app.get("/threads/{thread_id}/messages")
async def older_messages(
    thread_id: str, before: int, limit: int = 50, user: str | None = None
) -> dict[str, Any]:
    """The `limit` messages before sequence `before`, oldest first (the page's "older")."""
    page = await thread_of(thread_id, user).list(after=before, limit=limit, order="desc")
    return {"messages": [m.to_dict() for m in reversed(page.messages)], "has_more": page.has_more}


@app.get("/threads/{thread_id}/events")
async def stream_events(
    thread_id: str,
    after: str | None = None,
    limit: int = Query(50, ge=1, le=200),
    last_event_id: str | None = Header(default=None),
    user: str | None = None,
) -> StreamingResponse:
    """The thread as Server-Sent Events. A new stream starts with the newest `limit` messages
    (one `messages_added` event), then every change after them. Each event carries its cursor
    as `id`, so a browser that reconnects (Last-Event-ID) goes on right after the last event it
    got; `after` (a cursor or a sequence) does the same for a client that opens a new stream."""
    thread = thread_of(thread_id, user)
    cursor = last_event_id or after
    return StreamingResponse(
        sse(thread_id, thread, cursor, limit),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store"},
    )


async def sse(thread_id: str, thread: Any, cursor: str | None, limit: int) -> AsyncIterator[str]:
    """The stream's lines. An error ends it with an `error` event and one log line: the browser
    reconnects after RETRY_MS with its Last-Event-ID; the page stops on a request's own error
    (`status` below 500: a malformed cursor, say)."""
    yield f"retry: {RETRY_MS}\n: connected\n\n"
    try:
        if cursor is None:
            page = await thread.list(limit=limit, order="desc")
            cursor = str(page.messages[0].seq_id) if page.messages else "0"
            messages = [m.to_dict() for m in reversed(page.messages)]
            yield frame("messages_added", {"messages": messages, "paged": True}, cursor)
        async with thread.watch(after=cursor) as events:
            async for event in events:
                yield frame(event.kind, event_data(event), event.cursor)
    except KVStoreError as exc:
        log.warning("stream of %s ended: %s: %s", thread_id, type(exc).__name__, exc)
        error = {"error": type(exc).__name__, "status": exc.http_status, "detail": str(exc)}
        yield frame("error", error)


def frame(kind: str, data: dict[str, Any], cursor: str | None = None) -> str:
    """One Server-Sent Event."""
    head = f"id: {cursor}\n" if cursor is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data)}\n\n"


def event_data(event: ThreadEvent) -> dict[str, Any]:
    """An event as JSON: its fields, messages in the list API's shape."""

    def plain(value: Any) -> Any:
        if isinstance(value, BaseMessage):
            return value.to_dict()
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        return value

    return {
        f.name: plain(getattr(event, f.name))
        for f in dataclasses.fields(event)
        if f.name != "cursor"
    }
