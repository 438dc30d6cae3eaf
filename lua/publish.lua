#!lua
--- Adds a delta of an open turn's output to the thread's event stream: ephemeral, never stored
--- as a message (includes/events.lua).
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV limits (limits): the store's limits (includes/args.lua: read_limits)
--- ARGV turn_id (str)
--- ARGV lease (int): the caller's lease of the turn (start_turn 'hold'), 0 for none: renewed by
---      the call; once it ended, the call is refused and the turn finished as 'abandoned'
--- ARGV delta (bytes): as the client encoded it
--- ARGV call_id (str): the id the client made for this call ('' for none)
---
--- The turn must be started and open, so the turn's finish_turn event is the last of its
--- events: a delta sent after it is refused. With a lease, a turn another worker holds now
--- refuses it (KVS_TURN_FENCED). A call whose id is among the turn's latest deltas is a re-send:
--- it answers that delta's event id and writes nothing (includes/turns.lua, recorded_call), even
--- once the turn is finished or held by another.
---
--- Reply: the event's id ("<n>-<s>")
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_RESTORING, KVS_TURN_NOT_FOUND, KVS_TURN_FINISHED,
---         KVS_TURN_FENCED,
---         KVS_QUOTA, KVS_QUOTA_BYTES, KVS_OWNER_ERASING (an owned thread: includes/owner.lua)
--- @include "includes/thread"
--- @include "includes/turns"
--- @include "includes/expiry"
--- @include "includes/events"
--- @include "includes/turn_finish"
--- @include "includes/numbers"

local limits = args.limits
local keys, err = begin_thread_call(KEYS, limits)
local turn_id, lease, delta, call_id = args.turn_id, args.lease, args.delta, args.call_id
if err then return err end
local deltas = calls_field(turn_id, 'deltas')
local answered, calls = recorded_call(keys, deltas, call_id)
if answered then
  apply_expiry(keys)
  return answered
end

local turn = read_turn(keys, turn_id)
if not turn or turn.start == 0 then
  local current = redis.call('HMGET', keys.meta, 'turn_id', 'turn_outcome')
  if current[1] ~= turn_id then
    return redis.error_reply('KVS_TURN_NOT_FOUND turn ' .. turn_id .. ' was never started in this thread')
  end
  turn = {outcome = current[2] or 'open'}
end
if turn.outcome == 'abandoned' and lease > 0 then return ended_lease(turn_id, lease) end
if turn.outcome ~= 'open' then
  return redis.error_reply('KVS_TURN_FINISHED turn ' .. turn_id .. ' was finished (' .. turn.outcome .. ')')
end
if lease > 0 then
  local ended, renewed
  err, ended, renewed = check_lease(keys, turn_id, lease, limits.turn_lease_ms)
  if ended then
    finish_open_turn(keys, limits, turn_id, nil, 'abandoned')
    apply_expiry(keys)
  end
  if err then return err end
  if renewed then redis.call('HSET', keys.turns, expires_field(turn_id), fmt(renewed)) end
end
local id = emit_event(keys, limits, nil, event_fields('delta', '', '', turn_id, 'l', lease, 'd', delta))
if id then record_call(keys, deltas, calls, call_id, id) end
apply_expiry(keys)
return id
