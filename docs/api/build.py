"""Builds the API reference (HTML) from the docstrings with pdoc; fails on any warning.

    pip install -e ".[docs]" && python docs/api/build.py [OUTPUT_DIR]   # default: build/api

The reference documents the public modules only; the engine (``kvstore._engine``) and the
command line are internal. The output is not kept in the repository (build/ is ignored).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pdoc
import pdoc.render

# The package (its page lists kvstore.__all__, kvstore.errors included) and the modules that
# define those names, which hold a few more (ToolCallDelta, Attachment, MESSAGE_ADAPTER …).
MODULES = [
    "kvstore",
    "kvstore.store",
    "kvstore.thread",
    "kvstore.messages",
    "kvstore.models",
    "kvstore.config",
    "kvstore.convert",
    "kvstore.importers",
]


def main(argv: list[str]) -> int:
    output = Path(argv[1] if len(argv) > 1 else "build/api")
    pdoc.render.configure(docformat="restructuredtext", show_source=False, search=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*MODULES, output_directory=output)
    # Only pdoc's own warnings count: a dependency's deprecation notice is not the reference's.
    found = [
        w
        for w in caught
        if w.filename.startswith(str(Path(pdoc.__file__).parent))
        or not issubclass(w.category, DeprecationWarning)
    ]
    for warning in found:
        print(f"warning: {warning.message}", file=sys.stderr)
    pages = sorted(path.name for path in output.rglob("*.html"))
    print(f"{len(pages)} pages in {output}: {', '.join(pages)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
