"""How an imported message is named and what of its source it keeps: ids made from the source,
and the source fields without a kvstore equivalent, split over metadata values."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from .. import errors

Source = Literal["langchain", "llamaindex", "openai_agents"]
"""The chat histories an import reads."""

_FIELD_PIECE = 512  # messages.MAX_METADATA_VALUE_CHARS
_FIELD_PIECES = 14  # 16 metadata pairs, less `source` and `source_position`
SOURCE_FIELDS_MAX = _FIELD_PIECE * _FIELD_PIECES
"""The most characters of a source message's fields kvstore keeps in its metadata."""

# Ids of imported messages: uuid5 of (source, key, position, part, digest of the session up to
# the message) in this namespace.
_IMPORT_IDS = uuid.UUID("5d0f3b8e-7a2c-4f61-b9e4-3c8a1d6e2f70")


def message_id(kind: Source, key: str, position: int, part: int, digest: bytes) -> str:
    """The id of part `part` of the source message at `position` (digest: of the session up to it)."""
    return f"message-{uuid.uuid5(_IMPORT_IDS, f'{kind}:{position}:{part}:{digest.hex()}:{key}')}"


def split_fields(fields: dict[str, Any], key: str, position: int) -> dict[str, str]:
    """The source fields as compact JSON, split over ``source_fields``, ``source_fields_2`` …"""
    try:
        text = json.dumps(fields, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise errors.InvalidMessage(
            f"{key}, message {position}: a field holds a NaN or infinite number, which JSON"
            " cannot carry"
        ) from None
    if len(text) > SOURCE_FIELDS_MAX:
        raise errors.InvalidMessage(
            f"{key}, message {position}: its fields without a kvstore equivalent take {len(text):,} characters"
            f" of JSON; at most {SOURCE_FIELDS_MAX:,} fit in a message's metadata"
        )
    pieces = [text[start : start + _FIELD_PIECE] for start in range(0, len(text), _FIELD_PIECE)]
    return {
        ("source_fields" if number == 1 else f"source_fields_{number}"): piece
        for number, piece in enumerate(pieces, 1)
    }


def joined_fields(metadata: Mapping[str, str] | None) -> dict[str, Any]:
    """The source fields split_fields kept in a message's metadata, or {}."""
    if not metadata or "source_fields" not in metadata:
        return {}
    text = metadata["source_fields"]
    number = 2
    while f"source_fields_{number}" in metadata:
        text += metadata[f"source_fields_{number}"]
        number += 1
    fields: dict[str, Any] = json.loads(text)  # split_fields wrote a JSON object
    return fields


# --- LangChain --------------------------------------------------------------------------------
