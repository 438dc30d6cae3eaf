--- @include "includes/chunks"
-- Moves the oldest window messages into immutable chunks, oldest first, in two steps: a plan
-- made before the call writes anything, and its execution after the call's own writes.
--
-- A chunk is cut only when the window keeps at least `window_size` messages after the cut, so a
-- newest page of up to `window_size` messages is always one native read of the window. A chunk
-- holds at most `chunk_size` messages and `chunk_max_bytes` of records (always at least one).
-- One call moves at most `max_move_chunks` chunks and `max_move_bytes` bytes; what is left moves
-- in later calls.

-- Whether the window, with `added` messages of `added_bytes` more, may need a cut at all: the
-- cheap test most calls stop at (no server call).
local function cut_possible(limits, count, window_bytes)
  if count - 1 < limits.window_size then return false end
  return count - limits.window_size >= limits.chunk_size or window_bytes > limits.chunk_max_bytes
end

-- Plans the cuts from the sizes in the window side info and the incoming window records, without
-- reading any record, and checks that no key sits where a chunk will be written. Returns the
-- cuts as {first, take} pairs, or nil and an error reply.
local function plan_rollover(keys, limits, meta, incoming)
  local count = meta.window_count + #incoming
  local window_bytes = meta.window_bytes
  for _, item in ipairs(incoming) do window_bytes = window_bytes + item[2] end
  if not cut_possible(limits, count, window_bytes) then return {} end

  local sides = redis.call('HGETALL', keys.window_side)
  local entries = {}
  for i = 1, #sides, 2 do
    local _, _, _, bytes = parse_side(sides[i + 1])
    entries[#entries + 1] = {tonumber(sides[i]), bytes}
  end
  table.sort(entries, function(a, b) return a[1] < b[1] end)
  for _, item in ipairs(incoming) do entries[#entries + 1] = item end

  local cuts, position, moved_bytes = {}, 1, 0
  while #cuts < limits.max_move_chunks and cut_possible(limits, count, window_bytes) do
    local take, bytes = 0, 0
    while take < limits.chunk_size and position + take <= #entries do
      local size = entries[position + take][2]
      if take > 0 and bytes + size > limits.chunk_max_bytes then break end
      take = take + 1
      bytes = bytes + size
    end
    if count - take < limits.window_size then break end
    if #cuts > 0 and moved_bytes + bytes > limits.max_move_bytes then break end
    local first = entries[position][1]
    if redis.call('EXISTS', keys.chunk_prefix .. fmt(first)) == 1 then
      return nil, redis.error_reply('KVS_WRONGTYPE ' .. keys.chunk_prefix .. fmt(first) .. ' exists where a new chunk must go')
    end
    cuts[#cuts + 1] = {first, take}
    position = position + take
    count = count - take
    window_bytes = window_bytes - bytes
    moved_bytes = moved_bytes + bytes
  end
  return cuts
end

-- Executes planned cuts; returns the number of chunks written.
local function rollover(keys, cuts)
  for _, cut in ipairs(cuts) do
    local take = cut[2]
    local oldest = redis.call('ZRANGE', keys.window, 0, take - 1, 'WITHSCORES')
    local records, sequences, bytes = {}, {}, 0
    for i = 1, #oldest, 2 do
      records[#records + 1] = oldest[i]
      sequences[#sequences + 1] = oldest[i + 1]
      bytes = bytes + #oldest[i]
    end
    local sides = redis.call('HMGET', keys.window_side, unpack(sequences))
    local manifest, media = {}, 0
    for i, side in ipairs(sides) do
      manifest[i] = manifest_line(tonumber(sequences[i]), side)
      local _, _, message_media = parse_side(side)
      media = media + message_media
    end
    local first, last = tonumber(sequences[1]), tonumber(sequences[take])
    write_chunk(keys, first, table.concat(manifest), table.concat(records))
    redis.call('ZADD', keys.chunk_index, first, chunk_index_member(first, last, take, bytes, media))
    redis.call('ZREMRANGEBYRANK', keys.window, 0, take - 1)
    redis.call('HDEL', keys.window_side, unpack(sequences))
    redis.call('HINCRBY', keys.meta, 'window_bytes', -bytes)
  end
  if #cuts > 0 then
    redis.call('HINCRBY', keys.meta, 'gen', 1)
  end
  return #cuts
end
