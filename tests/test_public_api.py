"""The public API as documentation: the extras it names, each error's HTTP status, docstrings."""

from __future__ import annotations

import inspect
import re
import sys
import tomllib
from pathlib import Path

import pytest

from kvstore import AsyncMessageStore, MessageStore, errors

ROOT = Path(__file__).resolve().parent.parent


def extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


@pytest.mark.parametrize("missing", ["fakeredis", "lupa"])
@pytest.mark.parametrize("store", [MessageStore, AsyncMessageStore])
def test_in_memory_without_fakeredis_names_the_extra(monkeypatch, store, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # import of it fails as if not installed
    with pytest.raises(ModuleNotFoundError, match=r'pip install "kvstore\[in-memory\]"') as info:
        store.in_memory()
    assert info.value.name == missing
    assert "fakeredis[lua]" in " ".join(extras()["in-memory"])


def error_classes() -> dict[str, type[errors.KVStoreError]]:
    return {
        name: value
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.KVStoreError)
    }


def test_every_error_class_sets_its_http_status():
    for name, cls in error_classes().items():
        status = cls.__dict__.get("http_status")
        assert isinstance(status, int) and 400 <= status <= 599, name


def test_the_docs_table_of_http_statuses_matches_the_classes():
    table = (ROOT / "docs" / "API.md").read_text().split("## Errors and HTTP statuses", 1)[1]
    rows = re.findall(r"^\| `(\w+)` \| (\d{3}) \|", table, re.M)
    assert len(rows) == len(dict(rows)), "an error is listed twice"
    assert {name: int(status) for name, status in rows} == {
        name: cls.http_status for name, cls in error_classes().items()
    }
