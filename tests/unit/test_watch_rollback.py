"""What a watcher remembers of what it delivered, and where a failover's taken-back history
starts (kvstore/_engine/watch_rollback.py)."""

from __future__ import annotations

from kvstore import UserMessage
from kvstore._engine.watch_rollback import RECENT, Delivered


def stored(seq: int, message_id: str) -> UserMessage:
    message = UserMessage(content="x", id=message_id)
    message.seq_id = seq
    return message


def delivered(*pairs: tuple[int, str]) -> Delivered:
    made = Delivered()
    made.add([stored(seq, message_id) for seq, message_id in pairs])
    return made


def test_nothing_changed_when_the_thread_holds_what_was_delivered():
    seen = delivered((1, "a"), (2, "b"), (3, "c"))
    assert seen.first_changed([stored(1, "a"), stored(2, "b"), stored(3, "c")], 3) is None


def test_another_message_at_a_delivered_sequence_is_where_it_changed():
    seen = delivered((1, "a"), (2, "b"), (3, "c"))
    assert seen.first_changed([stored(1, "a"), stored(2, "x"), stored(3, "y")], 3) == 2


def test_a_thread_that_now_ends_before_a_delivered_sequence_changed_there():
    seen = delivered((1, "a"), (2, "b"), (3, "c"))
    assert seen.first_changed([stored(1, "a")], 1) == 2


def test_a_sequence_missing_below_the_end_was_removed_not_taken_back():
    seen = delivered((1, "a"), (2, "b"), (3, "c"))
    assert seen.first_changed([stored(1, "a"), stored(3, "c")], 3) is None


def test_a_sequence_delivered_again_replaces_the_older_delivery():
    seen = delivered((1, "a"), (2, "b"), (3, "c"))
    seen.forget_from(2)
    seen.add([stored(2, "x")])
    assert seen.first_changed([stored(1, "a"), stored(2, "x")], 2) is None
    seen.add([stored(1, "a2")])  # a page from an earlier sequence drops what came after it
    assert seen.oldest == 1 and seen.first_changed([stored(1, "a2")], 1) is None


def test_memory_is_bounded():
    seen = delivered(*[(n, f"m{n}") for n in range(1, RECENT + 51)])
    assert seen.oldest == 51
