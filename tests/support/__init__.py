"""Support code shared by the test layers: the test servers (servers.py), a sync face on async
threads (facade.py), the reference model (model.py), the layout invariants of docs/LAYOUT.md
(layout_check.py), the scripts' headers as data (script_headers.py) and the live-tail test's
worker processes (watch_workers.py)."""
