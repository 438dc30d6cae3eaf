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
--- @include "includes/migration"

local keys = thread_keys(KEYS)
local limits = read_limits(ARGV)
local turn_id = ARGV[11]

local err = check_thread(keys) or check_migration(keys)
if err then return err end

local deadline, moved = expiry_deadline(keys, limits.ttl_ms)
keys.deadline = deadline
migrate_step(keys, limits)
local turn = recover_start(keys, turn_id, read_turn(keys, turn_id) or new_turn())
if turn.start > 0 then
  apply_expiry(keys, deadline, moved)
  return turn.start
end

local start = tonumber(redis.call('HGET', keys.meta, 'last_seq') or '0') + 1
turn.start, turn.outcome, turn.replies, turn.first = start, 'open', 0, 0
write_turn(keys, turn_id, turn)
redis.call('HSETNX', keys.meta, 'layout', '2')
redis.call('HSET', keys.meta, 'turn_id', turn_id, 'turn_seq', start, 'turn_outcome', 'open')
apply_expiry(keys, deadline, moved)
return start
