--- @include "includes/numbers"
--- @include "includes/layout2_format"
--- @include "includes/layout2"
--- @include "includes/layout2_chunks"
-- Layout 2's and layout 3's reads for the read-only scripts (docs/LAYOUT.md): a chunk's records in a range, the
-- walk over every container of a range (window, oversized messages, chunks, and the legacy
-- hash of a thread migrating from layout 1: lua/read_range.lua), the index reads of a page plan
-- (lua/page_plan.lua), a snapshot's container sizes, and a lookup's keys and container
-- (lua/locate.lua). Apart from includes/layout2.lua so that the writing scripts, which include
-- that, do not define these on each call (EVALSHA runs the whole script).

-- Appends to `out` the records of chunk `first` (normal or oversized, layout-3 strings or a
-- layout-2 hash; the open chunk when `first` is 'open') inside (lo, hi), as
-- {sequence, record, tokens}; returns how many and their tokens (0, 0 for no chunk).
local function chunk_records(keys, first, lo, hi, out)
  local manifest, data
  if first == 'open' then manifest, data = read_open(keys) else manifest, data = read_chunk(keys, first) end
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

-- The containers of layout 2 (and the legacy range legacy_first..legacy_last, 0..0 for none)
-- overlapping (lo, hi), as units {first, last, kind} in walk order (`up` or down): window
-- messages ('w', with their record and tokens), oversized messages ('l'), chunks ('c') and
-- the legacy range ('h'); `need` and `max_tokens` as walk_range's.
local function range_units(keys, lo, hi, up, need, max_tokens, legacy_first, legacy_last)
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
  -- Layout 3's open chunk (the newest messages but oversized ones).
  local open = redis.call('HMGET', keys.meta, 'open_first', 'open_last', 'open_count')
  local open_first, open_last = tonumber(open[1] or '0'), tonumber(open[2] or '0')
  if tonumber(open[3] or '0') > 0 and open_last > lo and open_first < hi then
    units[#units + 1] = {first = open_first, last = open_last, kind = 'o'}
  end
  if up then
    table.sort(units, function(x, y) return x.first < y.first end)
  else
    table.sort(units, function(x, y) return x.last > y.last end)
  end
  return units
end

-- The records of a walk over (lo, hi), in walk order, as {sequence, record, tokens}: the one
-- read of whole containers (lua/read_range.lua). Units (window messages, oversized messages,
-- chunks, the open chunk, the legacy range legacy_first..legacy_last, 0..0 for none) are taken
-- in walk order until their records in the range hold `need` (or pass max_tokens); all but
-- oversized messages hold disjoint spans, so every record not taken lies past the units taken,
-- but for an oversized message inside a taken unit's span, which is taken too.
local function walk_range(keys, lo, hi, walk, need, max_tokens, legacy_first, legacy_last)
  local records = {}
  if hi - lo <= 1 then return records end
  local up = walk == 'up'
  local units = range_units(keys, lo, hi, up, need, max_tokens, legacy_first, legacy_last)
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
    elseif unit.kind == 'o' then
      n, t = chunk_records(keys, 'open', lo, hi, taken)
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

-- What a page plan over (lo, hi) reads of the containers (lua/page_plan.lua): the chunk index
-- member at or below lo (walking up; '' for none), the chunk index members inside the range (at
-- most max_chunks + 1, in walk order), the large index members inside it (at most `need`), and
-- the window's part in the range: its lowest and highest sequence there and its count (0, 0, 0
-- for none).
local function plan_containers(keys, lo, hi, walk, need, max_chunks)
  local below, above, large, window = '', {}, {}, {0, 0, 0}
  if hi - lo > 1 then
    local l, h = '(' .. fmt(lo), '(' .. fmt(hi)
    if walk == 'up' then
      below = redis.call('ZRANGE', keys.chunk_index, lo, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)[1] or ''
      above = redis.call('ZRANGE', keys.chunk_index, l, h, 'BYSCORE', 'LIMIT', 0, max_chunks + 1)
      large = redis.call('ZRANGE', keys.large_index, l, h, 'BYSCORE', 'LIMIT', 0, need)
    else
      above = redis.call('ZRANGE', keys.chunk_index, h, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, max_chunks + 1)
      large = redis.call('ZRANGE', keys.large_index, h, l, 'BYSCORE', 'REV', 'LIMIT', 0, need)
    end
    local count = redis.call('ZCOUNT', keys.window, l, h)
    if count > 0 then
      local low = redis.call('ZRANGE', keys.window, l, h, 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
      local high = redis.call('ZRANGE', keys.window, h, l, 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')
      window = {tonumber(low[2]), tonumber(high[2]), count}
    end
  end
  return below, above, large, window
end

-- Appends to `reply` the sizes of the thread's containers, for a snapshot (lua/read_range.lua):
-- the window's messages, the chunk index's and the large index's members, the legacy hash's
-- fields.
local function add_container_sizes(keys, reply)
  reply[#reply + 1] = redis.call('ZCARD', keys.window)
  reply[#reply + 1] = redis.call('ZCARD', keys.chunk_index)
  reply[#reply + 1] = redis.call('ZCARD', keys.large_index)
  reply[#reply + 1] = redis.call('HLEN', keys.legacy)
end

-- The keys a lookup by id, otid or sequence reads (lua/locate.lua), with their types; the otid
-- index too when `by_otid`.
local function located_key_types(keys, by_otid)
  local checked = {
    {keys.meta, 'hash'}, {keys.window_side, 'hash'}, {keys.chunk_index, 'zset'},
    {keys.large_index, 'zset'}, {keys.ids, 'hash'}, {keys.legacy, 'hash'},
    {keys.open_manifest, 'string'},
  }
  if by_otid then checked[#checked + 1] = {keys.otids, 'hash'} end
  return checked
end

-- Where a sequence is stored: 'legacy' (a layout-1 message not yet migrated), else as locate.
local function locate_stored(keys, sequence)
  if redis.call('HEXISTS', keys.legacy, sequence) == 1 then return 'legacy' end
  return locate(keys, sequence)
end
