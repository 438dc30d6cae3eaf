"""The engine internals the benchmarks measure: every import of kvstore's engine in benchmarks/ is here.

The benchmarks drive kvstore through its public API (``kvstore``, ``kvstore.messages``) and,
where they time part of an operation alone, through the engine's one entry point,
``kvstore._engine.core``: ``ThreadRef``, ``append`` and ``list_page`` build an operation's
requests (``Eval``, ``Batch``) before the clock starts, so a script or a pipeline is timed alone,
and ``prepare_batch`` is an append's client side, timed alone. The core does not export the few
names below. The core and these are imported here and nowhere else in benchmarks/:

- ``encode_record`` (kvstore/_engine/record.py): a message's record bytes, so the baselines (raw
  HSET, the bare 4-write script, HMGET) store the very bytes kvstore stores (append,
  server_cost, encode), and encode times the encoding alone;
- ``decode_records`` (record.py): a page's records into messages, timed alone by encode;
- ``record_body`` (record.py's ``_record_body``): one record's message dict before validation,
  so encode can time the unpacking and the validation of a page apart;
- ``ChunkEntry`` (kvstore/_engine/layout/formats.py): a chunk index member parsed, so
  server_cost knows how many messages a chunk holds (one append in that many also moves a chunk);
- ``record`` and ``request_command`` (kvstore/_engine/executor.py, the executor's hooks): the
  requests an operation sends, recorded so that each can be replayed and timed alone, and the
  command a store sends for one (FCALL, FCALL_RO or EVALSHA), for redis-benchmark;
  ``sent_command`` is that command as the store's driver hands it to redis-py (``wire``:
  kvstore/_engine/drivers.py), so a replay is packed as the store packs it.
"""

from kvstore._engine import core
from kvstore._engine.core import Batch, Eval
from kvstore._engine.drivers import wire
from kvstore._engine.executor import record, request_command
from kvstore._engine.layout.formats import ChunkEntry
from kvstore._engine.record import _record_body as record_body
from kvstore._engine.record import decode_records, encode_record


def sent_command(store: object, request: Eval) -> list[object]:
    """The command `store` sends for `request`, as its driver hands it to redis-py."""
    return wire(request_command(store, request))


__all__ = [
    "Batch",
    "ChunkEntry",
    "Eval",
    "core",
    "decode_records",
    "encode_record",
    "record",
    "record_body",
    "request_command",
    "sent_command",
]
