--- @include "includes/turns"
--- @include "includes/events"
-- Finishes an open turn with `outcome` (finish_turn's, or 'abandoned' when its lease ended):
-- records its result, lists it for retention when it holds no message, tells its watchers
-- (turn_finished, the turn's last event) and the turn reply sequence when it names the turn.
-- `turn` as read for the call, or nil to read it here.
local function finish_open_turn(keys, limits, turn_id, turn, outcome)
  turn = turn or recover_start(keys, turn_id, read_turn(keys, turn_id) or new_turn())
  if turn.outcome ~= 'open' or turn.start == 0 then return turn end
  turn.outcome, turn.count, turn.first_seq = outcome, turn.replies, turn.first
  turn.last_seq = 0
  if turn.replies > 0 then turn.last_seq = turn.b end
  write_turn(keys, turn_id, turn)
  -- Without retention (a retained limit of -1) nothing would drop it: not listed.
  if turn.kept == 0 and limits.retained_limit >= 0 then note_idle_turn(keys, turn_id) end
  emit_event(keys, limits, nil, event_fields('turn_finished', turn.first_seq, turn.last_seq, turn_id, 'o', outcome, 'n', turn.count))
  if redis.call('HGET', keys.meta, 'turn_id') == turn_id then
    redis.call('HSET', keys.meta, 'turn_outcome', outcome)
  end
  return turn
end
