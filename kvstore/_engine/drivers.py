"""The IO steps an executor's decisions are made of (Send, Pipeline, Sleep), and the two drivers
that make them: SyncDriver calls ``step(store)``, AsyncDriver awaits it. Any generator of steps
can be driven: a store's operations (kvstore/_engine/executor.py) and an import's reads of its
source (kvstore/importers/).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Generator, Sequence
from typing import Any, TypeVar

Steps = Generator[Any, Any, Any]
Result = TypeVar("Result")  # what the steps return


# ------------------------------------------------------------------- the steps


def wire(command: Sequence[Any]) -> list[Any]:
    """The command with each int as its decimal bytes, made here in Python. hiredis's packer
    turns an int into text with a call that runs pending signal handlers and uses its result
    unchecked: a handler raising there (KeyboardInterrupt, a timer's) crashed the process
    (docs/RELIABILITY.md, "Signals"). Made here, the handler's exception reaches the caller."""
    return [b"%d" % arg if type(arg) is int else arg for arg in command]


class Step:
    """One IO step: ``step(store)`` makes it on the store's client and returns the reply, or on
    an asyncio store an awaitable of it. Plain slotted classes: one is made per request."""

    __slots__ = ()

    def __call__(self, store: Any) -> Any:
        raise NotImplementedError


class Send(Step):
    """One command, alone."""

    __slots__ = ("command",)

    def __init__(self, command: Sequence[Any]) -> None:
        self.command = command

    def __call__(self, store: Any) -> Any:
        return store.client.execute_command(*wire(self.command))


class Pipeline(Step):
    """Commands on one pipeline (no transaction); with raise_on_error False, a command's error
    comes back in its reply's place."""

    __slots__ = ("commands", "raise_on_error")

    def __init__(self, commands: Sequence[Sequence[Any]], raise_on_error: bool = True) -> None:
        self.commands, self.raise_on_error = commands, raise_on_error

    def __call__(self, store: Any) -> Any:
        pipe = store.client.pipeline(transaction=False)
        for command in self.commands:
            pipe.execute_command(*wire(command))
        return pipe.execute(raise_on_error=self.raise_on_error)


class Sleep(Step):
    """A pause (time.sleep, or asyncio.sleep awaited)."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, store: Any) -> Any:
        return store._sleep(self.seconds)


# ------------------------------------------------------------------- the drivers
#
# Every driver loop has one shape: send the reply into the steps (or throw the failure in), hand
# out an output or make the step, keep its reply or its exception for the next turn. The four
# are written out rather than sharing a helper that advances the steps: that call would cost
# about 0.2 µs a step, a quarter of the loop's own time, on every request of every store.


class SyncDriver:
    """Makes each step in the calling thread."""

    _sleep = staticmethod(time.sleep)

    def _outputs(self, steps: Steps) -> Steps:
        """Makes the steps, handing out the outputs among them; returns what the steps return."""
        reply: Any = None
        failure: BaseException | None = None
        while True:
            try:
                step = steps.send(reply) if failure is None else steps.throw(failure)
            except StopIteration as done:
                return done.value
            reply = failure = None
            if not isinstance(step, Step):
                yield step
                continue
            try:
                reply = step(self)
            except BaseException as exc:  # thrown into the steps, which may handle it
                failure = exc

    def _finish(self, steps: Generator[Any, Any, Result]) -> Result:
        """Makes the steps of an operation without outputs; returns what they return."""
        reply: Any = None
        failure: BaseException | None = None
        while True:
            try:
                step = steps.send(reply) if failure is None else steps.throw(failure)
            except StopIteration as done:
                result: Result = done.value  # the steps' return value
                return result
            reply = failure = None
            if not isinstance(step, Step):
                continue
            try:
                reply = step(self)
            except BaseException as exc:  # thrown into the steps, which may handle it
                failure = exc


def cancels() -> int:
    """The cancellations of the running task not yet handled (``Task.cancelling``). One that
    grows over an await that returned was swallowed below it: redis-py's asyncio connection
    awaits ``asyncio.wait_for``, which on Python 3.11 returns the result of a command whose
    bytes were sent as the cancellation came, and drops the cancellation. The drivers raise
    it then, so a cancelled call ends as cancelled (docs/RELIABILITY.md, "A timed-out or
    interrupted append is a success or a safe re-send")."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


class AsyncDriver:
    """Awaits each step in the calling task."""

    _sleep = staticmethod(asyncio.sleep)

    async def _outputs(self, steps: Steps) -> AsyncIterator[Any]:
        """Awaits the steps, handing out the outputs among them."""
        reply: Any = None
        failure: BaseException | None = None
        while True:
            try:
                step = steps.send(reply) if failure is None else steps.throw(failure)
            except StopIteration:
                return
            reply = failure = None
            if not isinstance(step, Step):
                yield step
                continue
            pending = cancels()
            try:
                reply = await step(self)
                if cancels() > pending:
                    raise asyncio.CancelledError  # swallowed below (see cancels)
            except BaseException as exc:  # cancellation too: the steps clean up, re-raise
                failure = exc

    async def _finish(self, steps: Generator[Any, Any, Result]) -> Result:
        """Awaits the steps of an operation without outputs; returns what they return."""
        reply: Any = None
        failure: BaseException | None = None
        while True:
            try:
                step = steps.send(reply) if failure is None else steps.throw(failure)
            except StopIteration as done:
                result: Result = done.value  # the steps' return value
                return result
            reply = failure = None
            if not isinstance(step, Step):
                continue
            pending = cancels()
            try:
                reply = await step(self)
                if cancels() > pending:
                    raise asyncio.CancelledError  # swallowed below (see cancels)
            except BaseException as exc:  # cancellation too: the steps clean up, re-raise
                failure = exc
