"""The check of free-form JSON (event_data, unknown fields): its quick path (messages._plain_json)
against the full walk. The quick path only ever says "valid"; where it does, the walk agrees,
and the check as a whole accepts and refuses exactly what the walk does, with the same text."""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore import messages
from kvstore.messages import MAX_JSON_DEPTH, MAX_JSON_INT_BITS, _check_json, _plain_json


class Text(str):
    pass


class Number(int):
    pass


def walk_verdict(value, monkeypatch) -> str | None:
    """What the full walk alone says: None (valid) or the error's text."""
    with monkeypatch.context() as patched:
        patched.setattr(messages, "_plain_json", lambda node, depth: False)
        return verdict(value)


def verdict(value) -> str | None:
    try:
        _check_json(value, "the field")
    except ValueError as exc:
        return str(exc)
    return None


def nested(depth: int, leaf=1, kind=list):
    value = leaf
    for _ in range(depth):
        value = [value] if kind is list else {"k": value}
    return value


leaves = (
    st.none()
    | st.booleans()
    | st.text(max_size=8)
    | st.integers(-(2 ** (MAX_JSON_INT_BITS + 8)), 2 ** (MAX_JSON_INT_BITS + 8))
    | st.sampled_from([2**MAX_JSON_INT_BITS - 1, 2**MAX_JSON_INT_BITS, -(2**MAX_JSON_INT_BITS)])
    | st.floats()  # NaN and infinities among them
    | st.sampled_from([b"x", {1, 2}, (1,), Text("t"), Number(3), 1j])
)
values = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=4) | st.integers(0, 3), children, max_size=4)
        | st.builds(OrderedDict, st.dictionaries(st.text(max_size=4), children, max_size=3))
    ),
    max_leaves=16,
)


@settings(max_examples=500, deadline=None)
@given(value=values)
def test_the_check_says_what_the_walk_says(value) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        expected = walk_verdict(value, monkeypatch)
    if _plain_json(value, 1):
        assert expected is None
    assert verdict(value) == expected


@pytest.mark.parametrize("kind", [list, dict])
def test_the_depth_bound_is_the_walks(kind, monkeypatch) -> None:
    for depth in (MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 3 * MAX_JSON_DEPTH):
        value = nested(depth, kind=kind)
        assert verdict(value) == walk_verdict(value, monkeypatch), depth
    assert verdict(nested(MAX_JSON_DEPTH, kind=kind)) is None
    assert "nests deeper" in verdict(nested(MAX_JSON_DEPTH + 1, kind=kind))


def test_what_the_quick_path_leaves_to_the_walk(monkeypatch) -> None:
    for value in (math.nan, math.inf, 2**MAX_JSON_INT_BITS, {1: "x"}, [b"x"], Text("t")):
        assert not _plain_json(value, 1)
        assert verdict(value) == walk_verdict(value, monkeypatch)
    assert verdict(Text("t")) is None and verdict([Number(1)]) is None
