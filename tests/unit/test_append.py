"""append and the turn calls as requests: the arguments lua/append.lua's header names, the inline
media refit after KVS_MEDIA_OVER, replay replies read back by sequence, and OutcomeUnknown
carrying the messages as sent."""

from __future__ import annotations

import pytest

from kvstore import AssistantMessage, UserMessage, errors
from kvstore._engine import core
from kvstore._engine.core import prepare_batch
from kvstore._engine.record import decode_records, record_turn_id
from kvstore.messages import ImageContent, TextContent

from .driver import call, drive
from .layout import seqs

fit_media = getattr(core, "fit_media", None) or core._fit_media


def image(decoded_bytes: int) -> dict:
    """An inline base64 image part of exactly that many decoded bytes (padded base64 text)."""
    padding = -decoded_bytes % 3
    data = "A" * (4 * ((decoded_bytes + 2) // 3) - padding) + "=" * padding
    return {"type": "image", "source": {"type": "base64", "data": data, "media_type": "image/png"}}


def sent(request) -> list[tuple[str, str, int, bytes]]:
    """(id, otid, media, record) of each message an append sends (the `messages` argument of
    lua/append.lua, whose tokens sent_tokens reads)."""
    args = request.named()
    assert args["pairs"] == ""  # no pairs without strict history checks
    return [(i, o, m, r) for i, o, m, _, r in args["messages"]]


def sent_tokens(request) -> list[int]:
    """The token count of each message an append sends."""
    return [tokens for _, _, _, tokens, _ in request.named()["messages"]]


def stored(record: bytes, seq: int = 1):
    (message,) = decode_records([(seq, record)])
    return message


# ------------------------------------------------------------------------- the call


def test_an_append_sends_the_limits_the_turn_and_each_message(thread):
    messages = [UserMessage(content="hi", otid="o-1"), AssistantMessage(content="hello")]
    step = call("append", {"lease": 0}, reply=[1, 41])
    result = drive(core.append(thread, messages, "turn-7"), step, keys=thread.script_keys)
    args = step.request.named()
    assert args["limits"] == thread.limits()
    assert args["turn_id"] == "turn-7" and len(args["messages"]) == 2
    groups = sent(step.request)
    # The ids the store made are set on the caller's messages: the call's token.
    assert [g[0] for g in groups] == [m.id for m in messages] and all(m.id for m in messages)
    assert [g[1] for g in groups] == ["o-1", ""]
    assert [g[2] for g in groups] == [0, 0]
    assert [stored(g[3]).id for g in groups] == [m.id for m in messages]
    assert {record_turn_id(g[3]) for g in groups} == {"turn-7"}
    assert seqs(result) == [41, 42] and not result.replayed
    assert [m.id for m in result] == [m.id for m in messages]


def test_a_dict_message_gets_its_id_too(thread):
    body = {"message_type": "user_message", "content": "as a dict"}
    step = call("append", reply=[1, 3])
    (message,) = drive(core.append(thread, body, None), step)
    assert body["id"] == message.id == sent(step.request)[0][0]
    assert step.request.named()["turn_id"] == ""


# ------------------------------------------------------------------------- media refit


def test_media_over_budget_resends_with_the_messages_own_inline_parts_replaced(thread):
    picture = UserMessage(content=[{"type": "text", "text": "look"}, image(3000)])
    plain = UserMessage(content="no media here")
    over, again = call("append", error=errors.InlineMediaBudget(1000)), call("append", reply=[1, 7])
    result = drive(core.append(thread, [picture, plain], "turn-1"), over, again)

    before, after = sent(over.request), sent(again.request)
    assert [g[2] for g in before] == [3000, 0]
    assert sum(g[2] for g in after) <= 1000
    assert [g[0] for g in after] == [g[0] for g in before]  # same ids: still the same call
    assert len(after[0][3]) < len(before[0][3])
    assert after[1] == before[1]  # the message without media is sent as it was
    assert record_turn_id(after[0][3]) == "turn-1"
    refit = stored(after[0][3]).content
    assert refit[0] == TextContent(text="look")
    assert isinstance(refit[1], TextContent) and "3000 bytes" in refit[1].text
    assert seqs(result) == [7, 8] and result[0].content == refit
    # The caller's own message keeps its image.
    assert isinstance(picture.content[1], ImageContent)


def test_fit_media_strips_only_the_messages_over_what_the_ones_before_left(config):
    batch = prepare_batch(
        config,
        [
            UserMessage(content=[image(1000)]),
            UserMessage(content=[image(1500)]),
            UserMessage(content=[image(400)]),
        ],
        None,
    )
    fitted = fit_media(batch, 1500, None)
    # First to last: the first fits (500 left), the second does not and loses its part, the
    # third fits in what is left and is sent whole.
    assert [item.media for item in fitted] == [1000, 0, 400]
    assert fitted[0].record == batch[0].record and fitted[2].record == batch[2].record
    assert [type(p).__name__ for p in fitted[1].message.content] == ["TextContent"]
    assert [item.message.id for item in fitted] == [item.message.id for item in batch]


def test_fit_media_strips_only_as_many_parts_as_needed(config):
    (item,) = prepare_batch(config, [UserMessage(content=[image(1500), image(1500)])], None)
    (fitted,) = fit_media([item], 2000, None)
    assert fitted.media == 1500
    assert [type(p).__name__ for p in fitted.message.content] == ["TextContent", "ImageContent"]
    assert fitted.message.id == item.message.id


# ------------------------------------------------------------------------- replays


def replayed(thread, fake, resent, reply):
    """An append whose call the server answers as a replay with `reply`, then the read-back."""
    targets = [str(sequence) for sequence in reply[1::2]]
    return drive(
        core.append(thread, resent, None),
        call("append", reply=reply),
        fake.located(*targets),
        fake.fetch(),
    )


def test_a_replay_reads_back_what_the_first_call_stored(thread, fake):
    fake.append(6)  # the first call stored m5 and m6 (content "message 5", "message 6")
    resent = [
        UserMessage(id="m5", content="sent again 5"),
        UserMessage(id="m6", content="sent again 6"),
    ]
    result = replayed(thread, fake, resent, [0, 5, b"m5", 6, b"m6"])
    assert result.replayed
    assert seqs(result) == [5, 6]
    assert [m.content for m in result] == ["message 5", "message 6"]


def test_a_replayed_message_retention_deleted_comes_back_by_its_stored_id_and_sequence(
    thread, fake
):
    fake.append(8)
    fake.remove(3, 4)  # stored by the first call, deleted by retention before this read
    # Sent again by otid, with ids of a new call: the stored ones differ.
    resent = [
        UserMessage(content="again a", otid="o-a"),
        UserMessage(content="again b", otid="o-b"),
    ]
    result = replayed(thread, fake, resent, [0, 3, b"m3", 4, b""])
    assert result.replayed and seqs(result) == [3, 4]
    # Named by the stored id where the reply gives one, else by the id sent; content as sent.
    assert [m.id for m in result] == ["m3", resent[1].id]
    assert [m.content for m in result] == ["again a", "again b"]


def test_outcome_unknown_carries_the_messages_as_sent(thread):
    messages = [UserMessage(content="one"), UserMessage(content="two", otid="o-2")]
    step = call("append", error=errors.OutcomeUnknown("the connection dropped"))
    with pytest.raises(errors.OutcomeUnknown) as raised:
        drive(core.append(thread, messages, None), step)
    carried = raised.value.messages
    assert [m.id for m in carried] == [m.id for m in messages] == [g[0] for g in sent(step.request)]
    assert [m.otid for m in carried] == [None, "o-2"]
    assert [m.content for m in carried] == ["one", "two"]


def test_a_failed_read_back_of_a_replay_is_outcome_unknown_with_the_messages(thread):
    messages = [UserMessage(id="m5", content="five")]
    lost = errors.ServerError("the read could not reach the server")
    with pytest.raises(errors.OutcomeUnknown, match=r"re-send|Re-send") as raised:
        drive(
            core.append(thread, messages, None),
            call("append", reply=[0, 5, b"m5"]),
            call("locate", error=lost),
        )
    assert [m.id for m in raised.value.messages] == ["m5"]
    assert raised.value.__cause__ is lost


def test_a_reply_of_another_shape_is_a_server_error_naming_the_script(thread):
    with pytest.raises(errors.ServerError, match=r"append\.lua"):
        drive(core.append(thread, UserMessage(content="x"), None), call("append", reply=[2, 1]))


# ------------------------------------------------------------------------- turns


def test_start_turn_returns_where_the_replies_start(thread):
    step = call(
        "start_turn",
        {"limits": thread.limits(), "turn_id": "turn-1", "mode": "start", "call_id": ""},
        reply=12,
    )
    assert drive(core.start_turn(thread, "turn-1"), step) == 12


def test_finish_turn_returns_the_recorded_result(thread):
    step = call(
        "finish_turn",
        {"limits": thread.limits(), "turn_id": "turn-1", "lease": 0, "outcome": "cancelled"},
        reply=[3, 12, 15, 12, b"completed"],
    )
    result = drive(core.finish_turn(thread, "turn-1", "cancelled"), step)
    # A finished turn answers with the outcome its first finish recorded.
    assert (result.turn_id, result.outcome, result.reply_count) == ("turn-1", "completed", 3)
    assert (result.first_sequence, result.last_sequence) == (12, 15)
    empty = drive(
        core.finish_turn(thread, "turn-2", "failed"),
        call("finish_turn", reply=[0, 0, 0, 9, b"failed"]),
    )
    assert empty.reply_count == 0 and empty.first_sequence is None and empty.last_sequence is None


def test_finish_turn_of_an_unknown_turn_raises_turn_not_found(thread):
    with pytest.raises(errors.TurnNotFound):
        drive(
            core.finish_turn(thread, "t", "completed"),
            call("finish_turn", error=errors.TurnNotFound("t")),
        )


def test_a_replay_that_names_fewer_messages_than_were_sent_is_a_server_error(thread):
    messages = [UserMessage(id="m5", content="five"), UserMessage(id="m6", content="six")]
    with pytest.raises(errors.ServerError, match=r"append\.lua"):
        drive(core.append(thread, messages, None), call("append", reply=[0, 5, b"m5"]))
