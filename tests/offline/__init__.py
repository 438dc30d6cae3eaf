"""Tests that need no server: the message and record formats, the OpenAI conversions, the public
API's documentation and docs/LAYOUT.md against the code (the in-memory store at most)."""
