"""The bounds of the numbers that cross into Lua, checked with no server (the rest, end to end,
in tests/integration/test_number_bounds.py): each StoreConfig int at its largest is taken and one more is
refused; token counts, leases and watch numbers likewise."""

from __future__ import annotations

import dataclasses

import pytest

from kvstore import StoreConfig, errors
from kvstore._engine.bounds import (
    EXACT,
    MAX_MESSAGE_TOKENS,
    MAX_SEQUENCE,
    MAX_THREAD_TOKENS,
    MAX_WAIT_MS,
    check_lease,
    check_watch,
)
from kvstore._engine.prepare import prepare_batch
from kvstore._engine.replies import stored_int
from kvstore._engine.tokens import checked_tokens, counted
from kvstore.limits import CONFIG_MAXIMA


def largest(name: str) -> dict[str, int]:
    """The config values that let `name` be at its largest (the others it must not pass)."""
    values = {name: CONFIG_MAXIMA[name]}
    if name == "max_inline_part_bytes":
        values["max_inline_media_bytes"] = CONFIG_MAXIMA["max_inline_media_bytes"]
    if name == "chunk_max_bytes":
        values["max_bytes_per_call"] = CONFIG_MAXIMA["chunk_max_bytes"]
    return values


@pytest.mark.parametrize("name", sorted(CONFIG_MAXIMA))
def test_each_config_int_takes_its_largest_and_refuses_one_more(name):
    assert getattr(StoreConfig(**largest(name)), name) == CONFIG_MAXIMA[name]
    with pytest.raises(errors.ConfigError, match=name):
        StoreConfig(**{**largest(name), name: CONFIG_MAXIMA[name] + 1})
    with pytest.raises(errors.ConfigError, match=name):
        StoreConfig(**{**largest(name), name: 10**30})


def test_every_config_int_has_a_bound_and_every_bound_keeps_sums_exact():
    config = StoreConfig()
    ints = {
        field.name
        for field in dataclasses.fields(config)
        if isinstance(getattr(config, field.name), int)
        and not isinstance(getattr(config, field.name), bool)
    }
    ints.add("retained_message_limit")
    ints.add("thread_ttl")
    assert ints == set(CONFIG_MAXIMA)
    # The milliseconds the scripts compute (1.5 times a ttl or an event age) stay exact.
    assert 1.5 * CONFIG_MAXIMA["thread_ttl"] * 1000 < EXACT
    assert 1.5 * CONFIG_MAXIMA["events_max_age"] * 1000 < EXACT
    # A thread's media total and one batch's stay exact, and so does a token total and a batch.
    assert CONFIG_MAXIMA["max_inline_media_bytes"] + CONFIG_MAXIMA["max_batch_bytes"] < EXACT
    assert MAX_THREAD_TOKENS + CONFIG_MAXIMA["max_batch_messages"] * MAX_MESSAGE_TOKENS < EXACT
    assert MAX_SEQUENCE + CONFIG_MAXIMA["max_batch_messages"] < EXACT
    # Every number a side info or an index member holds is written in digits by %.14g too.
    assert MAX_MESSAGE_TOKENS * CONFIG_MAXIMA["chunk_size"] < 10**14
    assert CONFIG_MAXIMA["max_inline_media_bytes"] < 10**14


@pytest.mark.parametrize("tokens", [0, MAX_MESSAGE_TOKENS])
def test_a_token_count_at_its_edges_is_taken(tokens):
    assert checked_tokens(tokens, "m") == tokens
    assert counted(lambda message: tokens, None, "m") == tokens
    (item,) = prepare_batch(
        StoreConfig(), {"message_type": "user_message", "content": "x"}, None, tokens
    )
    assert item.tokens == tokens


@pytest.mark.parametrize("tokens", [-1, MAX_MESSAGE_TOKENS + 1, 10**14, 10**30, 2.0, True])
def test_a_token_count_past_its_edges_is_refused(tokens):
    with pytest.raises(errors.InvalidMessage):
        checked_tokens(tokens, "m")
    with pytest.raises(errors.InvalidMessage, match="token counter"):
        counted(lambda message: tokens, None, "m")
    with pytest.raises(errors.InvalidMessage):
        prepare_batch(
            StoreConfig(), [{"message_type": "user_message", "content": "x"}], None, [tokens]
        )


def test_a_lease_and_the_numbers_of_a_watch_at_their_edges():
    assert check_lease(MAX_SEQUENCE) == MAX_SEQUENCE
    for lease in (0, -1, MAX_SEQUENCE + 1, 1.0, True, "1"):
        with pytest.raises(errors.InvalidMessage):
            check_lease(lease)
    # A cursor's incarnation (the server's time in µs, past 2**50) is no position: not bounded.
    for after in (
        None,
        0,
        MAX_SEQUENCE,
        str(MAX_SEQUENCE),
        f"{MAX_SEQUENCE}-{MAX_SEQUENCE}",
        f"3-{MAX_SEQUENCE}@1796294387070130",
        f"{MAX_SEQUENCE}@1796294387070130",
    ):
        check_watch(after, MAX_WAIT_MS)
    check_watch(None, 0)
    for after, block_ms in (
        (MAX_SEQUENCE + 1, 0),
        (f"1-{MAX_SEQUENCE + 1}", 0),
        ("9" * 5000, 0),
        (f"1-{MAX_SEQUENCE + 1}@1796294387070130", 0),
        (None, -1),
        (None, MAX_WAIT_MS + 1),
        (None, 1.5),
        (None, None),
    ):
        with pytest.raises(errors.InvalidCursor):
            check_watch(after, block_ms)


@pytest.mark.parametrize("value", [b"12", "12", b"-3", 12])
def test_a_stored_number_reads(value):
    assert stored_int(value, "x") in (12, -3)


@pytest.mark.parametrize(
    "value", [b"1e+14", b"1.0000000000000000e+30", b"", b" 1", b"1" * 20, "twelve", None, 1.5]
)
def test_a_stored_value_that_is_no_number_is_a_record_error(value):
    with pytest.raises(errors.RecordError, match="meta field tokens"):
        stored_int(value, "meta field tokens")


def test_a_backup_past_the_sequence_bound_is_refused_before_the_socket():
    from kvstore import UserMessage
    from kvstore._engine import core
    from kvstore._engine.operation import ThreadRef

    ref = ThreadRef.of(StoreConfig(), "chat")
    at_edge = core.restore_run(
        ref, [core.BackedUpMessage(MAX_SEQUENCE, None, UserMessage(id="m", content="x"))]
    )
    assert next(at_edge).named()["first"] == MAX_SEQUENCE  # the call goes out
    past = core.restore_run(
        ref, [core.BackedUpMessage(MAX_SEQUENCE + 1, None, UserMessage(id="m", content="x"))]
    )
    with pytest.raises(errors.InvalidMessage, match="sequence"):
        next(past)
    assert (
        next(core.restore_state(ref, core.BackupState(last_seq=MAX_SEQUENCE))).named()["last_seq"]
        == MAX_SEQUENCE
    )
    for state in (
        core.BackupState(last_seq=MAX_SEQUENCE + 1),
        core.BackupState(last_seq=1, summary_last=10**30),
        core.BackupState(turns=[core.TurnRecord("t", 1, "open", 0, 0, 0, 0, 10**14 * 10**6)]),
    ):
        with pytest.raises(errors.InvalidMessage, match="not one a backup holds"):
            next(core.restore_state(ref, state))
