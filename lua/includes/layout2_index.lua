--- @include "includes/numbers"
--- @include "includes/layout2_format"
-- The thread's token total, summed over the chunk index, the large index, the open chunk's
-- manifest and the window side infos (their formats: includes/layout2_format.lua; where a
-- sequence is: includes/layout2.lua, locate); the sums of a manifest (the open chunk's meta).

-- A manifest's sums: first and last sequence, count, bytes, media and tokens of its lines (the
-- first and last 0 for an empty one), as an index member sums a chunk.
local function manifest_sums(manifest)
  local first, last, count, bytes, media, tokens = 0, 0, 0, 0, 0, 0
  for sequence, side in manifest_lines(manifest) do
    local _, _, m_media, m_bytes, _, m_tokens = parse_side(side)
    if count == 0 then first = tonumber(sequence) end
    last, count = tonumber(sequence), count + 1
    bytes, media, tokens = bytes + (m_bytes or 0), media + (m_media or 0), tokens + (m_tokens or 0)
  end
  return first, last, count, bytes, media, tokens
end

-- The thread's stored tokens summed over its index members, open chunk and window side infos (what was
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
  return total + select(6, manifest_sums(redis.call('GET', keys.open_manifest) or ''))
end

-- Gives meta its `tokens` total when it has none (a thread written before counts existed), so
-- that a write may add to it or take from it. A write, for after a call's checks.
local function ensure_tokens(keys)
  if redis.call('HEXISTS', keys.meta, 'tokens') == 0 then
    redis.call('HSET', keys.meta, 'tokens', fmt(thread_tokens(keys)))
  end
end
