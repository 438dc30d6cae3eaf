--- @include "includes/layout"
--- @include "includes/checks"
--- @include "includes/layout2_format"
--- @include "includes/layout2"
--- @include "includes/layout2_chunks"
-- Layout 2's edits of stored messages in place: a message's replacement (lua/replace.lua) and its
-- removal (lua/remove_turn.lua), wherever `locate` finds it (window, oversized chunk, chunk).
-- Chunks are immutable but for these: a record is spliced into, or cut out of, a chunk's data,
-- and its manifest line likewise; the chunk's index member is written again.

-- The stored message at `sequence`, found at `where` (locate: 'window', 'large' or 'chunk',
-- with its chunk's first sequence and index member), as a table: where, first, member, its
-- chunk's key and manifest (nil in the window), and its side info's fields (id, otid, media,
-- bytes, turn, tokens).
local function stored_message(keys, where, first, member, sequence)
  local chunk = first and (chunk_key(keys, first))
  local side, manifest
  if where == 'window' then
    side = redis.call('HGET', keys.window_side, sequence)
  else
    manifest = redis.call('HGET', chunk, '_m')
    side = manifest_find(manifest, sequence)
  end
  local id, otid, media, bytes, turn, tokens = parse_side(side)
  return {
    where = where, first = first, member = member, chunk = chunk, manifest = manifest,
    id = id, otid = otid, media = media, bytes = bytes, turn = turn, tokens = tokens,
  }
end

-- Fails when a replacement of `bytes` cannot be written where the message is: a window message
-- that will move into its own chunk needs that key free and the large index sound; a chunk
-- of more than one message must stay within chunk_max_bytes. Else nil, and for a chunk its
-- index member's fields (parse_chunk_member), which write_replacement takes.
local function check_replacement_room(keys, limits, message, sequence, bytes)
  if message.where == 'window' and bytes > limits.chunk_max_bytes then
    -- The message will move into its own chunk: that key must be free, the large index sound.
    local type_err = check_key_types({{chunk_key(keys, sequence), 'none'}, {keys.large_index, 'zset'}})
    if type_err then return type_err end
  end
  if message.where == 'chunk' then
    local entry = {parse_chunk_member(message.member)}
    if entry[3] > 1 and entry[4] - message.bytes + bytes > limits.chunk_max_bytes then
      return redis.error_reply(string.format(
        'KVS_TOO_LARGE the replacement (%d bytes) would grow its chunk past chunk_max_bytes (%d)', bytes, limits.chunk_max_bytes))
    end
    return nil, entry
  end
  return nil
end

-- Writes `record` (with `media` and `tokens`) in place of the stored message (stored_message)
-- at `sequence`: in the window, or into its own chunk when it outgrows chunk_max_bytes; in its
-- chunk, spliced. `entry` is check_replacement_room's for a chunk. The thread's sums (bytes,
-- media, tokens) are the caller's; the window's bytes are written here.
local function write_replacement(keys, limits, message, entry, sequence, record, media, tokens)
  local old_bytes = message.bytes
  local new_side = side_info(message.id, message.otid, media, #record, message.turn, tokens)
  if message.where == 'window' then
    redis.call('ZREMRANGEBYSCORE', keys.window, sequence, sequence)
    if #record > limits.chunk_max_bytes then
      redis.call('HDEL', keys.window_side, sequence)
      write_chunk(keys, sequence, manifest_line(sequence, new_side), record)
      redis.call('ZADD', keys.large_index, sequence, large_index_member(sequence, #record, media, tokens))
      redis.call('HINCRBY', keys.meta, 'window_bytes', -old_bytes)
      redis.call('HINCRBY', keys.meta, 'gen', 1)
    else
      redis.call('ZADD', keys.window, sequence, record)
      redis.call('HSET', keys.window_side, sequence, new_side)
      redis.call('HINCRBY', keys.meta, 'window_bytes', #record - old_bytes)
    end
    return
  end
  -- Chunks are immutable but for this: the record is spliced into the chunk's data in place.
  local chunk, manifest, member = message.chunk, message.manifest, message.member
  local start, length, at, stop = chunk_slot(manifest, sequence)
  local data = redis.call('HGET', chunk, 'd')
  data = string.sub(data, 1, start - 1) .. record .. string.sub(data, start + length)
  manifest = string.sub(manifest, 1, at - 1) .. manifest_line(sequence, new_side) .. string.sub(manifest, stop + 1)
  redis.call('HSET', chunk, '_m', manifest, 'd', data)
  if message.where == 'chunk' then
    local c_first, c_last, c_count, c_bytes, c_media, c_tokens = unpack(entry)
    redis.call('ZREM', keys.chunk_index, member)
    redis.call('ZADD', keys.chunk_index, c_first,
      chunk_index_member(c_first, c_last, c_count, c_bytes - old_bytes + #record, c_media - message.media + media,
        c_tokens - message.tokens + tokens))
  else
    redis.call('ZREM', keys.large_index, member)
    redis.call('ZADD', keys.large_index, sequence, large_index_member(sequence, #record, media, tokens))
  end
end

-- Removes the message at `sequence` from wherever it is stored (its window entry, its oversized
-- chunk, or its record and manifest line in its chunk, whose index member is written again);
-- returns true and its side info's fields (id, otid, media, bytes, turn, tokens), or false when
-- it is not stored. The thread's sums and its id indexes are the caller's.
local function remove_stored(keys, sequence)
  local where, first, member = locate(keys, sequence)
  local side
  if where == 'window' then
    side = redis.call('HGET', keys.window_side, sequence)
    redis.call('HDEL', keys.window_side, sequence)
    redis.call('ZREMRANGEBYSCORE', keys.window, sequence, sequence)
    local _, _, _, window_bytes = parse_side(side)
    redis.call('HINCRBY', keys.meta, 'window_bytes', -window_bytes)
  elseif where == 'large' then
    side = manifest_find(chunk_manifest(keys, first), sequence)
    redis.call('DEL', chunk_key(keys, first))
    redis.call('ZREM', keys.large_index, member)
  elseif where == 'chunk' then
    local chunk = chunk_key(keys, first)
    local manifest = redis.call('HGET', chunk, '_m')
    side = manifest_find(manifest, sequence)
    local c_first, c_last, c_count, c_bytes, c_media, c_tokens = parse_chunk_member(member)
    local _, _, m_media, m_bytes, _, m_tokens = parse_side(side)
    redis.call('ZREM', keys.chunk_index, member)
    if c_count == 1 then
      redis.call('DEL', chunk)
    else
      -- The record is cut out of the chunk's data, and its line out of the manifest.
      local start, length, at, stop = chunk_slot(manifest, sequence)
      local data = redis.call('HGET', chunk, 'd')
      redis.call('HSET', chunk,
        '_m', string.sub(manifest, 1, at - 1) .. string.sub(manifest, stop + 1),
        'd', string.sub(data, 1, start - 1) .. string.sub(data, start + length))
      redis.call('ZADD', keys.chunk_index, c_first,
        chunk_index_member(c_first, c_last, c_count - 1, c_bytes - m_bytes, c_media - m_media, c_tokens - m_tokens))
    end
  end
  if side then return true, parse_side(side) end
  return false
end
