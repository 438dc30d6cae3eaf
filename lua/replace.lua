#!lua
--- Replaces a stored message in place: same id, same sequence, same container.
---
--- KEYS[1..12]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV limits (limits): the store's limits (includes/args.lua: read_limits)
--- ARGV id (str): the stored message's
--- ARGV media (int): the replacement's inline media bytes
--- ARGV tokens (int): the replacement's token count
--- ARGV record (bytes): the replacement's
--- ARGV pairs (str): the replacement's (includes/history.lua) with strict history checks, ''
---      without; on a checked thread they must be the stored message's
---
--- A window message whose replacement is larger than chunk_max_bytes moves into its own chunk,
--- as an oversized append would. A chunk message's replacement must keep its chunk within
--- chunk_max_bytes (unless it is alone in it).
---
--- Reply: the message's sequence
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_RESTORING, KVS_MIGRATING, KVS_NOT_FOUND, KVS_TOO_LARGE,
---         KVS_MEDIA_OVER, KVS_HISTORY
--- @include "includes/layout"
--- @include "includes/checks"
--- @include "includes/events"
--- @include "includes/expiry"
--- @include "includes/history"
--- @include "includes/numbers"
--- @include "includes/layout2_format"
--- @include "includes/layout2"
--- @include "includes/layout2_index"
--- @include "includes/layout1"
--- @include "includes/layout2_chunks"

local keys = thread_keys(KEYS)
local limits = args.limits
local id, media, tokens, record = args.id, args.media, args.tokens, args.record

local err = check_thread(keys)
if err then return err end
if is_layout_1(keys) then
  return redis.error_reply('KVS_MIGRATING the thread is still in layout 1: migrate it first')
end
if #record > limits.max_message_bytes then
  return redis.error_reply(string.format('KVS_TOO_LARGE the replacement is %d bytes, the limit is %d', #record, limits.max_message_bytes))
end
local sequence = tonumber(redis.call('HGET', keys.ids, id) or '0')
local where, first, member = nil, nil, nil
if sequence > 0 then where, first, member = locate(keys, sequence) end
if not where then
  return redis.error_reply('KVS_NOT_FOUND no stored message has id ' .. id)
end

local chunk = first and (chunk_key(keys, first))
local side, manifest
if where == 'window' then
  side = redis.call('HGET', keys.window_side, sequence)
else
  manifest = redis.call('HGET', chunk, '_m')
  side = manifest_find(manifest, sequence)
end
local old_id, otid, old_media, old_bytes, turn, old_tokens = parse_side(side)
local history_refusal, history_drop = check_replacement(keys, limits, sequence, args.pairs)
if history_refusal then return history_refusal end

local current_media = tonumber(redis.call('HGET', keys.meta, 'media') or '0')
if media > old_media and current_media - old_media + media > limits.max_media then
  return redis.error_reply(string.format('KVS_MEDIA_OVER %.0f bytes of inline media are left in the thread',
    math.max(0, limits.max_media - (current_media - old_media))))
end
if tokens > old_tokens and tonumber(redis.call('HGET', keys.meta, 'tokens') or '0') - old_tokens + tokens > MAX_THREAD_TOKENS then
  return redis.error_reply(string.format('KVS_TOO_LARGE the thread\'s token total would pass %.0f (2^52)', MAX_THREAD_TOKENS))
end
local new_side = side_info(old_id, otid, media, #record, turn, tokens)
if where == 'window' and #record > limits.chunk_max_bytes then
  -- The message will move into its own chunk: that key must be free, the large index sound.
  local type_err = check_key_types({{chunk_key(keys, sequence), 'none'}, {keys.large_index, 'zset'}})
  if type_err then return type_err end
end
local c_first, c_last, c_count, c_bytes, c_media, c_tokens
if where == 'chunk' then
  c_first, c_last, c_count, c_bytes, c_media, c_tokens = parse_chunk_member(member)
  if c_count > 1 and c_bytes - old_bytes + #record > limits.chunk_max_bytes then
    return redis.error_reply(string.format(
      'KVS_TOO_LARGE the replacement (%d bytes) would grow its chunk past chunk_max_bytes (%d)', #record, limits.chunk_max_bytes))
  end
end

-- Write.
begin_expiry(keys, limits.ttl_ms)
if history_drop then drop_history(keys) end
ensure_tokens(keys)
if where == 'window' then
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
else
  -- Chunks are immutable but for this: the record is spliced into the chunk's data in place.
  local start, length, at, stop = chunk_slot(manifest, sequence)
  local data = redis.call('HGET', chunk, 'd')
  data = string.sub(data, 1, start - 1) .. record .. string.sub(data, start + length)
  manifest = string.sub(manifest, 1, at - 1) .. manifest_line(sequence, new_side) .. string.sub(manifest, stop + 1)
  redis.call('HSET', chunk, '_m', manifest, 'd', data)
  if where == 'chunk' then
    redis.call('ZREM', keys.chunk_index, member)
    redis.call('ZADD', keys.chunk_index, c_first,
      chunk_index_member(c_first, c_last, c_count, c_bytes - old_bytes + #record, c_media - old_media + media,
        c_tokens - old_tokens + tokens))
  else
    redis.call('ZREM', keys.large_index, member)
    redis.call('ZADD', keys.large_index, sequence, large_index_member(sequence, #record, media, tokens))
  end
end
redis.call('HINCRBY', keys.meta, 'bytes', #record - old_bytes)
if media ~= old_media then redis.call('HINCRBY', keys.meta, 'media', media - old_media) end
if tokens ~= old_tokens then redis.call('HINCRBY', keys.meta, 'tokens', tokens - old_tokens) end
emit_event(keys, limits, nil, {'k', 'replaced', 'a', sequence, 'i', id})
apply_expiry(keys)
return sequence
