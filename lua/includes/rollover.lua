--- @include "includes/chunks"
-- Moves the oldest window messages into immutable chunk hashes, oldest first.
--
-- A chunk is cut only when the window keeps at least `window_size` messages after the cut, so a
-- newest page of up to `window_size` messages is always one native read of the window. A chunk
-- holds at most `chunk_size` messages and `chunk_max_bytes` of records (always at least one).
-- One call moves at most `max_chunks` chunks and `max_bytes` bytes; what is left moves in later
-- calls. Returns the number of chunks written.
--
-- The oldest records are read only when a cut is possible: with fewer than window_size +
-- chunk_size messages a cut needs the byte cap to close the chunk early, which meta
-- `window_bytes` rules out cheaply for most calls.
--
-- `count` and `window_bytes` are the window's messages and record bytes as the caller knows them
-- (meta after its writes), so deciding costs no server call.
local function rollover(keys, limits, count, window_bytes)
  local moved_chunks, moved_bytes = 0, 0
  while moved_chunks < limits.max_move_chunks do
    if count - 1 < limits.window_size then break end
    if count - limits.window_size < limits.chunk_size and window_bytes <= limits.chunk_max_bytes then
      break
    end
    local oldest = redis.call('ZRANGE', keys.window, 0, limits.chunk_size - 1, 'WITHSCORES')
    local records, sequences, bytes, take = {}, {}, 0, 0
    for i = 1, #oldest, 2 do
      local size = #oldest[i]
      if take > 0 and bytes + size > limits.chunk_max_bytes then break end
      take = take + 1
      bytes = bytes + size
      sequences[take] = oldest[i + 1]
      records[take] = oldest[i]
    end
    if count - take < limits.window_size then break end
    if moved_chunks > 0 and moved_bytes + bytes > limits.max_move_bytes then break end

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
    window_bytes = window_bytes - bytes
    count = count - take
    moved_chunks = moved_chunks + 1
    moved_bytes = moved_bytes + bytes
  end
  if moved_chunks > 0 then
    redis.call('HINCRBY', keys.meta, 'gen', 1)
  end
  return moved_chunks
end
