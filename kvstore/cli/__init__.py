"""The command line (``kvstore …``) and the development server it starts.

- ``main.py``: the argument parser and the dispatch of each subcommand;
- ``commands.py``: what inspect, export, import, migrate and preload do, over a store;
- ``demo.py``: the demo's worker processes;
- ``process.py``: the one class that starts a server process (also used by the tests and the
  benchmarks);
- ``server.py``: the embedded Valkey that owns a data dir, built on it.
"""
