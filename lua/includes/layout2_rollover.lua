--- @include "includes/layout"
--- @include "includes/layout2_format"
--- @include "includes/layout2_chunks"
--- @include "includes/numbers"
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
-- checks that no key sits where a chunk will be written. Returns the cuts, each {from, count,
-- bytes} over the oldest messages in order (cuts.sequences, cuts.records: parallel lists, not a
-- table per message, since a rollover touches every message it moves), with `owed` the number
-- of the first cuts that move the call's own additions; or nil and an error reply.
local function plan_rollover(keys, limits, meta, incoming)
  local stored = meta.window_count
  local count = stored + #incoming
  local window_bytes = meta.window_bytes
  for _, item in ipairs(incoming) do window_bytes = window_bytes + item[2] end
  local cuts = {owed = 0}
  if not cut_possible(limits, count, window_bytes) then return cuts end
  local sequences, records = {}, {}
  cuts.sequences, cuts.records = sequences, records

  -- Makes the i oldest messages known: the window's are read a chunk's worth at a time, as the
  -- cuts reach them (a window sequence stays the score's text); the incoming ones follow.
  local total, loaded = count, 0
  local function load_through(i)
    while loaded < i do
      if loaded >= stored then
        local item = incoming[loaded - stored + 1]
        loaded = loaded + 1
        sequences[loaded], records[loaded] = fmt(item[1]), item[3]
      else
        local oldest = redis.call('ZRANGE', keys.window, loaded, math.min(loaded + limits.chunk_size, stored) - 1, 'WITHSCORES')
        for j = 1, #oldest, 2 do
          loaded = loaded + 1
          records[loaded], sequences[loaded] = oldest[j], oldest[j + 1]
        end
      end
    end
  end

  local position, moved, extra_chunks, extra_bytes = 1, 0, 0, 0
  while cut_possible(limits, count, window_bytes) do
    -- Once the call's own additions are planned, what is left is under the per-call cap.
    local owed = moved < #incoming
    if not owed and extra_chunks >= limits.max_move_chunks then break end
    local n, bytes = 0, 0
    while n < limits.chunk_size and position + n <= total do
      load_through(position + n)
      local size = #records[position + n]
      if n > 0 and bytes + size > limits.chunk_max_bytes then break end
      n = n + 1
      bytes = bytes + size
    end
    n, bytes = fit_size_class(records, position, n, bytes)
    if count - n < limits.window_size then break end
    if not owed then
      if extra_chunks > 0 and extra_bytes + bytes > limits.max_move_bytes then break end
      extra_chunks = extra_chunks + 1
      extra_bytes = extra_bytes + bytes
    end
    local chunk = chunk_key(keys, sequences[position])
    if redis.call('EXISTS', chunk) == 1 then
      return nil, redis.error_reply('KVS_WRONGTYPE ' .. chunk .. ' exists where a new chunk must go')
    end
    cuts[#cuts + 1] = {position, n, bytes}
    if owed then cuts.owed = #cuts end
    position = position + n
    moved = moved + n
    count = count - n
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
  local sequences, records = cuts.sequences, cuts.records
  for c = 1, limit do
    local from, n, bytes = cuts[c][1], cuts[c][2], cuts[c][3]
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
    redis.call('HINCRBY', keys.meta, 'window_bytes', -bytes)
  end
  if limit > 0 then
    redis.call('HINCRBY', keys.meta, 'gen', 1)
  end
  return limit
end
