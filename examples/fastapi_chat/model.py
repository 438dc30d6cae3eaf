"""The example's fake model: it calls a weather tool, then answers, streaming each part as it
goes. Every id it gives is derived from the turn's id, so a retry that takes the turn over
(hold_turn_for) stores each message once: what the first run stored is a replay."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from typing import Any

from kvstore import AssistantMessage, ToolCall, ToolCallMessage, ToolReturn, ToolReturnMessage
from kvstore.events import TurnLease
from kvstore.messages import ToolCallDelta

# The pause between two fragments of the fake model's output.
TOKEN_DELAY = float(os.environ.get("FAKE_MODEL_DELAY", "0.01"))
ANSWER = "It is sunny and 21 degrees."


def turn_ids(turn_id: str, part: str) -> dict[str, str]:
    """The id and otid of one of the turn's messages."""
    return {
        "id": f"message-{uuid.uuid5(uuid.NAMESPACE_URL, f'{turn_id}/{part}')}",
        "otid": f"{turn_id}/{part}",
    }


def city(question: str) -> str:
    """The question's last word as the city asked about; any text has one (a question of no
    words, blank or "?", asks about Paris)."""
    words = question.split()
    return (words[-1].strip("?") if words else "") or "Paris"


async def fake_model(thread: Any, lease: TurnLease, question: str) -> None:
    """Publishes the tool call's arguments, stores the call and the tool's return, then
    publishes and stores the answer."""
    call = turn_ids(lease.turn_id, "call")
    call_id = "call-" + call["id"][-12:]
    arguments = json.dumps({"city": city(question)})
    for i in range(0, len(arguments), 6):
        delta = ToolCallDelta(
            name="weather" if i == 0 else None,
            tool_call_id=call_id if i == 0 else None,
            arguments=arguments[i : i + 6],
        )
        await thread.publish(lease, ToolCallMessage(id=call["id"], tool_call=delta))
        await asyncio.sleep(TOKEN_DELAY)
    tool_call = ToolCall(name="weather", arguments=arguments, tool_call_id=call_id)
    await thread.append(ToolCallMessage(**call, tool_call=tool_call), turn_id=lease)
    weather = "sunny, 21 C"
    returned = ToolReturn(tool_call_id=call_id, status="success", tool_return=weather)
    await thread.append(
        ToolReturnMessage(
            **turn_ids(lease.turn_id, "return"),
            tool_return=weather,
            status="success",
            tool_call_id=call_id,
            tool_returns=[returned],
        ),
        turn_id=lease,
    )
    answer = turn_ids(lease.turn_id, "answer")
    for word in ANSWER.split(" "):
        await thread.publish(lease, AssistantMessage(id=answer["id"], content=word + " "))
        await asyncio.sleep(TOKEN_DELAY)
    await thread.append(AssistantMessage(**answer, content=ANSWER), turn_id=lease)
