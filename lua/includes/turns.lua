--- @include "includes/layout"
--- @include "includes/numbers"
-- A turn's record in the turns hash: a header of constant size and one field per older range.
--
-- Header, field `<turn_id>`:
--   "<start>:<outcome>:<kept>:<replies>:<first>:<k0>:<k1>:<a>:<b>:<count>:<first_seq>:<last_seq>"
--   start     the sequence start_turn recorded (0: not started)
--   outcome   open, or the outcome the first finish_turn recorded
--   kept      the turn's stored sequences; replies those at or after start; first the first one
--   k0, k1    the turn's ranges are k0..k1, oldest first; range k1 (the newest) is a-b here in
--             the header, each older one is the field `<turn_id>\t<k>` -> "a-b"
--   count, first_seq, last_seq   the result the first finish_turn recorded (0 while open)
-- An append extends a-b, or moves a-b into field k1 and starts range k1 + 1: it writes at most
-- the header and one range field, whatever the thread's length. Turn ids hold no tab, so a range
-- field never names another turn's header.
--
-- The first layout-2 version kept "<start>|a-b,c-d,...": such a record is read as it is and
-- converted by the next write of its turn.

local TURN_HEADER = '^(%d+):(%a+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+)$'
local TURN_NUMBERS = {[1] = 'start', [3] = 'kept', [4] = 'replies', [5] = 'first', [6] = 'k0', [7] = 'k1',
                      [8] = 'a', [9] = 'b', [10] = 'count', [11] = 'first_seq', [12] = 'last_seq'}

local function range_field(turn_id, k)
  return turn_id .. '\t' .. fmt(k)
end

local function range_value(a, b)
  return fmt(a) .. '-' .. fmt(b)
end

local function parse_range(value)
  local a, b = string.match(value, '^(%d+)-(%d+)$')
  return tonumber(a), tonumber(b)
end

-- A turn with nothing stored. `writes` (range k -> "a-b") and `gone` (range fields to delete)
-- collect what write_turn writes.
local function new_turn()
  return {start = 0, outcome = 'open', kept = 0, replies = 0, first = 0, k0 = 1, k1 = 1, a = 0, b = 0,
          count = 0, first_seq = 0, last_seq = 0, writes = {}, gone = {}}
end

local function turn_header(turn)
  return string.format('%.0f:%s:%.0f:%.0f:%.0f:%.0f:%.0f:%.0f:%.0f:%.0f:%.0f:%.0f', turn.start, turn.outcome, turn.kept,
    turn.replies, turn.first, turn.k0, turn.k1, turn.a, turn.b, turn.count, turn.first_seq, turn.last_seq)
end

-- An earlier-format record as a turn whose every range is still to be written. The outcome is
-- the turn reply sequence's when it names the turn (the earlier version kept it only there), and
-- so is a missing reply start: that version's retention dropped an open turn's record, and its
-- next reply made a new one with start 0.
local function convert_turn(keys, turn_id, record)
  local turn = new_turn()
  local start, ranges = string.match(record, '^(%d+)|(.*)$')
  if not start then return turn end  -- not a record kvstore wrote: read as empty
  turn.start = tonumber(start)
  local current = redis.call('HMGET', keys.meta, 'turn_id', 'turn_seq', 'turn_outcome')
  if current[1] == turn_id then
    turn.outcome = current[3] or 'open'
    if turn.start == 0 and current[2] then turn.start = tonumber(current[2]) end
  end
  local k = 0
  for a, b in string.gmatch(ranges, '(%d+)-(%d+)') do
    a, b = tonumber(a), tonumber(b)
    k = k + 1
    turn.writes[k] = range_value(a, b)
    turn.kept = turn.kept + (b - a + 1)
    if turn.start > 0 and b >= turn.start then
      turn.replies = turn.replies + (b - math.max(a, turn.start) + 1)
      if turn.first == 0 then turn.first = math.max(a, turn.start) end
    end
    turn.a, turn.b = a, b
  end
  if k > 0 then
    turn.k1 = k
    turn.writes[k] = nil  -- the newest range lives in the header
  end
  if turn.outcome ~= 'open' then
    turn.count, turn.first_seq = turn.replies, turn.first
    if turn.replies > 0 then turn.last_seq = turn.b end
  end
  return turn
end

-- The turn's record, or nil when the turn has none.
local function read_turn(keys, turn_id)
  local record = redis.call('HGET', keys.turns, turn_id)
  if not record then return nil end
  local values = {string.match(record, TURN_HEADER)}
  if #values == 0 then return convert_turn(keys, turn_id, record) end
  local turn = {outcome = values[2], writes = {}, gone = {}}
  for i, name in pairs(TURN_NUMBERS) do turn[name] = tonumber(values[i]) end
  return turn
end

-- Range k of a turn as a, b.
local function turn_range(keys, turn_id, turn, k)
  if k == turn.k1 then return turn.a, turn.b end
  local value = turn.writes[k] or redis.call('HGET', keys.turns, range_field(turn_id, k))
  return parse_range(value)
end

local function sorted_keys(map)
  local list = {}
  for k in pairs(map) do list[#list + 1] = k end
  table.sort(list)
  return list
end

-- The earlier version's retention could drop an open turn's record; a later reply then made
-- one without a start. Such a turn (or one with no record) that the turn reply sequence names as
-- open takes its start from there: every sequence its record holds came after that start.
-- start_turn and finish_turn call this, so that no append pays for it.
local function recover_start(keys, turn_id, turn)
  if turn.start > 0 then return turn end
  local current = redis.call('HMGET', keys.meta, 'turn_id', 'turn_seq', 'turn_outcome')
  if current[1] ~= turn_id or current[3] ~= 'open' or not current[2] then return turn end
  turn.start, turn.replies, turn.first = tonumber(current[2]), turn.kept, 0
  if turn.kept > 0 then turn.first = (turn_range(keys, turn_id, turn, turn.k0)) end
  return turn
end

-- Writes the header and the range fields the turn changed, in calls of bounded size.
local function write_turn(keys, turn_id, turn)
  local fields = {turn_id, turn_header(turn)}
  for _, k in ipairs(sorted_keys(turn.writes)) do
    fields[#fields + 1] = range_field(turn_id, k)
    fields[#fields + 1] = turn.writes[k]
    if #fields >= 200 then
      redis.call('HSET', keys.turns, unpack(fields))
      fields = {}
    end
  end
  if #fields > 0 then redis.call('HSET', keys.turns, unpack(fields)) end
  local gone = {}
  for _, k in ipairs(turn.gone) do
    gone[#gone + 1] = range_field(turn_id, k)
    if #gone >= 100 then
      redis.call('HDEL', keys.turns, unpack(gone))
      gone = {}
    end
  end
  if #gone > 0 then redis.call('HDEL', keys.turns, unpack(gone)) end
  turn.writes, turn.gone = {}, {}
end

-- The fields of a turn beside its record (lease_field, calls_field below): they go with it.
local TURN_EXTRAS = {'lease', 'holds', 'deltas', 'expires'}

-- Deletes a turn's record. It holds no range (kept is 0): its range fields are in `gone`.
local function delete_turn(keys, turn_id, turn)
  local fields = {turn_id}
  for _, extra in ipairs(TURN_EXTRAS) do fields[#fields + 1] = turn_id .. '\t' .. extra end
  for _, k in ipairs(turn.gone) do
    fields[#fields + 1] = range_field(turn_id, k)
    if #fields >= 100 then
      redis.call('HDEL', keys.turns, unpack(fields))
      fields = {}
    end
  end
  if #fields > 0 then redis.call('HDEL', keys.turns, unpack(fields)) end
end

-- Adds sequences first..last (newer than any of the turn's) to the turn.
local function extend_turn(turn, first, last)
  if turn.kept > 0 and turn.b + 1 == first then
    turn.b = last
  else
    if turn.kept > 0 then
      turn.writes[turn.k1] = range_value(turn.a, turn.b)
      turn.k1 = turn.k1 + 1
    end
    turn.a, turn.b = first, last
  end
  local count = last - first + 1
  turn.kept = turn.kept + count
  if turn.start > 0 then
    turn.replies = turn.replies + count
    if turn.first == 0 then turn.first = first end
  end
end

-- Drops the turn's sequences up to `upto` from its oldest ranges. The work is one range read
-- per range dropped, plus one.
local function drop_turn_through(keys, turn_id, turn, upto)
  while turn.kept > 0 do
    local a, b = turn_range(keys, turn_id, turn, turn.k0)
    if a > upto then break end
    local cut = math.min(b, upto)
    turn.kept = turn.kept - (cut - a + 1)
    if turn.start > 0 and cut >= turn.start then
      turn.replies = turn.replies - (cut - math.max(a, turn.start) + 1)
    end
    if cut < b then
      if turn.k0 == turn.k1 then turn.a = cut + 1 else turn.writes[turn.k0] = range_value(cut + 1, b) end
      break
    end
    if turn.k0 == turn.k1 then
      turn.a, turn.b = 0, 0
      break
    end
    turn.writes[turn.k0] = nil
    turn.gone[#turn.gone + 1] = turn.k0
    turn.k0 = turn.k0 + 1
  end
  if turn.replies <= 0 then
    turn.replies, turn.first = 0, 0
  elseif turn.first <= upto then
    -- Every sequence kept is after upto, and upto after the reply start.
    turn.first = turn_range(keys, turn_id, turn, turn.k0)
  end
end

-- A turn's lease (start_turn with mode 'hold'): field `<turn_id>\tlease` of the turns hash, the
-- number of the newest hold. A producer sends its lease with its deltas and messages; once
-- another worker holds the turn (a higher lease), the older lease's are refused.
local function lease_field(turn_id)
  return turn_id .. '\tlease'
end

-- A lease lasts `turn_lease_ms` (the store's limits) from its holder's last call under it: the
-- hold, and each append, publish and renew_turn that sends it. Field `<turn_id>\texpires` holds
-- when it ends, in the server's time (ms); a hold made before leases ended has none and never
-- ends. A turn whose lease ended is finished as 'abandoned' (includes/turn_finish.lua) by the
-- first call that meets it: a call under that lease (which is then refused), or renew_turn.
local function expires_field(turn_id)
  return turn_id .. '\texpires'
end

-- The server's time in ms.
local function server_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

-- Checks a call's lease before any write. Returns nil, false and the lease's new end (the
-- caller writes it with its other writes, expires_field), or an error reply and whether the
-- lease ended (then the caller finishes the turn as abandoned).
local function ended_lease(turn_id, lease)
  return redis.error_reply(string.format('KVS_TURN_FENCED turn %s: lease %d ended (no call renewed it in time); the turn is finished as abandoned',
    turn_id, lease))
end

local function check_lease(keys, turn_id, lease, lease_ms)
  local state = redis.call('HMGET', keys.turns, lease_field(turn_id), expires_field(turn_id))
  local held = tonumber(state[1] or '0')
  if held ~= lease then
    return redis.error_reply(string.format('KVS_TURN_FENCED turn %s is held under lease %d, not %d', turn_id, held, lease)), false
  end
  if not state[2] then return nil, false, nil end
  local now = server_ms()
  if now >= tonumber(state[2]) then return ended_lease(turn_id, lease), true end
  return nil, false, now + lease_ms
end

-- Finished turns that hold no message (finished before their first, or after retention took
-- their last): retention never meets them in a chunk it deletes, so they are listed, in the
-- order they finished, and retention drops each one (drop_idle_turns) once every message stored
-- before its finish is deleted. Field `\tidle` -> "<k0>:<k1>" (entries k0 .. k1 - 1 are listed),
-- field `\tidle\t<k>` -> "<last_seq at the finish>\t<turn id>": a finish writes one entry, a
-- drop deletes one, whatever the list's length.
local IDLE_FIELD = '\tidle'
-- Idle turns one retention call drops at most; the rest go with the next.
local IDLE_DROPS = 200

local function idle_bounds(keys)
  local k0, k1 = string.match(redis.call('HGET', keys.turns, IDLE_FIELD) or '', '^(%d+):(%d+)$')
  return tonumber(k0 or '1'), tonumber(k1 or '1')
end

local function note_idle_turn(keys, turn_id)
  local last = redis.call('HGET', keys.meta, 'last_seq') or '0'
  local k0, k1 = idle_bounds(keys)
  redis.call('HSET', keys.turns, IDLE_FIELD .. '\t' .. fmt(k1), last .. '\t' .. turn_id,
    IDLE_FIELD, fmt(k0) .. ':' .. fmt(k1 + 1))
end

local function drop_idle_turns(keys, deleted_before)
  local k0, k1 = idle_bounds(keys)
  local first = k0
  while k0 < k1 and k0 - first < IDLE_DROPS do
    local entry = IDLE_FIELD .. '\t' .. fmt(k0)
    local last, turn_id = string.match(redis.call('HGET', keys.turns, entry) or '', '^(%d+)\t(.*)$')
    if last and tonumber(last) >= deleted_before then break end
    -- Still idle (not removed and started again since): it goes.
    local turn = turn_id and read_turn(keys, turn_id)
    if turn and turn.kept == 0 and turn.outcome ~= 'open' then delete_turn(keys, turn_id, turn) end
    redis.call('HDEL', keys.turns, entry)
    k0 = k0 + 1
  end
  if k0 == k1 then
    redis.call('HDEL', keys.turns, IDLE_FIELD)
  elseif k0 > first then
    redis.call('HSET', keys.turns, IDLE_FIELD, fmt(k0) .. ':' .. fmt(k1))
  end
end

-- What the turn's latest holds and deltas answered (start_turn 'hold', publish), by the call id
-- the client made before sending: field `<turn_id>\tholds` or `<turn_id>\tdeltas` holds the
-- newest CALLS_KEPT calls as "\n<call id>\t<answer>" lines, newest first. A call that finds its
-- id there is a re-send (redis-py's retry, or the caller's with the same call id) and answers
-- what the first run answered, writing nothing. Call ids hold no tab or newline.
local CALLS_KEPT = 8

local function calls_field(turn_id, kind)
  return turn_id .. '\t' .. kind
end

-- The answer recorded for call_id (nil when none), and the field's value.
local function recorded_call(keys, field, call_id)
  local calls = redis.call('HGET', keys.turns, field) or ''
  if call_id == '' then return nil, calls end
  local _, at = string.find(calls, '\n' .. call_id .. '\t', 1, true)
  if not at then return nil, calls end
  return string.match(calls, '^[^\n]*', at + 1), calls
end

local function record_call(keys, field, calls, call_id, answer)
  if call_id == '' then return end
  calls = '\n' .. call_id .. '\t' .. answer .. calls
  local at = 0
  for _ = 1, CALLS_KEPT + 1 do
    at = string.find(calls, '\n', at + 1, true)
    if not at then break end
  end
  if at then calls = string.sub(calls, 1, at - 1) end
  redis.call('HSET', keys.turns, field, calls)
end

-- A new message of a finished turn is refused before anything is written (a replay of a
-- stored one was answered before this check). In layout 2 the turn read here is kept for
-- store_batch; a layout-1 thread's migration step may write the record in between.
-- A replayed batch's lease (append.lua): its end moves as an append under it would move it,
-- when the turn is open and the lease its live one; anything else is left as it is (the replay
-- is answered either way).
local function renew_on_replay(keys, batch, limits)
  local turn = read_turn(keys, batch.turn_id)
  if not turn or turn.outcome ~= 'open' then return end
  local err, ended, renewed = check_lease(keys, batch.turn_id, batch.lease, limits.turn_lease_ms)
  if err or ended or not renewed then return end
  redis.call('HSET', keys.turns, expires_field(batch.turn_id), fmt(renewed))
end

local function check_turn(keys, batch, meta, limits)
  if batch.turn_id == '' then return nil end
  local turn = read_turn(keys, batch.turn_id)
  if turn and turn.outcome == 'abandoned' and batch.lease then return ended_lease(batch.turn_id, batch.lease) end
  if turn and turn.outcome ~= 'open' then
    return redis.error_reply('KVS_TURN_FINISHED turn ' .. batch.turn_id .. ' was finished (' .. turn.outcome .. ')')
  end
  if batch.lease then
    local err, ended, renewed = check_lease(keys, batch.turn_id, batch.lease, limits.turn_lease_ms)
    batch.lease_ended, batch.lease_renewed = ended, renewed
    if err then return err end
  end
  if meta.layout == CURRENT_LAYOUT then batch.turn = turn or false end
  return nil
end
