#!lua
--- Records where a turn's replies start: the turn reply sequence {turn_id, sequence}.
---
--- KEYS[1..10]  the thread's keys (includes/thread.lua: thread_keys; docs/LAYOUT.md)
--- ARGV[1..9]   limits (int): includes/thread.lua, read_limits
--- ARGV[10]     limits key (str): ARGV[1..9] joined by ':'
--- ARGV[11]     turn_id (str)
---
--- A turn is started once: starting a started turn (open or finished, current or not) returns
--- the sequence recorded then and changes nothing, so a retried call is harmless.
---
--- Reply: the sequence the turn's replies start at.
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_MIGRATING
--- @include "includes/thread"
--- @include "includes/turns"
--- @include "includes/expiry"
--- @include "includes/turn_call"

local keys = thread_keys(KEYS)
local limits = read_limits(ARGV)
local turn_id = ARGV[11]

local turn, err = load_turn_for_call(keys, limits, turn_id)
if err then return err end
if turn.start > 0 then
  apply_expiry(keys)
  return turn.start
end

local start = tonumber(redis.call('HGET', keys.meta, 'last_seq') or '0') + 1
turn.start, turn.outcome, turn.replies, turn.first = start, 'open', 0, 0
write_turn(keys, turn_id, turn)
redis.call('HSETNX', keys.meta, 'layout', '2')
redis.call('HSET', keys.meta, 'turn_id', turn_id, 'turn_seq', start, 'turn_outcome', 'open')
apply_expiry(keys)
return start
