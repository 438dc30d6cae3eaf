--- @include "includes/checks"
--- @include "includes/format"
-- The stored layout, as the scripts know it: which layout a thread is in, which layouts this
-- version reads and writes, and the part of a layout-1 thread not yet migrated; the thread's keys,
-- their types, its fixed keys and chunk indexes; a chunk's key and manifest; which container
-- holds a sequence; where a record lies in a chunk; a chunk's records in a range; and the walk
-- over every container of a range (window, oversized messages, chunks, legacy hash). Scripts and
-- the other includes ask these functions instead of naming keys, chunk fields or layout numbers
-- themselves.
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

-- The thread's keys but its chunks, meta first (every key the thread's expiry covers).
local function fixed_keys(keys)
  return {keys.meta, keys.window, keys.window_side, keys.chunk_index, keys.large_index,
          keys.ids, keys.otids, keys.turns, keys.legacy, keys.events, keys.pairs}
end

-- The indexes that name the thread's chunks, normal then oversized: a member's score is its
-- chunk's first sequence (chunk_key).
local function chunk_indexes(keys)
  return {keys.chunk_index, keys.large_index}
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

-- The part of a layout-1 thread's legacy hash not yet migrated: its first and last sequences
-- (0, 0 for none), and the thread's last sequence raised to the range's end. `migrated` and
-- `legacy_last` are meta's fields as read. Until the scan (includes/migration.lua) has found the
-- legacy range, meta's last_seq may lag the hash: the range then reaches at least the hash's
-- field count (`field_count` when the caller read it, else read here; a hole reads as nothing).
local function legacy_range(keys, migrated, legacy_last, last_seq, field_count)
  local first = tonumber(migrated or '0') + 1
  local last = tonumber(legacy_last or '') or math.max(last_seq, field_count or redis.call('HLEN', keys.legacy))
  local legacy_first, legacy_end = 0, 0
  if last >= first then legacy_first, legacy_end = first, last end
  return legacy_first, legacy_end, math.max(last, last_seq)
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

-- The records of a walk over (lo, hi), in walk order, as {sequence, record, tokens}: the one
-- read of whole containers (lua/read_range.lua). Units (window messages, oversized messages,
-- chunks, the legacy range legacy_first..legacy_last, 0..0 for none) are taken in walk order until their records in the range
-- hold `need` (or pass max_tokens); chunks are disjoint and older than the window, so every
-- record not taken lies past the units taken, but for an oversized message inside a taken
-- chunk's span, which is taken too.
local function walk_range(keys, lo, hi, walk, need, max_tokens, legacy_first, legacy_last)
  local records = {}
  if hi - lo <= 1 then return records end
  local up = walk == 'up'
  -- With a count to reach, `need` of each kind in walk order suffice (a chunk more: the one
  -- across the range's far bound may hold none of it).
  local limit = (need > 0 and max_tokens == 0) and {'LIMIT', 0, need} or {}
  local chunk_limit = (need > 0 and max_tokens == 0) and {'LIMIT', 0, need + 1} or {}
  local units = {}
  local window
  if up then
    window = redis.call('ZRANGE', keys.window, '(' .. lo, '(' .. hi, 'BYSCORE', 'WITHSCORES', unpack(limit))
  else
    window = redis.call('ZRANGE', keys.window, '(' .. hi, '(' .. lo, 'BYSCORE', 'REV', 'WITHSCORES', unpack(limit))
  end
  local window_sequences = {}
  for i = 2, #window, 2 do window_sequences[#window_sequences + 1] = tonumber(window[i]) end
  -- Side infos a thousand at a time (unpack's stack is bounded; a window may be configured large).
  for from = 1, #window_sequences, 1000 do
    local sides = redis.call('HMGET', keys.window_side, unpack(window_sequences, from, math.min(#window_sequences, from + 999)))
    for i, side in ipairs(sides) do
      local at = from + i - 1
      local record = window[2 * at - 1]
      local tokens = side and select(6, parse_side(side)) or bytes_tokens(#record)
      units[#units + 1] = {first = window_sequences[at], last = window_sequences[at], kind = 'w', record = record, tokens = tokens}
    end
  end
  local large
  if up then
    large = redis.call('ZRANGE', keys.large_index, '(' .. lo, '(' .. hi, 'BYSCORE', unpack(limit))
  else
    large = redis.call('ZRANGE', keys.large_index, '(' .. hi, '(' .. lo, 'BYSCORE', 'REV', unpack(limit))
  end
  for _, member in ipairs(large) do
    local sequence = parse_large_member(member)
    if sequence then units[#units + 1] = {first = sequence, last = sequence, kind = 'l'} end
  end
  -- The chunks overlapping the range: the one starting at or before lo, and those after it.
  local members = redis.call('ZRANGE', keys.chunk_index, lo, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)
  local after
  if up then
    after = redis.call('ZRANGE', keys.chunk_index, '(' .. lo, '(' .. hi, 'BYSCORE', unpack(chunk_limit))
  else
    after = redis.call('ZRANGE', keys.chunk_index, '(' .. hi, '(' .. lo, 'BYSCORE', 'REV', unpack(chunk_limit))
  end
  for _, member in ipairs(after) do members[#members + 1] = member end
  for _, member in ipairs(members) do
    local first, last = parse_chunk_member(member)
    if first and last > lo and first < hi then units[#units + 1] = {first = first, last = last, kind = 'c'} end
  end
  local a, b = math.max(legacy_first, lo + 1), math.min(legacy_last, hi - 1)
  if legacy_last > 0 and a <= b then units[#units + 1] = {first = a, last = b, kind = 'h'} end
  if up then
    table.sort(units, function(x, y) return x.first < y.first end)
  else
    table.sort(units, function(x, y) return x.last > y.last end)
  end

  -- reach: the farthest sequence of the units taken (in walk order); edge: that reach, once
  -- they hold what the walk needs.
  local taken, count, tokens, reach, edge = {}, 0, 0, nil, nil
  local function take(unit)
    local n, t = 0, 0
    if unit.kind == 'w' then
      taken[#taken + 1] = {unit.first, unit.record, unit.tokens}
      n, t = 1, unit.tokens
    elseif unit.kind == 'h' then
      for from = unit.first, unit.last, 1000 do
        local sequences = {}
        for s = from, math.min(unit.last, from + 999) do sequences[#sequences + 1] = s end
        local found = redis.call('HMGET', keys.legacy, unpack(sequences))
        for i, s in ipairs(sequences) do
          if found[i] then
            taken[#taken + 1] = {s, found[i], bytes_tokens(#found[i])}
            n, t = n + 1, t + bytes_tokens(#found[i])
          end
        end
      end
    else
      n, t = chunk_records(keys, unit.first, lo, hi, taken)
    end
    count, tokens = count + n, tokens + t
  end
  for _, unit in ipairs(units) do
    if edge ~= nil then
      -- Past what the walk needs: only an oversized message inside the span taken.
      if unit.kind == 'l' and ((up and unit.first <= edge) or (not up and unit.first >= edge)) then take(unit) end
    else
      take(unit)
      if up then reach = math.max(reach or unit.last, unit.last) else reach = math.min(reach or unit.first, unit.first) end
      if (max_tokens > 0 and tokens > max_tokens) or (max_tokens == 0 and need > 0 and count >= need) then
        edge = reach
      end
    end
  end
  if up then
    table.sort(taken, function(x, y) return x[1] < y[1] end)
  else
    table.sort(taken, function(x, y) return x[1] > y[1] end)
  end
  return taken
end
