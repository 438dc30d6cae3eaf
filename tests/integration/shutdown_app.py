"""The graceful shutdown docs/EVENTS.md shows ("Shutting down"), as an app: a watch() stream as
Server-Sent Events, and a SIGTERM handler that closes the store before uvicorn waits for open
responses. Run by test_watch_close.py under uvicorn; KVSTORE_URL names the server."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from kvstore import AsyncMessageStore


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with AsyncMessageStore.from_url(os.environ["KVSTORE_URL"]) as store:
        app.state.store = store
        loop = asyncio.get_running_loop()
        uvicorn_handler = signal.getsignal(signal.SIGTERM)
        closing: list[asyncio.Task[None]] = []

        def on_sigterm(signum: int, frame: object) -> None:
            # uvicorn waits for open responses before the lifespan's shutdown: closing the
            # store now ends every watch() stream, so those responses end.
            loop.call_soon_threadsafe(lambda: closing.append(loop.create_task(store.close())))
            if callable(uvicorn_handler):
                uvicorn_handler(signum, frame)

        signal.signal(signal.SIGTERM, on_sigterm)
        yield


app = FastAPI(lifespan=lifespan)


@app.get("/threads/{thread_id}/events")
async def events(thread_id: str) -> StreamingResponse:
    thread = app.state.store.thread(thread_id)

    async def lines() -> AsyncIterator[str]:
        yield ": connected\n\n"
        async with thread.watch() as stream:
            async for event in stream:
                yield f"id: {event.cursor}\nevent: {event.kind}\n\n"

    return StreamingResponse(lines(), media_type="text/event-stream")
