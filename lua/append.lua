#!lua
--- Appends a batch of messages to a thread in one atomic step.
---
--- KEYS[1] meta         hash   the thread's counters and settings
--- KEYS[2] window       zset   newest messages: score = sequence, member = record
--- KEYS[3] window_side  hash   sequence -> "id\totid\tmedia" for window messages
--- KEYS[4] chunk_index  zset   normal chunks, score = first sequence
--- KEYS[5] large_index  zset   single-message chunks of oversized messages
--- KEYS[6] ids          hash   message id -> sequence
--- KEYS[7] otids        hash   otid -> sequence
--- KEYS[8] turns        hash   turn id -> "<reply start>|<ranges>"
--- KEYS[9] chunk_prefix        prefix of chunk keys (carries the thread's hash tag)
---
--- ARGV[1] window_size       int
--- ARGV[2] chunk_size        int
--- ARGV[3] chunk_max_bytes   int   a larger record skips the window into its own chunk
--- ARGV[4] max_move_chunks   int   per call
--- ARGV[5] max_move_bytes    int   per call
--- ARGV[6] max_message_bytes int   checked by the client first; checked again here
--- ARGV[7] turn_id           str   '' when the batch belongs to no turn
--- ARGV[8] count             int   messages in the batch, then 4 arguments per message:
---         id (str), otid (str, '' for none), inline media bytes (int), record (bytes)
---
--- Reply: {1, first_sequence}            the batch was stored at first..first+count-1
---        {0, seq_1, ..., seq_count}     every message was already stored (a replay)
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_TOO_LARGE, KVS_OTID_REPEATED, KVS_OTID_CONFLICT,
---         KVS_ID_REPEATED, KVS_DUPLICATE_ID
--- @include "includes/checks"
--- @include "includes/index"
--- @include "includes/rollover"
--- @include "includes/turns"

local keys = {
  meta = KEYS[1], window = KEYS[2], window_side = KEYS[3], chunk_index = KEYS[4],
  large_index = KEYS[5], ids = KEYS[6], otids = KEYS[7], turns = KEYS[8], chunk_prefix = KEYS[9],
}
local window_size = tonumber(ARGV[1])
local chunk_size = tonumber(ARGV[2])
local chunk_max_bytes = tonumber(ARGV[3])
local max_move_chunks = tonumber(ARGV[4])
local max_move_bytes = tonumber(ARGV[5])
local max_message_bytes = tonumber(ARGV[6])
local turn_id = ARGV[7]
local count = tonumber(ARGV[8])

local ids, otids, media, records = {}, {}, {}, {}
for i = 1, count do
  local base = 8 + (i - 1) * 4
  ids[i], otids[i], media[i], records[i] = ARGV[base + 1], ARGV[base + 2], tonumber(ARGV[base + 3]), ARGV[base + 4]
end

-- Validate everything before the first write.
local err = check_key_types({
  {keys.meta, 'hash'}, {keys.window, 'zset'}, {keys.window_side, 'hash'},
  {keys.chunk_index, 'zset'}, {keys.large_index, 'zset'}, {keys.ids, 'hash'},
  {keys.otids, 'hash'}, {keys.turns, 'hash'},
}) or check_layout(keys.meta)
if err then return err end

for i = 1, count do
  if #records[i] > max_message_bytes then
    return redis.error_reply(string.format('KVS_TOO_LARGE message %d is %d bytes, the limit is %d', i, #records[i], max_message_bytes))
  end
end

-- otids: all stored means a replay, none stored means new, anything else is refused.
local given_otids, seen = {}, {}
for i = 1, count do
  local otid = otids[i]
  if otid ~= '' then
    if seen[otid] then return redis.error_reply('KVS_OTID_REPEATED ' .. otid) end
    seen[otid] = true
    given_otids[#given_otids + 1] = otid
  end
end
if #given_otids > 0 then
  local stored = redis.call('HMGET', keys.otids, unpack(given_otids))
  local present = 0
  for _, sequence in ipairs(stored) do
    if sequence then present = present + 1 end
  end
  if present > 0 then
    if present == count then
      local reply = {0}
      for i, sequence in ipairs(stored) do reply[i + 1] = tonumber(sequence) end
      return reply
    end
    return redis.error_reply(string.format('KVS_OTID_CONFLICT %d of %d messages carry an otid that is already stored', present, count))
  end
end

-- Message ids double as the call's idempotency token: a retried call re-sends the same ids.
seen = {}
for i = 1, count do
  if seen[ids[i]] then return redis.error_reply('KVS_ID_REPEATED ' .. ids[i]) end
  seen[ids[i]] = true
end
local stored_ids = redis.call('HMGET', keys.ids, unpack(ids))
local present = 0
for _, sequence in ipairs(stored_ids) do
  if sequence then present = present + 1 end
end
if present > 0 then
  if present == count then
    local reply = {0}
    for i, sequence in ipairs(stored_ids) do reply[i + 1] = tonumber(sequence) end
    return reply
  end
  return redis.error_reply(string.format('KVS_DUPLICATE_ID %d of %d message ids are already stored', present, count))
end

-- Write.
local last = tonumber(redis.call('HGET', keys.meta, 'last_seq') or '0')
local first = last + 1
local total_bytes, total_media = 0, 0
local id_fields = {}
for i = 1, count do
  local sequence = last + i
  local record = records[i]
  local side = ids[i] .. '\t' .. otids[i] .. '\t' .. string.format('%d', media[i])
  if #record > chunk_max_bytes then
    redis.call('HSET', keys.chunk_prefix .. string.format('%d', sequence),
      sequence, record, '_m', manifest_line(sequence, side))
    redis.call('ZADD', keys.large_index, sequence, large_index_member(sequence, #record, media[i]))
  else
    redis.call('ZADD', keys.window, sequence, record)
    redis.call('HSET', keys.window_side, sequence, side)
  end
  id_fields[#id_fields + 1] = ids[i]
  id_fields[#id_fields + 1] = sequence
  if otids[i] ~= '' then redis.call('HSET', keys.otids, otids[i], sequence) end
  total_bytes = total_bytes + #record
  total_media = total_media + media[i]
end
redis.call('HSET', keys.ids, unpack(id_fields))

if turn_id ~= '' then
  local start, ranges = parse_turn(redis.call('HGET', keys.turns, turn_id))
  redis.call('HSET', keys.turns, turn_id,
    string.format('%d', start or 0) .. '|' .. extend_ranges(ranges or '', first, last + count))
end

redis.call('HSET', keys.meta, 'layout', '2', 'last_seq', last + count)
redis.call('HINCRBY', keys.meta, 'stored', count)
redis.call('HINCRBY', keys.meta, 'bytes', total_bytes)
if total_media > 0 then redis.call('HINCRBY', keys.meta, 'media', total_media) end

rollover(keys, window_size, chunk_size, chunk_max_bytes, max_move_chunks, max_move_bytes)
return {1, first}
