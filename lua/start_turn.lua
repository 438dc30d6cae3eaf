#!lua
--- Records where a turn's replies start: the turn reply sequence {turn_id, sequence}; with mode
--- 'hold', also gives the caller the turn's next lease.
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV limits (limits): the store's limits (includes/args.lua: read_limits)
--- ARGV turn_id (str)
--- ARGV mode (str: 'start' | 'hold')
--- ARGV call_id (str): with 'hold', the id the client made for this call ('' for none)
---
--- A turn is started once: starting a started turn (open or finished, current or not) returns
--- the sequence recorded then and changes nothing, so a retried call is harmless. 'hold' starts
--- the turn if it is not started and takes a new lease of it (includes/turns.lua, lease_field):
--- the holder of any earlier lease is refused from then on (KVS_TURN_FENCED). A lease ends
--- turn_lease_ms after its holder's last call under it (includes/turns.lua, check_lease); a hold
--- of a turn whose lease ended but that no call finished yet takes it over. A finished turn
--- cannot be held. A hold whose call id took one of the turn's latest leases is a re-send:
--- it answers that lease again and writes nothing (includes/turns.lua, recorded_call), so a
--- retried hold never fences its own caller.
---
--- A turn started while the current one is held and open supersedes it: that turn is finished
--- as abandoned if its lease ended, else followed until it ends (includes/older_turns.lua).
---
--- Reply: 'start': the sequence the turn's replies start at; 'hold': {that sequence, lease}
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_RESTORING, KVS_MIGRATING, KVS_TURN_FINISHED,
---         KVS_QUOTA, KVS_QUOTA_BYTES, KVS_OWNER_ERASING (an owned thread: includes/owner.lua)
--- @include "includes/layout"
--- @include "includes/turns"
--- @include "includes/expiry"
--- @include "includes/turn_call"
--- @include "includes/older_turns"
--- @include "includes/events"
--- @include "includes/numbers"

local keys = thread_keys(KEYS)
local limits = args.limits
local turn_id, mode, call_id = args.turn_id, args.mode, args.call_id

local turn, err = load_turn_for_call(keys, limits, turn_id)
if err then return err end
local holds, calls
if mode == 'hold' then
  local answered
  holds = calls_field(turn_id, 'holds')
  answered, calls = recorded_call(keys, holds, call_id)
  if answered and turn.start > 0 then
    apply_expiry(keys)
    return {turn.start, tonumber(answered)}
  end
end
if mode == 'hold' and turn.start > 0 and turn.outcome ~= 'open' then
  apply_expiry(keys)
  return redis.error_reply('KVS_TURN_FINISHED turn ' .. turn_id .. ' was finished (' .. turn.outcome .. ')')
end
local started = turn.start == 0
if started then
  local start = tonumber(redis.call('HGET', keys.meta, 'last_seq') or '0') + 1
  turn.start, turn.outcome, turn.replies, turn.first = start, 'open', 0, 0
  older_turns.supersede_current(keys, limits, turn_id)
  write_turn(keys, turn_id, turn)
  redis.call('HSETNX', keys.meta, 'layout', CURRENT_LAYOUT)
  redis.call('HSET', keys.meta, 'turn_id', turn_id, 'turn_seq', start, 'turn_outcome', 'open')
end
local lease = 0
if mode == 'hold' then
  lease = redis.call('HINCRBY', keys.turns, lease_field(turn_id), 1)
  redis.call('HSET', keys.turns, expires_field(turn_id), fmt(server_ms() + limits.turn_lease_ms))
  record_call(keys, holds, calls, call_id, fmt(lease))
end
if started or lease > 0 then
  -- The event's sequence is the thread's last, as for every event: a take-over's turn may
  -- have replies past its start already.
  emit_event(keys, limits, nil, event_fields('turn_started', turn.start, '', turn_id, 'l', lease))
end
apply_expiry(keys)
if mode == 'hold' then return {turn.start, lease} end
return turn.start
