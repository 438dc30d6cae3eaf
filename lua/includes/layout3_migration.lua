--- @include "includes/layout"
--- @include "includes/layout2_format"
--- @include "includes/layout2_chunks"
-- The migration of a layout-2 thread to layout 3 (docs/LAYOUT.md, docs/MIGRATING.md).
--
-- A layout-2 thread becomes layout 3 at its first write by this version: from then on its new
-- messages go into the open chunk, and its window (the zset `window` and the hash `wside`) keeps
-- the older messages it held, every one older than every open-chunk message. Each write then
-- moves a bounded step of them, oldest first, into closed layout-3 chunks (write_chunk) listed in
-- the chunk index, cut as a rollover cuts (chunk_size, chunk_max_bytes, fit_size_class), at most
-- max_move_chunks chunks and max_move_bytes of records per call (always at least one chunk).
-- meta `window_bytes` is what is left: 0 once the window is empty, and at least 1 while it is
-- not, so a write whose meta reads 0 never looks at the window (the hot path pays nothing).
-- Layout-2 hash chunks are never converted: they are read as they are.
--
-- A step plans first (reads only, every target checked to be free) and writes after. A key
-- where a chunk must go (none should be) ends the plan before that chunk: a write's step moves
-- what comes before it and goes on, and lua/migrate.lua refuses with the error once nothing
-- before it is left to move.

-- The next step's cuts over the window's oldest messages, each {from, count, bytes} into the
-- parallel lists cuts.sequences (as the scores read) and cuts.records (no cut when the window is
-- empty); and an error reply when a key sits where the next chunk must go.
local function plan_drain(keys, limits)
  local sequences, records = {}, {}
  local cuts = {sequences = sequences, records = records}
  local count = redis.call('ZCARD', keys.window)
  local position, moved_bytes = 0, 0
  while #cuts < limits.max_move_chunks and position < count do
    local from = #records + 1
    local slice = redis.call('ZRANGE', keys.window, position, position + limits.chunk_size - 1, 'WITHSCORES')
    for j = 1, #slice, 2 do
      records[#records + 1], sequences[#sequences + 1] = slice[j], slice[j + 1]
    end
    local n, bytes = 0, 0
    while from + n <= #records do
      local size = #records[from + n]
      if n > 0 and bytes + size > limits.chunk_max_bytes then break end
      n, bytes = n + 1, bytes + size
    end
    n, bytes = fit_size_class(records, from, n, bytes)
    for i = #records, from + n, -1 do records[i], sequences[i] = nil, nil end
    if #cuts > 0 and moved_bytes + bytes > limits.max_move_bytes then break end
    local first = sequences[from]
    if redis.call('EXISTS', chunk_key(keys, first), chunk_data_key(keys, first), chunk_manifest_key(keys, first)) > 0 then
      for i = #records, from, -1 do records[i], sequences[i] = nil, nil end
      return cuts, redis.error_reply('KVS_WRONGTYPE ' .. chunk_key(keys, first) .. ' exists where a new chunk must go')
    end
    cuts[#cuts + 1] = {from, n, bytes}
    position, moved_bytes = position + n, moved_bytes + bytes
  end
  return cuts
end

-- Writes the planned cuts as closed layout-3 chunks and takes their messages out of the window;
-- returns the number of chunks written. Keeps meta's window_bytes as the header says.
local function run_drain(keys, cuts)
  local sequences, records = cuts.sequences, cuts.records
  for _, cut in ipairs(cuts) do
    local from, n, bytes = cut[1], cut[2], cut[3]
    local last = from + n - 1
    local sides = redis.call('HMGET', keys.window_side, unpack(sequences, from, last))
    local media, tokens = 0, 0
    for i = 1, n do
      local _, _, m_media, _, _, m_tokens = parse_side(sides[i])
      if m_media then media, tokens = media + m_media, tokens + m_tokens end
    end
    local first, final = tonumber(sequences[from]), tonumber(sequences[last])
    write_chunk(keys, first, manifest_of(sequences, sides, from, n), table.concat(records, '', from, last))
    redis.call('ZADD', keys.chunk_index, first, chunk_index_member(first, final, n, bytes, media, tokens))
    redis.call('ZREMRANGEBYSCORE', keys.window, first, final)
    redis.call('HDEL', keys.window_side, unpack(sequences, from, last))
    redis.call('HINCRBY', keys.meta, 'window_bytes', 0 - bytes)
  end
  local left = tonumber(redis.call('HGET', keys.meta, 'window_bytes') or '0')
  if redis.call('EXISTS', keys.window) == 0 then
    if left ~= 0 then redis.call('HSET', keys.meta, 'window_bytes', 0) end
    -- Side infos without a message (none should be) go with the window.
    if redis.call('EXISTS', keys.window_side) == 1 then redis.call('DEL', keys.window_side) end
  elseif left <= 0 then
    redis.call('HSET', keys.meta, 'window_bytes', 1)
  end
  if #cuts > 0 then redis.call('HINCRBY', keys.meta, 'gen', 1) end
  return #cuts
end

-- One step of the 2 -> 3 migration, as a write takes it before storing its batch (only when
-- meta's window_bytes > 0): moves the window's oldest messages; returns the chunks written.
local function drain_window(keys, limits)
  return run_drain(keys, plan_drain(keys, limits))
end
