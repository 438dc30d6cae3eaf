#!lua
--- Closes a turn and counts its replies without reading any message.
---
--- KEYS[1..10] the thread's keys (docs/LAYOUT.md)
--- ARGV[1..10] the limits (includes/thread.lua: read_limits)
--- ARGV[11]    turn_id (str)
--- ARGV[12]    outcome (str): completed | steered | cancelled | failed
---
--- The reply start comes from the turn reply sequence when it names this turn; when it names
--- another turn (a newer turn started meanwhile) it comes from the turn's own record instead.
--- The outcome is recorded in the turn reply sequence when it names this turn, so a reader
--- sees a failed turn as unfinished.
---
--- Reply: {reply_count, first_sequence or 0, last_sequence or 0, reply_start}
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_TURN_NOT_FOUND
--- @include "includes/checks"
--- @include "includes/thread"
--- @include "includes/index"
--- @include "includes/turns"
--- @include "includes/expiry"
--- @include "includes/migration"

local keys = thread_keys()
local limits = read_limits()
local turn_id, outcome = ARGV[11], ARGV[12]

local err = check_thread(keys)
if err then return err end

-- A layout-1 thread's turn in progress gets its turn record when its migration begins.
local deadline, moved = expiry_deadline(keys, limits.ttl_ms)
keys.deadline = deadline
migrate_step(keys, limits)
local current = redis.call('HMGET', keys.meta, 'turn_id', 'turn_seq')
local record_start, ranges = parse_turn(redis.call('HGET', keys.turns, turn_id))
local start
if current[1] == turn_id then
  start = tonumber(current[2])
elseif record_start and record_start > 0 then
  start = record_start
else
  apply_expiry(keys, deadline, moved)
  return redis.error_reply('KVS_TURN_NOT_FOUND turn ' .. turn_id .. ' was never started in this thread')
end

local count, first, last = count_from(ranges or '', start)
if current[1] == turn_id then
  redis.call('HSET', keys.meta, 'turn_outcome', outcome)
end
apply_expiry(keys, deadline, moved)
return {count, first or 0, last or 0, start}
