--- @include "includes/turns"
--- @include "includes/turn_finish"
-- Held turns that a newer turn superseded while their lease had time left (a request whose
-- worker died, then the user's next message): meta `older_turns`, their ids joined by tabs,
-- oldest first, at most older_turns.MAX. expire_turn (renew_turn without a lease, what a
-- watcher sends) ends each one whose lease ended as it ends the current turn; a superseded
-- turn past the bound ends only by a call that names it.
local older_turns = {MAX = 8}

function older_turns.read(keys)
  local list = {}
  for id in string.gmatch(redis.call('HGET', keys.meta, 'older_turns') or '', '[^\t]+') do
    list[#list + 1] = id
  end
  return list
end

function older_turns.write(keys, list)
  if #list == 0 then
    redis.call('HDEL', keys.meta, 'older_turns')
  else
    redis.call('HSET', keys.meta, 'older_turns', table.concat(list, '\t'))
  end
end

-- When the lease of open turn `turn_id` ends (server ms); nil for a turn no lease bounds.
function older_turns.lease_end(keys, turn_id)
  return tonumber(redis.call('HGET', keys.turns, expires_field(turn_id)) or '')
end

-- Finishes as abandoned each superseded turn whose lease ended and stops following every one
-- that is finished. Returns the ms the soonest lease of those still open has left (-1: none).
function older_turns.sweep(keys, limits, list, now)
  local open, soonest = {}, -1
  for _, turn_id in ipairs(list) do
    local turn = read_turn(keys, turn_id)
    local ends = turn and turn.start > 0 and turn.outcome == 'open' and older_turns.lease_end(keys, turn_id)
    if ends and now >= ends then
      finish_open_turn(keys, limits, turn_id, turn, 'abandoned')
    elseif ends then
      open[#open + 1] = turn_id
      if soonest < 0 or ends - now < soonest then soonest = ends - now end
    end
  end
  if #open ~= #list then older_turns.write(keys, open) end
  return soonest, open
end

-- Before turn `turn_id` becomes the current one: the current turn, when held and open, is
-- finished as abandoned if its lease ended, else followed among the superseded turns.
function older_turns.supersede_current(keys, limits, turn_id)
  local current = redis.call('HMGET', keys.meta, 'turn_id', 'turn_outcome')
  local older = current[1]
  if not older or older == turn_id or current[2] ~= 'open' then return end
  local ends = older_turns.lease_end(keys, older)
  if not ends then return end
  local now = server_ms()
  if now >= ends then
    finish_open_turn(keys, limits, older, nil, 'abandoned')
    return
  end
  local _, open = older_turns.sweep(keys, limits, older_turns.read(keys), now)
  if #open >= older_turns.MAX then table.remove(open, 1) end
  open[#open + 1] = older
  older_turns.write(keys, open)
end
