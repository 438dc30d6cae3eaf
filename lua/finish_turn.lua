#!lua
--- Closes a turn and counts its replies without reading any message.
---
--- KEYS[1] meta   hash  turn_id, turn_seq, turn_outcome fields
--- KEYS[2] turns  hash  turn id -> "<reply start>|<ranges>"
---
--- ARGV[1] turn_id  str
--- ARGV[2] outcome  str  completed | steered | cancelled | failed
---
--- The reply start comes from the turn reply sequence when it names this turn; when it names
--- another turn (a newer turn started meanwhile) it comes from the turn's own record instead.
---
--- Reply: {reply_count, first_sequence or 0, last_sequence or 0, reply_start}
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_TURN_NOT_FOUND
--- @include "includes/checks"
--- @include "includes/turns"

local meta_key, turns_key = KEYS[1], KEYS[2]
local turn_id, outcome = ARGV[1], ARGV[2]

local err = check_key_types({{meta_key, 'hash'}, {turns_key, 'hash'}}) or check_layout(meta_key)
if err then return err end

local current = redis.call('HMGET', meta_key, 'turn_id', 'turn_seq')
local record_start, ranges = parse_turn(redis.call('HGET', turns_key, turn_id))
local start
if current[1] == turn_id then
  start = tonumber(current[2])
elseif record_start and record_start > 0 then
  start = record_start
else
  return redis.error_reply('KVS_TURN_NOT_FOUND turn ' .. turn_id .. ' was never started in this thread')
end

local count, first, last = count_from(ranges or '', start)
if current[1] == turn_id then
  redis.call('HSET', meta_key, 'turn_outcome', outcome)
end
return {count, first or 0, last or 0, start}
