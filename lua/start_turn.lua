#!lua
--- Records where a turn's replies start: the turn reply sequence {turn_id, sequence}.
---
--- KEYS[1..10] the thread's keys (docs/LAYOUT.md)
--- ARGV[1..10] the limits (includes/thread.lua: read_limits)
--- ARGV[11]    turn_id (str)
---
--- Reply: the sequence the turn's replies start at. Starting the open turn again returns the
--- same sequence, so a retried call is harmless.
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT
--- @include "includes/checks"
--- @include "includes/thread"
--- @include "includes/index"
--- @include "includes/turns"
--- @include "includes/expiry"
--- @include "includes/migration"

local keys = thread_keys()
local limits = read_limits()
local turn_id = ARGV[11]

local err = check_thread(keys)
if err then return err end

local deadline, moved = expiry_deadline(keys, limits.ttl_ms)
keys.deadline = deadline
migrate_step(keys, limits)
local current = redis.call('HMGET', keys.meta, 'turn_id', 'turn_seq', 'turn_outcome', 'last_seq')
if current[1] == turn_id and current[3] == 'open' then
  apply_expiry(keys, deadline, moved)
  return tonumber(current[2])
end

local start = tonumber(current[4] or '0') + 1
local _, ranges = parse_turn(redis.call('HGET', keys.turns, turn_id))
redis.call('HSET', keys.turns, turn_id, fmt(start) .. '|' .. (ranges or ''))
redis.call('HSETNX', keys.meta, 'layout', '2')
redis.call('HSET', keys.meta, 'turn_id', turn_id, 'turn_seq', start, 'turn_outcome', 'open')
apply_expiry(keys, deadline, moved)
return start
