"""kvstore's benchmarks: each module measures kvstore against baselines in one run.

- ``append``: append and newest-page latency against raw redis-py commands and the JSON list;
- ``server_cost``: server time per append and per page (INFO commandstats) against native baselines;
- ``memory``: memory per stored message, and a compacted thread's memory over 2,000 turns;
- ``throughput``: appends per second from 1, 2 and 4 processes, against the server's ceiling;
- ``encode``: where an append's and a page's time goes (validation, encoding, round trip);
- ``peers`` (optional): llama-index's and LangChain's Redis chat stores beside kvstore.

Run them all with ``python -m benchmarks`` (``--quick`` for CI), or one with
``python -m benchmarks.<name>``. Results are written as JSON and PNG plots under
``benchmarks/results/`` (git-ignored). docs/BENCHMARKS.md explains what each figure means.

What they share: ``_common`` (messages, interleaved timing, command counts, the per-server
fixture, ratios, JSON output), ``_machine`` (the machine described), ``_servers`` (the embedded
servers), ``_plots`` (the PNG plots), ``_key_kinds`` (a thread's keys by kind, and their memory)
and ``_engine`` (the engine internals measured beyond ``kvstore._engine.core``).
"""
