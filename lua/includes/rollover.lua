--- @include "includes/index"
--- @include "includes/chunks"
-- Moves the oldest window messages into immutable chunks, oldest first, in two steps: a plan
-- made before the call writes anything, and its execution after the call's own writes.
--
-- A chunk is cut only when the window keeps at least `window_size` messages after the cut, so a
-- newest page of up to `window_size` messages is always one native read of the window. A chunk
-- holds at most `chunk_size` messages and `chunk_max_bytes` of records (always at least one).
-- A call moves at least as many messages as it adds to the window, in as many chunks as that
-- takes (its batch is bounded by max_batch_messages and max_batch_bytes), then at most
-- `max_move_chunks` chunks and `max_move_bytes` bytes more; what is left moves in later calls.
-- So no call leaves more than window_size + chunk_size - 1 messages in a window that held at
-- most that many, and a window that holds more shrinks with every call.

-- Whether the window, with `added` messages of `added_bytes` more, may need a cut at all: the
-- cheap test most calls stop at (no server call).
local function cut_possible(limits, count, window_bytes)
  if count - 1 < limits.window_size then return false end
  return count - limits.window_size >= limits.chunk_size or window_bytes > limits.chunk_max_bytes
end

-- Plans the cuts from the oldest window records and the incoming ones ({sequence, bytes,
-- record}), reading only the window records it cuts (and at most a chunk's worth more), and
-- checks that no key sits where a chunk will be written. Returns the cuts, each a list of
-- {sequence, bytes, record}, with `owed` the number of the first cuts that move the call's own
-- additions; or nil and an error reply.
local function plan_rollover(keys, limits, meta, incoming)
  local stored = meta.window_count
  local count = stored + #incoming
  local window_bytes = meta.window_bytes
  for _, item in ipairs(incoming) do window_bytes = window_bytes + item[2] end
  local cuts = {owed = 0}
  if not cut_possible(limits, count, window_bytes) then return cuts end

  -- The i-th oldest message: the window's are read a chunk's worth at a time, as the cuts reach
  -- them; the incoming ones follow.
  local total, entries = count, {}
  local function entry(i)
    if i > stored then return incoming[i - stored] end
    if i > #entries then
      local oldest = redis.call('ZRANGE', keys.window, #entries, math.min(#entries + limits.chunk_size, stored) - 1, 'WITHSCORES')
      for j = 1, #oldest, 2 do entries[#entries + 1] = {tonumber(oldest[j + 1]), #oldest[j], oldest[j]} end
    end
    return entries[i]
  end

  local position, moved, extra_chunks, extra_bytes = 1, 0, 0, 0
  while cut_possible(limits, count, window_bytes) do
    -- Once the call's own additions are planned, what is left is under the per-call cap.
    local owed = moved < #incoming
    if not owed and extra_chunks >= limits.max_move_chunks then break end
    local cut, bytes = {}, 0
    while #cut < limits.chunk_size and position + #cut <= total do
      local item = entry(position + #cut)
      if #cut > 0 and bytes + item[2] > limits.chunk_max_bytes then break end
      cut[#cut + 1] = item
      bytes = bytes + item[2]
    end
    if count - #cut < limits.window_size then break end
    if not owed then
      if extra_chunks > 0 and extra_bytes + bytes > limits.max_move_bytes then break end
      extra_chunks = extra_chunks + 1
      extra_bytes = extra_bytes + bytes
    end
    local chunk_key = keys.chunk_prefix .. fmt(cut[1][1])
    if redis.call('EXISTS', chunk_key) == 1 then
      return nil, redis.error_reply('KVS_WRONGTYPE ' .. chunk_key .. ' exists where a new chunk must go')
    end
    cuts[#cuts + 1] = cut
    if owed then cuts.owed = #cuts end
    position = position + #cut
    moved = moved + #cut
    count = count - #cut
    window_bytes = window_bytes - bytes
  end
  return cuts
end

-- Executes the planned cuts; returns the number of chunks written. When this call's migration
-- step moved chunks (`migrated` > 0), that step took the per-call cap, and only the cuts that
-- move the call's own additions run.
local function rollover(keys, cuts, migrated)
  local limit = #cuts
  if migrated > 0 then limit = cuts.owed end
  local written = 0
  for _, cut in ipairs(cuts) do
    if written >= limit then break end
    local records, fields, bytes = {}, {}, 0
    for i, item in ipairs(cut) do
      fields[i] = fmt(item[1])
      bytes = bytes + item[2]
      records[i] = item[3]
    end
    local sides = redis.call('HMGET', keys.window_side, unpack(fields))
    local manifest, media = {}, 0
    for i, side in ipairs(sides) do
      manifest[i] = manifest_line(cut[i][1], side)
      local _, _, message_media = parse_side(side)
      media = media + message_media
    end
    local first, last = cut[1][1], cut[#cut][1]
    write_chunk(keys, first, table.concat(manifest), table.concat(records))
    redis.call('ZADD', keys.chunk_index, fields[1], chunk_index_member(first, last, #cut, bytes, media))
    redis.call('ZREMRANGEBYSCORE', keys.window, fields[1], fields[#cut])
    redis.call('HDEL', keys.window_side, unpack(fields))
    redis.call('HINCRBY', keys.meta, 'window_bytes', -bytes)
    written = written + 1
  end
  if written > 0 then
    redis.call('HINCRBY', keys.meta, 'gen', 1)
  end
  return written
end
