"""One test body for both stores: an async thread's methods run to completion on a loop."""

from __future__ import annotations

from typing import Any


class SyncFacade:
    """Runs an async thread's methods to completion so one test body serves both modes."""

    def __init__(self, thread: Any, loop: Any) -> None:
        self._thread = thread
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._thread, name)
        if name == "iter":

            def collect(*args: Any, **kwargs: Any) -> Any:
                async def gather() -> list:
                    return [m async for m in attr(*args, **kwargs)]

                return iter(self._loop.run_until_complete(gather()))

            return collect
        if callable(attr):

            def call(*args: Any, **kwargs: Any) -> Any:
                result = self._loop.run_until_complete(attr(*args, **kwargs))
                if type(result).__name__ == "AsyncThread":  # fork: the new thread, in the same mode
                    return SyncFacade(result, self._loop)
                return result

            return call
        return attr
