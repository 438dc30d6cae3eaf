"""The unit layer: the sans-IO core (kvstore/_engine/core.py) driven with scripted replies.

Each test runs a core operation through tests/unit/driver.py, which checks every request the
operation yields (the script and the arguments that matter, or a Batch's commands) and answers
it with a reply built the way the server builds it (tests/unit/layout.py holds a thread as
docs/LAYOUT.md lays it out and answers native reads from it) or with a typed error thrown in.
No server, no client, no socket: the layer runs in a few seconds and starts nothing
(tests/unit/conftest.py checks both). What the scripts do on a real server is tested by the
layers above (tests/integration/test_scripts.py, the backend-parametrized tests).
"""
