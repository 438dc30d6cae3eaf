--- @include "includes/layout"
--- @include "includes/turns"
--- @include "includes/expiry"
--- @include "includes/layout1_migration"
-- What start_turn and finish_turn do first: check the thread, start the call's expiry, move one
-- step of a layout-1 thread (its turn in progress gets its turn record when its migration
-- begins), and read the turn's record, its start recovered from the turn reply sequence.
-- Returns the turn, or nil and an error reply (before any write).
local function load_turn_for_call(keys, limits, turn_id)
  local err = check_thread(keys) or check_migration(keys)
  if err then return nil, err end
  begin_expiry(keys, limits.ttl_ms)
  migrate_step(keys, limits)
  return recover_start(keys, turn_id, read_turn(keys, turn_id) or new_turn())
end
