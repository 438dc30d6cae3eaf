"""The stored formats as Python reads them (kvstore/_engine/layout/formats.py): index members and
chunk manifests take the usual form by a short path, and everything else exactly as the
documented form says (docs/LAYOUT.md): what the one accepts the other would, and the same
malformed input is the same typed error."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstore import errors
from kvstore._engine.layout.formats import (
    ChunkEntry,
    LargeEntry,
    manifest_tokens,
    record_tokens,
    split_chunk,
)

DOCUMENTED_MEMBER = re.compile(r"[0-9]+(?::[0-9]+)*")


def documented_fields(text: str, counts: tuple[int, ...]) -> list[int] | None:
    """An index member's numbers by its documented form, or None where it is malformed."""
    if not DOCUMENTED_MEMBER.fullmatch(text) or text.count(":") + 1 not in counts:
        return None
    return [int(f) for f in text.split(":")]


members = st.text(alphabet="0123456789:: a+-_١\n", max_size=30)


@given(members, st.booleans())
def test_an_index_member_parses_as_its_documented_form_says(text, as_bytes):
    member = text.encode() if as_bytes else text
    for kind, counts in ((ChunkEntry, (6, 5)), (LargeEntry, (4, 3))):
        expected = documented_fields(text, counts)
        if expected is None:
            with pytest.raises(errors.LayoutError):
                kind.parse(member)
            continue
        if len(expected) == counts[1]:  # written before counts: the rule's count
            expected.append(record_tokens(expected[3 if kind is ChunkEntry else 1]))
        parsed = kind.parse(member)
        assert [getattr(parsed, f) for f in kind.__slots__] == expected


def manifest_of(lines: list[tuple[int, bytes, int | None, bool]]) -> tuple[bytes, bytes]:
    """A manifest and its data: (sequence, record, tokens or None (none stored), escaped)."""
    manifest, data = b"", b""
    for sequence, record, tokens, escaped in lines:
        fields = [str(sequence).encode(), b"id", b"", b"0", str(len(record)).encode(), b"turn"]
        if tokens is not None:
            fields.append(str(tokens).encode())
        if escaped:
            fields.append(b"%")
        manifest += b"\t".join(fields) + b"\n"
        data += record
    return manifest, data


lines = st.lists(
    st.tuples(
        st.integers(1, 10**6),
        st.binary(max_size=20),
        st.none() | st.integers(0, 10**6),
        st.booleans(),
    ),
    max_size=8,
)


@given(lines)
def test_a_chunk_is_split_with_its_counts_in_one_pass(found):
    manifest, data = manifest_of(found)
    tokens: dict[int, int] = {}
    records = split_chunk(manifest, data, tokens)
    assert records == split_chunk(manifest, data)
    assert tokens == manifest_tokens(manifest)
    expected_records = {s: r for s, r, _, _ in found}
    assert records == expected_records
    assert tokens == {s: record_tokens(len(r)) if t is None else t for s, r, t, _ in found}


@pytest.mark.parametrize(
    ("manifest", "data"),
    [
        (b"1\tid\t\t0\t3\tturn\t5", b"abc"),  # the last line not ended
        (b"1\tid\t\t0\t3\tturn\tfive\n", b"abc"),  # a count that is no number
        (b"1\tid\t\t0\t3\n", b"abc"),  # too few fields
        (b"1\tid\t\t0\t3\tturn\t5\textra\t1\n", b"abc"),  # too many
        (b"1\tid\t\t0\t4\tturn\t5\n", b"abc"),  # lengths that do not frame the data
        (b"x\tid\t\t0\t3\tturn\t5\n", b"abc"),  # a sequence that is no number
    ],
)
def test_a_malformed_manifest_is_a_malformed_chunk_with_or_without_counts(manifest, data):
    with pytest.raises(errors.MalformedChunk):
        split_chunk(manifest, data)
    with pytest.raises(errors.MalformedChunk):
        split_chunk(manifest, data, {})


def test_a_chunk_deleted_meanwhile_reads_as_empty():
    tokens: dict[int, int] = {}
    assert split_chunk(None, b"abc", tokens) == {} and tokens == {}
    assert split_chunk(b"1\tid\t\t0\t3\tturn\t5\n", None, tokens) == {} and tokens == {}
