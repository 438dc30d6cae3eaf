#!lua
--- Records where a turn's replies start: the turn reply sequence {turn_id, sequence}.
---
--- KEYS[1] meta   hash  turn_id, turn_seq, turn_outcome fields
--- KEYS[2] turns  hash  turn id -> "<reply start>|<ranges>"
---
--- ARGV[1] turn_id  str
---
--- Reply: the sequence the turn's replies start at. Starting the open turn again returns the
--- same sequence, so a retried call is harmless.
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT
--- @include "includes/checks"
--- @include "includes/turns"

local meta_key, turns_key = KEYS[1], KEYS[2]
local turn_id = ARGV[1]

local err = check_key_types({{meta_key, 'hash'}, {turns_key, 'hash'}}) or check_layout(meta_key)
if err then return err end

local current = redis.call('HMGET', meta_key, 'turn_id', 'turn_seq', 'turn_outcome', 'last_seq')
if current[1] == turn_id and current[3] == 'open' then
  return tonumber(current[2])
end

local start = tonumber(current[4] or '0') + 1
local _, ranges = parse_turn(redis.call('HGET', turns_key, turn_id))
redis.call('HSET', turns_key, turn_id, string.format('%d', start) .. '|' .. (ranges or ''))
redis.call('HSET', meta_key, 'layout', '2', 'turn_id', turn_id, 'turn_seq', start, 'turn_outcome', 'open')
return start
