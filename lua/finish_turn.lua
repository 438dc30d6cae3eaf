#!lua
--- Closes a turn and counts its replies without reading any message.
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV limits (limits): the store's limits (includes/args.lua: read_limits)
--- ARGV turn_id (str)
--- ARGV lease (int): the caller's lease of the turn (start_turn 'hold'), 0 for none: refused
---      once another worker holds the turn, or once the lease ended (the turn is then finished
---      as 'abandoned')
--- ARGV outcome (str: 'completed' | 'steered' | 'cancelled' | 'failed')
---
--- The counts are kept in the turn's record (includes/turns.lua). The first call records the
--- outcome and the result; finishing a finished turn returns that recorded result, whatever
--- outcome it passes. The outcome is also recorded in the turn reply sequence when it names this
--- turn, so a reader sees a failed turn as unfinished. A turn finished with no message stored is
--- listed for retention to drop (includes/turns.lua, note_idle_turn). The call that finishes the
--- turn leaves the open chunk's records exact (includes/layout3_store.lua: open_chunk.trim).
---
--- Reply: {reply_count, first_sequence or 0, last_sequence or 0, reply_start, outcome}
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_RESTORING, KVS_MIGRATING, KVS_TURN_NOT_FOUND, KVS_TURN_FENCED,
---         KVS_QUOTA, KVS_QUOTA_BYTES, KVS_OWNER_ERASING (an owned thread: includes/owner.lua)
--- @include "includes/layout"
--- @include "includes/turns"
--- @include "includes/expiry"
--- @include "includes/turn_call"
--- @include "includes/turn_finish"
--- @include "includes/layout3_store"

local keys = thread_keys(KEYS)
local limits = args.limits
local turn_id, lease, outcome = args.turn_id, args.lease, args.outcome

local turn, err = load_turn_for_call(keys, limits, turn_id)
if err then return err end
if turn.start == 0 then
  apply_expiry(keys)
  return redis.error_reply('KVS_TURN_NOT_FOUND turn ' .. turn_id .. ' was never started in this thread')
end

if turn.outcome == 'abandoned' and lease ~= 0 then
  apply_expiry(keys)
  return ended_lease(turn_id, lease)
end
if turn.outcome == 'open' and lease ~= 0 then
  local ended
  err, ended = check_lease(keys, turn_id, lease, limits.turn_lease_ms)
  if ended then finish_open_turn(keys, limits, turn_id, turn, 'abandoned') end
  if err then
    apply_expiry(keys)
    return err
  end
end
local finishing = turn.outcome == 'open'
finish_open_turn(keys, limits, turn_id, turn, outcome)
-- The thread goes quiet until its next message: its open chunk without APPEND's slack (once:
-- a retried finish finds it trimmed already).
if finishing then open_chunk.trim(keys) end
apply_expiry(keys)
return {turn.count, turn.first_seq, turn.last_seq, turn.start, turn.outcome}
