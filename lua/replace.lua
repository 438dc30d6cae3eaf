#!lua
--- Replaces a stored message in place: same id, same sequence, same container.
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV limits (limits): the store's limits (includes/args.lua: read_limits)
--- ARGV id (str): the stored message's
--- ARGV media (int): the replacement's inline media bytes
--- ARGV tokens (int): the replacement's token count
--- ARGV record (bytes): the replacement's
--- ARGV pairs (str): the replacement's (includes/history.lua) with strict history checks, ''
---      without; on a checked thread they must be the stored message's
--- ARGV summary (int): 1 when the replacement is a summary message, else 0
---
--- A window message whose replacement is larger than chunk_max_bytes moves into its own chunk,
--- as an oversized append would, and so does an open-chunk message whose replacement would grow
--- the open chunk (of more than one message) past chunk_max_bytes. A closed chunk's message's
--- replacement must keep its chunk within chunk_max_bytes (unless it is alone in it); the chunk
--- is written back in its own kind (a layout-2 hash stays one).
---
--- Every replace moves meta's gen by one, moved or in place: what a reader of the message gets
--- changed, and a read of several steps (a page's plan and fetch, snapshot, context, an export)
--- compares gen to know it read one state.
---
--- The thread's current summary (meta's summary_seq) replaced by a message of another type
--- leaves the thread without a summary (summary_last, summary_seq and summary_asked go): what it covered and
--- is still stored is the context again, not hidden behind a summary that is no more.
---
--- Reply: the message's sequence
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_RESTORING, KVS_MIGRATING, KVS_NOT_FOUND, KVS_BAD_INDEX, KVS_TOO_LARGE,
---         KVS_MEDIA_OVER, KVS_HISTORY,
---         KVS_QUOTA, KVS_QUOTA_BYTES, KVS_OWNER_ERASING (an owned thread: includes/owner.lua)
--- @include "includes/layout"
--- @include "includes/events"
--- @include "includes/expiry"
--- @include "includes/history"
--- @include "includes/numbers"
--- @include "includes/layout2"
--- @include "includes/layout2_index"
--- @include "includes/layout1"
--- @include "includes/layout2_edit"

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

local message = stored_message(keys, where, first, member, sequence)
-- The ids entry names another message's sequence (something else wrote it): never overwrite that.
-- A side info naming no id is taken as the index names it, as get takes a record naming none.
if message.id and message.id ~= '' and message.id ~= id then
  return redis.error_reply(string.format('KVS_BAD_INDEX the ids index names sequence %.0f for id %s, whose record has id %s',
    sequence, id, tostring(message.id)))
end
local old_media, old_bytes, old_tokens = message.media, message.bytes, message.tokens
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
local room_err, entry = check_replacement_room(keys, limits, message, sequence, #record)
if room_err then return room_err end

-- Write.
begin_expiry(keys, limits.ttl_ms)
if history_drop then drop_history(keys) end
ensure_tokens(keys)
write_replacement(keys, message, entry, sequence, record, media, tokens)
if args.summary == 0 and tonumber(redis.call('HGET', keys.meta, 'summary_seq') or '0') == sequence then
  redis.call('HDEL', keys.meta, 'summary_last', 'summary_seq', 'summary_asked')
end
redis.call('HINCRBY', keys.meta, 'bytes', #record - old_bytes)
redis.call('HINCRBY', keys.meta, 'gen', 1)
if media ~= old_media then redis.call('HINCRBY', keys.meta, 'media', media - old_media) end
if tokens ~= old_tokens then redis.call('HINCRBY', keys.meta, 'tokens', tokens - old_tokens) end
-- A fork copying the thread meanwhile compares it (kvstore/_engine/fork.py): its copy so far may
-- hold the message as it was.
redis.call('HINCRBY', keys.meta, 'edits', 1)
emit_event(keys, limits, nil, event_fields('replaced', sequence, '', '', 'i', id))
apply_expiry(keys)
return sequence
