--- @include "includes/checks"
--- @include "includes/format"
-- The stored layout, as the scripts know it: which layout a thread is in (and which this version
-- reads and writes), the thread's keys and their types, a chunk's key and manifest, which
-- container holds a sequence, where a record lies in a chunk, and a chunk's records in a range.
-- Scripts and the other includes ask these functions instead of naming keys, chunk fields or
-- layout numbers themselves.
--
-- Layouts (docs/LAYOUT.md): 1, the legacy hash (read as it is and migrated, includes/
-- migration.lua); 2, the window, the chunks and their indexes (the one written). The member
-- formats are includes/format.lua's; writing a chunk and its size classes includes/chunks.lua's;
-- moving the window into chunks includes/rollover.lua's; deleting the oldest chunks
-- includes/retention.lua's.

-- The layout every write leaves a thread in, and the layouts this version reads.
local CURRENT_LAYOUT = '2'
local READ_LAYOUTS = {['1'] = true, ['2'] = true}

-- The thread's keys, named once from KEYS (every script takes the same twelve). KEYS is passed
-- in: a script's is a global, a library function's is its argument.
local function thread_keys(KEYS)
  return {
    meta = KEYS[1], window = KEYS[2], window_side = KEYS[3], chunk_index = KEYS[4],
    large_index = KEYS[5], ids = KEYS[6], otids = KEYS[7], turns = KEYS[8], legacy = KEYS[9],
    chunk_prefix = KEYS[10], events = KEYS[11], pairs = KEYS[12],
  }
end

-- A chunk's key: the prefix KEYS[10] and the chunk's first sequence (a number, or the text of
-- one as a score reads).
local function chunk_key(keys, first)
  if type(first) == 'string' then return keys.chunk_prefix .. first end
  return keys.chunk_prefix .. fmt(first)
end

-- A chunk's manifest (its field `_m`; includes/format.lua reads it), '' for no chunk.
local function chunk_manifest(keys, first)
  return redis.call('HGET', chunk_key(keys, first), '_m') or ''
end

-- The refusal of a thread whose meta `layout` reads `layout` when this version does not read
-- that layout; nil for one it reads, or for a new thread (no layout).
local function unreadable_layout(layout)
  if layout and not READ_LAYOUTS[layout] then
    return redis.error_reply('KVS_LAYOUT thread is stored in layout ' .. layout .. ', this version reads layouts 1 and 2')
  end
  return nil
end

-- Fails unless the thread is missing or in a layout this version reads (layout 1 it migrates),
-- and is not being deleted, nor restored (unless `restoring_ok`: the restore's own calls).
local function check_layout(meta_key, restoring_ok)
  local meta = redis.call('HMGET', meta_key, 'layout', 'deleting', 'restoring')
  if meta[2] then return deleting_error() end
  if meta[3] and not restoring_ok then return restoring_error() end
  return unreadable_layout(meta[1])
end

-- Fails unless every key is missing or of its type, and the thread's layout is one this version
-- reads (and the thread writable: check_layout).
local function check_thread(keys, restoring_ok)
  return check_key_types({
    {keys.meta, 'hash'}, {keys.window, 'zset'}, {keys.window_side, 'hash'},
    {keys.chunk_index, 'zset'}, {keys.large_index, 'zset'}, {keys.ids, 'hash'},
    {keys.otids, 'hash'}, {keys.turns, 'hash'}, {keys.legacy, 'hash'}, {keys.pairs, 'zset'},
  }) or check_layout(keys.meta, restoring_ok)
end

-- Whether a thread whose meta `layout` reads `layout` (false or nil: none) holds layout-1 data:
-- a thread from before meta named its layout has only the legacy hash.
local function holds_legacy(keys, layout)
  if layout == '1' then return true end
  return not layout and redis.call('EXISTS', keys.legacy) == 1
end

-- Whether the thread is stored in layout 1 (wholly or in part).
local function is_layout_1(keys)
  return holds_legacy(keys, redis.call('HGET', keys.meta, 'layout'))
end

-- Finds where a sequence is stored in layout 2: 'window', 'large' (with its index member) or
-- 'chunk' (with its first sequence and index member); nil when it is not stored there.
--
-- Normal chunks are listed in the chunk index, a sorted set scored by a chunk's first sequence.
-- Oversized single-message chunks are listed apart, in the large index, so normal chunks keep
-- disjoint, ordered ranges. A message's side info lives in the window side hash while the
-- message is in the window and in its chunk's manifest afterwards.
local function locate(keys, sequence)
  if redis.call('HEXISTS', keys.window_side, sequence) == 1 then
    return 'window'
  end
  local large = redis.call('ZRANGE', keys.large_index, sequence, sequence, 'BYSCORE', 'LIMIT', 0, 1)[1]
  if large then
    return 'large', sequence, large
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

-- Appends to `out` the records of chunk `first` (normal or oversized) inside (lo, hi), as
-- {sequence, record, tokens}; returns how many and their tokens (0, 0 for no chunk).
local function chunk_records(keys, first, lo, hi, out)
  local found = redis.call('HMGET', chunk_key(keys, first), '_m', 'd')
  local manifest, data = found[1], found[2]
  if not manifest or not data then return 0, 0 end
  local offset, count, tokens = 1, 0, 0
  for line_sequence, side in manifest_lines(manifest) do
    local _, _, _, bytes, _, m_tokens = parse_side(side)
    if not bytes then break end
    local sequence = tonumber(line_sequence)
    if sequence > lo and sequence < hi then
      out[#out + 1] = {sequence, string.sub(data, offset, offset + bytes - 1), m_tokens}
      count, tokens = count + 1, tokens + m_tokens
    end
    offset = offset + bytes
  end
  return count, tokens
end
