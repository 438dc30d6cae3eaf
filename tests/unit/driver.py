"""Drives a core operation against scripted replies, the way an executor would, with no client.

A test lists the requests it expects, in order, each with its answer::

    result = drive(
        core.append(thread, message, None),
        call("append", {"turn_id": "", "lease": 0}, error=errors.InlineMediaBudget(0)),
        call("append", reply=[1, 7]),
    )

- ``call(name, args, reply=..., error=...)`` expects an ``Eval`` of the script ``name``;
  ``args`` is ``{name: value}`` for the arguments that matter (by the names the script's header
  gives them), the whole argument list as sent, or a function of that list that asserts (or
  returns False to fail).
- ``batch(commands, reply=..., error=...)`` expects a ``Batch``; ``commands`` is the whole list
  of commands, or a function of it.
- ``reply`` is the value sent back, or a function of the request that returns it; ``error`` is
  thrown into the operation instead (a typed error, as an executor throws it).
- ``repeat(*steps, times=None)`` expects the steps again and again (``times=None``: as often as
  the operation asks; what is left unused at the end is no failure).

A request that no step answers, a request other than the next step's, and steps left over when
the operation has returned (or raised) fail the test with a message naming both sides. Each step
keeps the requests it answered (``step.requests``, the last one as ``step.request``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvstore._engine.core import Batch, Eval, Operation, gathering

__all__ = ["Repeat", "Step", "batch", "call", "collect", "describe", "drive", "repeat"]


@dataclass(eq=False)
class Step:
    kind: str  # "eval" or "batch"
    name: str | None = None
    args: Any = None
    commands: Any = None
    reply: Any = None
    error: BaseException | None = None
    requests: list[Eval | Batch] = field(default_factory=list)

    @property
    def request(self) -> Eval | Batch:
        assert self.requests, f"{self.describe()} answered no request"
        return self.requests[-1]

    def describe(self) -> str:
        if self.kind == "eval":
            what = f"Eval {self.name}"
            if isinstance(self.args, Mapping):
                what += " with " + ", ".join(f"{name}={_short(v)}" for name, v in self.args.items())
            elif self.args is not None and not callable(self.args):
                what += f" with args {_short(tuple(self.args))}"
            return what
        if self.commands is None or callable(self.commands):
            return "a Batch"
        return "a Batch of\n" + "\n".join(f"      {_short(tuple(c))}" for c in self.commands)

    def answer(self, request: Eval | Batch) -> Any:
        return self.reply(request) if callable(self.reply) else self.reply


@dataclass(eq=False)
class Repeat:
    steps: tuple[Step, ...]
    times: int | None


def call(
    name: str, args: Any = None, *, reply: Any = None, error: BaseException | None = None
) -> Step:
    return Step("eval", name=name, args=args, reply=reply, error=error)


def batch(commands: Any = None, *, reply: Any = None, error: BaseException | None = None) -> Step:
    return Step("batch", commands=commands, reply=reply, error=error)


def repeat(*steps: Step, times: int | None = None) -> Repeat:
    return Repeat(steps, times)


def _short(value: Any, width: int = 60) -> str:
    if isinstance(value, bytes) and len(value) > width:
        return repr(value[:width]) + f"...({len(value)} bytes)"
    if isinstance(value, tuple):
        return (
            "("
            + ", ".join(_short(v, width) for v in value)
            + ("," if len(value) == 1 else "")
            + ")"
        )
    text = repr(value)
    return text if len(text) <= 2 * width else text[: 2 * width] + "..."


def describe(request: Any) -> str:
    """A request as a test failure shows it."""
    if isinstance(request, Eval):
        return f"Eval {request.script.name} with args {_short(tuple(request.args))}"
    if isinstance(request, Batch):
        return "a Batch of\n" + "\n".join(f"      {_short(tuple(c))}" for c in request.commands)
    return f"{type(request).__name__} {_short(request)} (neither an Eval nor a Batch)"


class _Steps:
    """The scripted steps in order, a Repeat unrolled lazily; knows which ones must still come."""

    def __init__(self, steps: Iterable[Step | Repeat]) -> None:
        self._items: Iterator[tuple[Step, bool]] = self._unroll(steps)
        self._peeked: tuple[Step, bool] | None = None
        self.used = 0

    @staticmethod
    def _unroll(steps: Iterable[Step | Repeat]) -> Iterator[tuple[Step, bool]]:
        for step in steps:
            if isinstance(step, Repeat):
                count = 0
                while step.times is None or count < step.times:
                    for inner in step.steps:
                        yield inner, step.times is not None
                    count += 1
            else:
                yield step, True

    def next(self) -> Step | None:
        item = self._peeked or next(self._items, None)
        self._peeked = None
        if item is None:
            return None
        self.used += 1
        return item[0]

    def left(self) -> list[Step]:
        """The steps that must still come (a bounded list: an endless repeat is never owed)."""
        if self._peeked is None:
            self._peeked = next(self._items, None)
        owed = []
        if self._peeked is not None and self._peeked[1]:
            owed.append(self._peeked[0])
            owed += [step for step, required in self._items if required]
        return owed


def _check(step: Step, request: Any, number: int, keys: Sequence[str] | None) -> None:
    def mismatch(why: str) -> None:
        pytest.fail(
            f"request {number}: {why}\n  expected: {step.describe()}\n  sent:     {describe(request)}",
            pytrace=False,
        )

    if step.kind == "eval":
        if not isinstance(request, Eval) or request.script.name != step.name:
            mismatch(f"expected a call of {step.name}.lua")
        if keys is not None and tuple(request.keys) != tuple(keys):
            mismatch(f"the call's keys are {tuple(request.keys)}, not the thread's")
        args = tuple(request.args)
        if isinstance(step.args, Mapping):
            named = request.named()
            for name, expected in step.args.items():
                if name not in named:
                    mismatch(f"{step.name}.lua takes no argument {name}")
                if named[name] != expected:
                    mismatch(f"{name} is {_short(named[name])}, not {_short(expected)}")
        elif callable(step.args):
            if step.args(args) is False:
                mismatch("the arguments do not pass the step's check")
        elif step.args is not None and args != tuple(step.args):
            mismatch("the arguments differ")
    else:
        if not isinstance(request, Batch):
            mismatch("expected a Batch")
        commands = [tuple(c) for c in request.commands]
        if callable(step.commands):
            if step.commands(commands) is False:
                mismatch("the commands do not pass the step's check")
        elif step.commands is not None and commands != [tuple(c) for c in step.commands]:
            mismatch("the commands differ")


def drive(operation: Operation, *steps: Step | Repeat, keys: Sequence[str] | None = None) -> Any:
    """Runs `operation` against the scripted steps and returns its result (or raises what it
    raises). `keys`, if given, must be the keys of every script call (the thread's)."""
    script = _Steps(steps)
    number = 0
    failure: Exception | None = None
    try:
        request = next(operation)
        while True:
            number += 1
            step = script.next()
            if step is None:
                pytest.fail(
                    f"request {number} was not scripted (the test scripted {number - 1}):\n"
                    f"  sent:     {describe(request)}",
                    pytrace=False,
                )
            _check(step, request, number, keys)
            step.requests.append(request)
            if step.error is not None:
                request = operation.throw(step.error)
            else:
                request = operation.send(step.answer(request))
    except StopIteration as done:
        result = done.value
    except Exception as exc:  # whatever the operation raised is raised again below
        failure = exc
    # Outside the except clauses: a failure here is reported alone, not chained to StopIteration.
    _nothing_left(
        script, "returned" if failure is None else f"raised {type(failure).__name__}: {failure}"
    )
    if failure is not None:
        raise failure
    return result


def _nothing_left(script: _Steps, ended: str) -> None:
    left = script.left()
    if left:
        pytest.fail(
            f"the operation {ended} after {script.used} requests; {len(left)} scripted steps"
            " never came:\n" + "\n".join(f"  {step.describe()}" for step in left),
            pytrace=False,
        )


def collect(
    operation: Any, *steps: Step | Repeat, keys: Sequence[str] | None = None
) -> tuple[Any, list[Any]]:
    """Drives an operation that also yields outputs (core.pages) through core.gathering;
    returns its result and the outputs, in order."""
    outputs: list[Any] = []
    result = drive(gathering(operation, outputs.append), *steps, keys=keys)
    return result, outputs
