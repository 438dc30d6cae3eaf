--- @include "includes/format"
-- The chunk index and the per-message side info (their formats: includes/format.lua).
--
-- Normal chunks are listed in the chunk index, a sorted set scored by a chunk's first sequence.
-- Oversized single-message chunks are listed apart, in the large index, so normal chunks keep
-- disjoint, ordered ranges. A message's side info lives in the window side hash while the message
-- is in the window and in its chunk's manifest afterwards: it is what retention and turn removal
-- need, without unpacking records.

-- Finds where a sequence is stored: 'window', 'large' (with its index member) or 'chunk'
-- (with its first sequence and index member); nil when it is not stored.
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
    if last >= sequence and manifest_find(redis.call('HGET', keys.chunk_prefix .. fmt(first), '_m') or '', sequence) then
      return 'chunk', first, member
    end
  end
  return nil
end

-- The thread's stored tokens summed over its index members and window side infos (what was
-- stored before counts existed counts by bytes_tokens): the meta total of a thread written
-- before meta kept one. Reads every index member once.
local function thread_tokens(keys)
  local total = 0
  for _, member in ipairs(redis.call('ZRANGE', keys.chunk_index, 0, -1)) do
    total = total + (select(6, parse_chunk_member(member)) or 0)
  end
  for _, member in ipairs(redis.call('ZRANGE', keys.large_index, 0, -1)) do
    total = total + (select(4, parse_large_member(member)) or 0)
  end
  local sides = redis.call('HGETALL', keys.window_side)
  for i = 2, #sides, 2 do
    total = total + (select(6, parse_side(sides[i])) or 0)
  end
  return total
end

-- Gives meta its `tokens` total when it has none (a thread written before counts existed), so
-- that a write may add to it or take from it. A write, for after a call's checks.
local function ensure_tokens(keys)
  if redis.call('HEXISTS', keys.meta, 'tokens') == 0 then
    redis.call('HSET', keys.meta, 'tokens', fmt(thread_tokens(keys)))
  end
end
