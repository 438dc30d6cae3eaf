"""The CLI's inspect, export and import reach the engine through kvstore/admin.py only, and that
surface names every call it documents."""

from __future__ import annotations

import re
from pathlib import Path

from kvstore import admin

CLI = Path(admin.__file__).parent / "cli"


def test_the_cli_commands_import_no_engine_module():
    for name in ("commands.py", "backup.py", "backup_file.py"):
        source = (CLI / name).read_text(encoding="utf-8")
        assert not re.search(r"^\s*(from|import)\s+\S*_engine", source, re.M), name


def test_every_name_admin_exports_is_documented_in_its_docstring():
    doc = admin.__doc__ or ""
    missing = [name for name in admin.__all__ if name not in doc]
    assert not missing, f"kvstore/admin.py's docstring does not name {missing}"
