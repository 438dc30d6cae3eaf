"""A mixed fleet: a worker of the previous release (layout 2) meets a thread this release made
layout 3. Every write it tries is refused (LayoutError) before it writes anything; the thread is
left byte for byte as it was (docs/MIGRATING.md)."""

from __future__ import annotations

from kvstore import UserMessage

from ..reliability.test_interrupted_steps import raw_state
from ..support.old_release import run_previous
from .test_migration_2_to_3 import old_thread

# Each write of the previous release's public API, on thread "t".
WRITES = {
    "append": 't.append(UserMessage(content="from an old worker"))',
    "append a replay": 't.append(UserMessage(content="again", id="message-old-1"))',
    "compact": 't.compact("old summary", 3)',
    "replace": 't.replace("message-old-2", UserMessage(content="replaced"))',
    "remove_turn": 't.remove_turn("turn-0")',
    "start_turn": 't.start_turn("turn-new")',
    "finish_turn": 't.finish_turn("turn-0")',
    "migrate": "t.migrate()",
}


def test_an_old_worker_is_refused_every_write_and_changes_nothing(
    make_thread, raw_client, namespace, server, server_only
):
    config = dict(window_size=8, chunk_size=4)
    old_thread(server, namespace, "t", 20, **config)
    thread = make_thread("t", **config)
    thread.append(UserMessage(content="made layout 3 by this release"))
    assert thread.stats().layout_version == 3
    before = raw_state(raw_client, thread)
    for name, call in WRITES.items():
        code = f"t = store.thread('t')\n{call}\n"
        result = run_previous(server.url, {"namespace": namespace, **config}, code)
        if name == "start_turn" and result is None:
            continue  # the previous release has no such call: nothing to refuse
        assert isinstance(result, dict) and result.get("error") == "LayoutError", (name, result)
        assert "layout 3" in result["message"], (name, result)
        assert raw_state(raw_client, thread) == before, name
