"""The public API as documentation: the extras it names, each error's HTTP status, docstrings."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from kvstore import AsyncMessageStore, MessageStore

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
