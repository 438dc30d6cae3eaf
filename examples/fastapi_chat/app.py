"""A chat backend on kvstore: POST runs a (fake) model turn, GET streams the thread as
Server-Sent Events, resumable with Last-Event-ID. Any worker serves any request: the model's
output reaches every watcher through the thread's event stream (docs/EVENTS.md).

    python -m kvstore server & uvicorn examples.fastapi_chat.app:app --workers 2

KVSTORE_URL names the server (default: the one `python -m kvstore server` starts).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from kvstore import (
    AssistantMessage,
    AsyncMessageStore,
    ToolCall,
    ToolCallMessage,
    ToolReturn,
    ToolReturnMessage,
    UserMessage,
)
from kvstore.errors import KVStoreError
from kvstore.events import ThreadEvent
from kvstore.messages import BaseMessage, ToolCallDelta

URL = os.environ.get("KVSTORE_URL", "redis://127.0.0.1:6390/0")
# The pause between two fragments of the fake model's output.
TOKEN_DELAY = float(os.environ.get("FAKE_MODEL_DELAY", "0.01"))


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


class UserInput(BaseModel):
    content: str


@app.post("/threads/{thread_id}/messages")
async def post_message(thread_id: str, body: UserInput) -> dict[str, Any]:
    """Stores the user's message and runs the model's turn: its output is streamed as deltas
    while it is produced, its messages stored as they are complete."""
    thread = app.state.store.thread(thread_id)
    turn_id = f"turn-{uuid.uuid4().hex[:12]}"
    await thread.append(UserMessage(content=body.content), turn_id=turn_id)
    lease = await thread.hold_turn(turn_id)
    try:
        await fake_model(thread, lease, body.content)
    except BaseException:
        await thread.finish_turn(lease, outcome="failed")
        raise
    result = await thread.finish_turn(lease)
    return {"turn_id": turn_id, "reply_count": result.reply_count}


async def fake_model(thread: Any, lease: Any, question: str) -> None:
    """A model that calls a weather tool, then answers, streaming each part as it goes."""
    call_id = f"call-{uuid.uuid4().hex[:8]}"
    arguments = json.dumps({"city": question.split()[-1].strip("?") or "Paris"})
    for i in range(0, len(arguments), 6):
        await thread.publish(
            lease,
            ToolCallMessage(
                tool_call=ToolCallDelta(
                    name="weather" if i == 0 else None,
                    tool_call_id=call_id if i == 0 else None,
                    arguments=arguments[i : i + 6],
                )
            ),
        )
        await asyncio.sleep(TOKEN_DELAY)
    await thread.append(
        ToolCallMessage(
            tool_call=ToolCall(name="weather", arguments=arguments, tool_call_id=call_id)
        ),
        turn_id=lease,
    )
    await thread.append(
        ToolReturnMessage(
            tool_return="sunny, 21 C",
            status="success",
            tool_call_id=call_id,
            tool_returns=[
                ToolReturn(tool_call_id=call_id, status="success", tool_return="sunny, 21 C")
            ],
        ),
        turn_id=lease,
    )
    answer_id = f"message-{uuid.uuid4()}"
    answer = "It is sunny and 21 degrees."
    for word in answer.split(" "):
        await thread.publish(lease, AssistantMessage(id=answer_id, content=word + " "))
        await asyncio.sleep(TOKEN_DELAY)
    await thread.append(AssistantMessage(id=answer_id, content=answer), turn_id=lease)


def event_data(event: ThreadEvent) -> dict[str, Any]:
    """An event as JSON: its fields, messages in the list API's shape."""

    def plain(value: Any) -> Any:
        if isinstance(value, BaseMessage):
            return value.model_dump(mode="json", exclude_none=True)
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    return {
        f.name: plain(getattr(event, f.name))
        for f in dataclasses.fields(event)
        if f.name != "cursor"
    }


@app.get("/threads/{thread_id}/events")
async def stream_events(
    thread_id: str, after: str | None = None, last_event_id: str | None = Header(default=None)
) -> StreamingResponse:
    """The thread's events as Server-Sent Events: each carries its cursor as `id`, so a client
    that reconnects with Last-Event-ID goes on right after the last event it got. Without one,
    `after` (a cursor or a sequence; "0" for the whole thread) or from now on."""
    thread = app.state.store.thread(thread_id)
    cursor = last_event_id or after

    async def lines() -> AsyncIterator[str]:
        yield ": connected\n\n"
        async with thread.watch(after=cursor) as events:
            async for event in events:
                yield f"id: {event.cursor}\nevent: {event.kind}\ndata: {json.dumps(event_data(event))}\n\n"

    return StreamingResponse(
        lines(), media_type="text/event-stream", headers={"Cache-Control": "no-store"}
    )
