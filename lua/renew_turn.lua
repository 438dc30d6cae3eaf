#!lua
--- Renews a held turn's lease (a producer's heartbeat), or, without a lease, finishes a turn
--- whose lease ended as 'abandoned' (what a watcher sends when the thread is quiet).
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV limits (limits): the store's limits (includes/args.lua: read_limits)
--- ARGV turn_id (str): '' for the thread's current turn (the turn reply sequence's)
--- ARGV lease (int): the caller's lease to renew; 0 to finish the turn only if its lease ended
---
--- With a lease: refused as any call under it is (KVS_TURN_FENCED once another holds the turn,
--- or once the lease ended: the turn is then finished as abandoned; KVS_TURN_FINISHED once it is
--- finished); else the lease ends turn_lease_ms from now. Without one, a turn that is not held,
--- or whose lease has time left, is left as it is, and so is each held turn a newer turn
--- superseded (includes/older_turns.lua): those whose lease ended are finished as abandoned.
---
--- Reply: {outcome, ms_left}: the turn's outcome after the call ('' when the thread has no
---        turn), and the ms its lease has left: -1 for an open turn no lease bounds, 0 for a
---        finished one; without a lease also the ms the soonest lease of the superseded turns
---        still open has left (-1: none)
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_RESTORING, KVS_TURN_NOT_FOUND, KVS_TURN_FINISHED,
---         KVS_TURN_FENCED,
---         KVS_QUOTA, KVS_QUOTA_BYTES, KVS_OWNER_ERASING (an owned thread: includes/owner.lua)
--- @include "includes/thread"
--- @include "includes/turns"
--- @include "includes/expiry"
--- @include "includes/turn_finish"
--- @include "includes/older_turns"
--- @include "includes/numbers"

-- Without a lease: the turn finished as abandoned if its lease ended; its outcome and the ms
-- its lease has left.
local function expire_if_ended(keys, limits, turn_id, turn, now)
  if turn.outcome ~= 'open' then return turn.outcome, 0 end
  local ends = older_turns.lease_end(keys, turn_id)
  if not ends then return 'open', -1 end
  if now < ends then return 'open', ends - now end
  finish_open_turn(keys, limits, turn_id, turn, 'abandoned')
  return 'abandoned', 0
end

local limits = args.limits
local keys, err = begin_thread_call(KEYS, limits)
if err then return err end
local turn_id, lease = args.turn_id, args.lease
if turn_id == '' then turn_id = redis.call('HGET', keys.meta, 'turn_id') or '' end
local turn = new_turn()
if turn_id ~= '' then
  turn = recover_start(keys, turn_id, read_turn(keys, turn_id) or new_turn())
  if turn.start == 0 then
    apply_expiry(keys)
    return redis.error_reply('KVS_TURN_NOT_FOUND turn ' .. turn_id .. ' was never started in this thread')
  end
end
if lease > 0 then
  if turn.outcome ~= 'open' then
    apply_expiry(keys)
    if turn.outcome == 'abandoned' then return ended_lease(turn_id, lease) end
    return redis.error_reply('KVS_TURN_FINISHED turn ' .. turn_id .. ' was finished (' .. turn.outcome .. ')')
  end
  local ended, renewed
  err, ended, renewed = check_lease(keys, turn_id, lease, limits.turn_lease_ms)
  if ended then finish_open_turn(keys, limits, turn_id, turn, 'abandoned') end
  if renewed then redis.call('HSET', keys.turns, expires_field(turn_id), fmt(renewed)) end
  apply_expiry(keys)
  if err then return err end
  return {'open', limits.turn_lease_ms}
end
local now = server_ms()
local outcome, left = '', -1
if turn_id ~= '' then outcome, left = expire_if_ended(keys, limits, turn_id, turn, now) end
local older_left = older_turns.sweep(keys, limits, older_turns.read(keys), now)
apply_expiry(keys)
return {outcome, left, older_left}
