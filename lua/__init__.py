"""The Lua scripts kvstore runs, shipped as package data (read by kvstore._engine.scripts)."""
