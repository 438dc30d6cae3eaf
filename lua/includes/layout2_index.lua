--- @include "includes/numbers"
--- @include "includes/layout2_format"
-- The thread's token total, summed over the chunk index, the large index and the window side
-- infos (their formats: includes/layout2_format.lua; where a sequence is: includes/layout2.lua, locate).

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
