--- @include "includes/numbers"
--- @include "includes/layout2_format"
--- @include "includes/layout2_chunks"
-- Layout 2's finding of a message (docs/LAYOUT.md): a chunk's manifest, which container holds
-- a sequence, where a record lies in a chunk. The reads of the read-only scripts (walks, page
-- plans, lookups) are includes/layout2_reads.lua's; the member formats
-- includes/layout2_format.lua's; writing a chunk includes/layout2_chunks.lua's; storing into
-- the open chunk (layout 3) includes/layout3_store.lua's; moving a layout-2 window into chunks
-- includes/layout3_migration.lua's; deleting the oldest chunks includes/layout2_retention.lua's;
-- the index token totals includes/layout2_index.lua's; edits in place
-- includes/layout2_edit.lua's.

-- Finds where a sequence is stored in layouts 2 and 3: 'window' (a layout-2 leftover), 'large'
-- (with its first sequence and index member), 'open' (the open chunk: with its manifest) or
-- 'chunk' (with its first sequence and index member); nil when it is not stored there.
--
-- Normal chunks are listed in the chunk index, a sorted set scored by a chunk's first sequence.
-- Oversized single-message chunks are listed apart, in the large index, so normal chunks keep
-- disjoint, ordered ranges. A message's side info lives in the window side hash while the
-- message is in the window, and in its chunk's manifest (the open chunk's included) otherwise.
local function locate(keys, sequence)
  if redis.call('HEXISTS', keys.window_side, sequence) == 1 then
    return 'window'
  end
  local large = redis.call('ZRANGE', keys.large_index, sequence, sequence, 'BYSCORE', 'LIMIT', 0, 1)[1]
  if large then
    return 'large', sequence, large
  end
  local open = redis.call('HMGET', keys.meta, 'open_first', 'open_last')
  if sequence >= tonumber(open[1] or '0') and sequence <= tonumber(open[2] or '-1') then
    local manifest = redis.call('GET', keys.open_manifest) or ''
    if manifest_find(manifest, sequence) then return 'open', nil, nil, manifest end
    return nil
  end
  local member = redis.call('ZRANGE', keys.chunk_index, sequence, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)[1]
  if member then
    local first, last = parse_chunk_member(member)
    if last >= sequence and manifest_find(chunk_manifest(keys, first), sequence) then
      return 'chunk', first, member
    end
  end
  return nil
end

-- Where a sequence's record lies in a chunk's data: 1-based start, length, and the manifest
-- line's bounds (at, stop); nil when the manifest does not list it.
local function chunk_slot(manifest, sequence)
  local offset, wanted = 1, fmt(sequence)
  for line_sequence, side, at, stop in manifest_lines(manifest) do
    local _, _, _, bytes = parse_side(side)
    if not bytes then return nil end
    if line_sequence == wanted then return offset, bytes, at, stop end
    offset = offset + bytes
  end
  return nil
end
