--- @include "includes/layout"
--- @include "includes/checks"
--- @include "includes/numbers"
--- @include "includes/layout2_format"
--- @include "includes/layout2"
--- @include "includes/layout2_chunks"
--- @include "includes/layout2_index"
-- The edits of stored messages in place: a message's replacement (lua/replace.lua) and its
-- removal (lua/remove_turn.lua), wherever `locate` finds it: the window (a layout-2 leftover),
-- the open chunk, an oversized chunk or a closed chunk, of either kind (layout-3 strings or a
-- layout-2 hash, written back in its own kind). Closed chunks are immutable but for these: a
-- record is spliced into, or cut out of, a chunk's data, and its manifest line likewise; the
-- chunk's index member (the open chunk's meta sums) is written again.

-- The stored message at `sequence`, found at `where` (locate: 'window', 'open', 'large' or
-- 'chunk', with its chunk's first sequence and index member, or the open chunk's manifest), as
-- a table: where, first, member, its chunk's manifest and data and whether the chunk is a
-- layout-2 hash (none in the window), the open chunk's sums (open: manifest_sums), and its side
-- info's fields (id, otid, media, bytes, turn, tokens).
local function stored_message(keys, where, first, member, sequence)
  local message = {where = where, first = first, member = member}
  local side
  if where == 'window' then
    side = redis.call('HGET', keys.window_side, sequence)
  else
    if where == 'open' then
      message.manifest, message.data = read_open(keys)
      message.open = {manifest_sums(message.manifest)}
    else
      message.manifest, message.data, message.is_hash = read_chunk(keys, first)
    end
    side = manifest_find(message.manifest, sequence)
  end
  message.id, message.otid, message.media, message.bytes, message.turn, message.tokens = parse_side(side)
  return message
end

-- Fails unless a chunk of the message's own may be written at `sequence`: none of its keys
-- exists, the large index is sound.
local function check_own_chunk_free(keys, sequence)
  local expected = {{keys.large_index, 'zset'}}
  for _, key in ipairs({chunk_key(keys, sequence), chunk_data_key(keys, sequence), chunk_manifest_key(keys, sequence)}) do
    expected[#expected + 1] = {key, 'none'}
  end
  return check_key_types(expected)
end

-- Fails when a replacement of `bytes` cannot be written where the message is: a window message
-- larger than chunk_max_bytes, or an open-chunk message that would grow the open chunk (of more
-- than one message) past it, moves into its own chunk (message.moves), whose keys must be free;
-- a closed chunk of more than one message must stay within chunk_max_bytes. Else nil, and for a
-- chunk its index member's fields (parse_chunk_member), which write_replacement takes.
local function check_replacement_room(keys, limits, message, sequence, bytes)
  if message.where == 'window' then
    message.moves = bytes > limits.chunk_max_bytes
  elseif message.where == 'open' then
    local count, open_bytes = message.open[3], message.open[4]
    message.moves = count > 1 and open_bytes - message.bytes + bytes > limits.chunk_max_bytes
  end
  if message.moves then return check_own_chunk_free(keys, sequence) end
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

-- A chunk's manifest and data with the record at `sequence` and its manifest line replaced by
-- `record` and `line` ('' and '' cut them out).
local function splice(manifest, data, sequence, line, record)
  local start, length, at, stop = chunk_slot(manifest, sequence)
  return string.sub(manifest, 1, at - 1) .. line .. string.sub(manifest, stop + 1),
    string.sub(data, 1, start - 1) .. record .. string.sub(data, start + length)
end

-- The open chunk after an edit: its strings, and its meta sums from its manifest (none when it is
-- left empty).
local function write_open_chunk(keys, manifest, data)
  write_open(keys, manifest, data)
  local first, last, count, bytes, media, tokens = manifest_sums(manifest)
  if count == 0 then
    redis.call('HDEL', keys.meta, 'open_first', 'open_last', 'open_count', 'open_bytes', 'open_media', 'open_tokens',
      'open_manifest_bytes')
    return
  end
  redis.call('HSET', keys.meta, 'open_first', fmt(first), 'open_last', fmt(last), 'open_count', fmt(count),
    'open_bytes', fmt(bytes), 'open_media', fmt(media), 'open_tokens', fmt(tokens), 'open_manifest_bytes', #manifest)
end

-- Writes the message's replacement into its own chunk (an oversized one), listed in the large
-- index (the replace moves gen, moved or not: lua/replace.lua).
local function write_own_chunk(keys, sequence, side, record, media, tokens)
  write_chunk(keys, sequence, manifest_line(sequence, side), record)
  redis.call('ZADD', keys.large_index, sequence, large_index_member(sequence, #record, media, tokens))
end

-- A window message's replacement: in the window, or into its own chunk (message.moves).
local function replace_in_window(keys, message, sequence, side, record, media, tokens)
  redis.call('ZREMRANGEBYSCORE', keys.window, sequence, sequence)
  if message.moves then
    redis.call('HDEL', keys.window_side, sequence)
    write_own_chunk(keys, sequence, side, record, media, tokens)
    redis.call('HINCRBY', keys.meta, 'window_bytes', 0 - message.bytes)
  else
    redis.call('ZADD', keys.window, sequence, record)
    redis.call('HSET', keys.window_side, sequence, side)
    redis.call('HINCRBY', keys.meta, 'window_bytes', #record - message.bytes)
  end
end

-- Writes `record` (with `media` and `tokens`) in place of the stored message (stored_message)
-- at `sequence`: in the window or the open chunk, or into its own chunk when it moves
-- (check_replacement_room); in a closed chunk, spliced, the chunk written back in its own kind.
-- `entry` is check_replacement_room's for a chunk. The thread's sums (bytes, media, tokens) are
-- the caller's; the window's bytes and the open chunk's sums are written here.
local function write_replacement(keys, message, entry, sequence, record, media, tokens)
  local old_bytes = message.bytes
  local new_side = side_info(message.id, message.otid, media, #record, message.turn, tokens)
  if message.where == 'window' then
    return replace_in_window(keys, message, sequence, new_side, record, media, tokens)
  end
  local line = manifest_line(sequence, new_side)
  if message.where == 'open' then
    if message.moves then
      write_open_chunk(keys, splice(message.manifest, message.data, sequence, '', ''))
      return write_own_chunk(keys, sequence, new_side, record, media, tokens)
    end
    return write_open_chunk(keys, splice(message.manifest, message.data, sequence, line, record))
  end
  local manifest, data = splice(message.manifest, message.data, sequence, line, record)
  rewrite_chunk(keys, message.first, message.is_hash, manifest, data)
  local member = message.member
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

-- Cuts the message at `sequence` out of its closed chunk (located at `first`, index `member`):
-- the chunk goes when it was its only message, else its record and manifest line go and its
-- index member is written again. Returns the message's side info.
local function cut_from_chunk(keys, first, member, sequence)
  local manifest, data, is_hash = read_chunk(keys, first)
  local side = manifest_find(manifest, sequence)
  local c_first, c_last, c_count, c_bytes, c_media, c_tokens = parse_chunk_member(member)
  local _, _, m_media, m_bytes, _, m_tokens = parse_side(side)
  redis.call('ZREM', keys.chunk_index, member)
  if c_count == 1 then
    delete_chunk(keys, first)
    return side
  end
  manifest, data = splice(manifest, data, sequence, '', '')
  rewrite_chunk(keys, first, is_hash, manifest, data)
  redis.call('ZADD', keys.chunk_index, c_first,
    chunk_index_member(c_first, c_last, c_count - 1, c_bytes - m_bytes, c_media - m_media, c_tokens - m_tokens))
  return side
end

-- Removes the message at `sequence` from wherever it is stored (its window entry, the open
-- chunk, its oversized chunk, or its record and manifest line in its chunk, whose index member is
-- written again); returns true and its side info's fields (id, otid, media, bytes, turn,
-- tokens), or false when it is not stored. The thread's sums and its id indexes are the caller's.
local function remove_stored(keys, sequence)
  local where, first, member, open_manifest = locate(keys, sequence)
  local side
  if where == 'window' then
    side = redis.call('HGET', keys.window_side, sequence)
    redis.call('HDEL', keys.window_side, sequence)
    redis.call('ZREMRANGEBYSCORE', keys.window, sequence, sequence)
    local _, _, _, window_bytes = parse_side(side)
    redis.call('HINCRBY', keys.meta, 'window_bytes', 0 - window_bytes)
  elseif where == 'open' then
    local _, data = read_open(keys)
    side = manifest_find(open_manifest, sequence)
    write_open_chunk(keys, splice(open_manifest, data, sequence, '', ''))
  elseif where == 'large' then
    side = manifest_find(chunk_manifest(keys, first), sequence)
    delete_chunk(keys, first)
    redis.call('ZREM', keys.large_index, member)
  elseif where == 'chunk' then
    side = cut_from_chunk(keys, first, member, sequence)
  end
  if side then return true, parse_side(side) end
  return false
end
