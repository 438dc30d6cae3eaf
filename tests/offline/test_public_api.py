"""The public API as documentation: the extras it names, each error's HTTP status, docstrings."""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import re
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

from kvstore import AsyncMessageStore, MessageStore, errors

ROOT = Path(__file__).resolve().parents[2]


def extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


@pytest.mark.parametrize("missing", ["fakeredis", "lupa"])
@pytest.mark.parametrize("store", [MessageStore, AsyncMessageStore])
def test_in_memory_without_fakeredis_names_the_extra(monkeypatch, store, missing):
    # Both imported for real first (the test extra installs them): fakeredis imported while lupa is
    # missing would stay without Lua.
    import fakeredis  # noqa: F401
    import lupa  # noqa: F401

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


PUBLIC_MODULES = [
    "kvstore",
    "kvstore.config",
    "kvstore.errors",
    "kvstore.messages",
    "kvstore.models",
    "kvstore.store",
    "kvstore.thread",
    "kvstore.thread_base",
    "kvstore.turns",
    "kvstore.async_thread",
    "kvstore.convert",
    "kvstore.convert_in",
    "kvstore.importers",
    "kvstore.importers.api",
    "kvstore.importers.session",
    "kvstore.importers.records",
    "kvstore.importers.langchain",
    "kvstore.integrations.openai_agents",
    "kvstore.integrations.langchain",
    "kvstore.integrations.llamaindex",
    "kvstore.admin",
]


def public_names(module) -> list[str]:
    if hasattr(module, "__all__"):
        return list(module.__all__)
    tree = ast.parse(inspect.getsource(module))
    defined = [
        target.id if isinstance(target, ast.Name) else target.target.id
        for node in tree.body
        for target in ([node] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", []))
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        and isinstance(target.target if isinstance(target, ast.AnnAssign) else target, ast.Name)
    ]
    defined += [
        node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))
    ]
    return [name for name in defined if not name.startswith("_")]


def documented_variables(module) -> set[str]:
    """Module-level names followed by a string literal: the docstring pdoc shows for them."""
    body = ast.parse(inspect.getsource(module)).body
    found = set()
    for node, after in itertools.pairwise(body):
        if not (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
            and after.value.value.strip()
        ):
            continue
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        found.update(target.id for target in targets if isinstance(target, ast.Name))
    if hasattr(module, "__path__"):  # a package: a name it imports from a submodule is that one's
        for node in body:
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                sub = importlib.import_module(f"{module.__name__}.{node.module}")
                documented = documented_variables(sub)
                found.update(
                    alias.asname or alias.name for alias in node.names if alias.name in documented
                )
    return found


def undocumented() -> list[str]:
    missing = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        if not (module.__doc__ or "").strip():
            missing.append(module_name)
        for name in public_names(module):
            obj = getattr(module, name)
            where = f"{module_name}.{name}"
            if inspect.ismodule(obj):
                continue  # checked as a module of its own
            if inspect.isclass(obj):
                if obj.__module__ != module_name and module_name == "kvstore":
                    continue  # a re-export: checked in the module that defines it
                if not (obj.__dict__.get("__doc__") or "").strip():
                    missing.append(where)
                missing += [f"{where}.{member}" for member in undocumented_members(obj)]
            elif inspect.isfunction(obj):
                if not (obj.__doc__ or "").strip():
                    missing.append(where)
            elif module_name != "kvstore" and name not in documented_variables(module):
                missing.append(where)
    return missing


def undocumented_members(cls: type) -> list[str]:
    """Public methods and properties the class has from the public modules' classes (the
    engine's bases are internal: the store's public methods are its own)."""
    missing = []
    seen = set()
    for owner in cls.__mro__:
        if owner.__module__ not in PUBLIC_MODULES:
            continue
        for member, value in vars(owner).items():
            if member.startswith("_") or member in seen:
                continue
            seen.add(member)
            function = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
            function = function.fget if isinstance(function, property) else function
            if callable(function) and not (getattr(function, "__doc__", None) or "").strip():
                missing.append(member)
    return missing


def test_every_public_name_has_a_docstring():
    assert undocumented() == []


def test_the_docstring_check_sees_a_missing_one(monkeypatch):
    from kvstore import store

    monkeypatch.setattr(store.Thread.stats, "__doc__", None)
    assert "kvstore.thread.Thread.stats" in undocumented()


def test_fastapi_responses_in_the_list_api_shape():
    """docs/API.md, "FastAPI": the default response writes unset fields as null, which the list
    API's schema allows (`name?: string | null`); response_model_exclude_none=True gives the
    shape of to_dict()."""
    from fastapi import FastAPI  # the test extra installs it, with httpx for its TestClient

    with warnings.catch_warnings():  # starlette's notice about which httpx it prefers
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    from kvstore import Message, MessagesPage, UserMessage

    thread = MessageStore.in_memory().thread("api")
    thread.append([UserMessage(content="hi", otid="req-1"), UserMessage(content=[{"text": "x"}])])
    app = FastAPI()

    @app.get("/compact", response_model=MessagesPage, response_model_exclude_none=True)
    def compact() -> MessagesPage:
        return thread.list()

    @app.get("/default", response_model=MessagesPage)
    def default() -> MessagesPage:
        return thread.list()

    @app.get("/message", response_model=Message, response_model_exclude_none=True)
    def message():
        return thread.list().messages[0]

    client = TestClient(app)
    expected = [message.to_dict() for message in thread.list().messages]
    assert client.get("/compact").json()["messages"] == expected
    assert client.get("/message").json() == expected[0]
    written = client.get("/default").json()["messages"]
    assert without_none(written) == expected
    assert written[0]["name"] is None and "name" not in expected[0]

    schema = client.get("/openapi.json").json()["components"]["schemas"]
    user = schema.get("UserMessage-Output", schema.get("UserMessage"))
    for field in ("name", "otid", "seq_id", "metadata"):
        assert field not in user.get("required", [])
        assert {"type": "null"} in user["properties"][field]["anyOf"]


def without_none(value):
    if isinstance(value, dict):
        return {key: without_none(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_none(item) for item in value]
    return value
