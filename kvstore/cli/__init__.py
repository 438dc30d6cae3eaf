"""The command line (``kvstore …``) and the development server it starts.

- ``main.py``: the argument parser and the dispatch of each subcommand;
- ``commands.py``: opening a store, inspect, migrate;
- ``backup.py``: export and import (a thread's backup and restore), with ``progress.py``;
- ``demo/``: the demo's four scenes;
- ``process.py``: the one class that starts a server process (also used by the tests and the
  benchmarks);
- ``server.py``: the embedded Valkey that owns a data dir, built on it.
"""
