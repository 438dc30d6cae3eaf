"""The integration layer: the library on real servers (the embedded Valkey, Debian's Redis and any
other server kind of the matrix, tests/support/servers.py) and on fakeredis where a test allows it,
through the public API, the CLI, the scripts as built and the example app."""
