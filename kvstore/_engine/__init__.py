"""kvstore's engine: everything between the public store and the server (docs/ARCHITECTURE.md)."""
