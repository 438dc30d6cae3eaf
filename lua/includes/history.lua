--- @include "includes/checks"
--- @include "includes/format"
-- Checked updates (StoreConfig(history_checks="strict"); docs/HISTORY.md, "Checked updates").
--
-- A message's *pairs* are the pair ids it opens and answers, computed by the client
-- (kvstore/_engine/pairs.py: history_pairs) and sent with strict checks only: a message's pairs
-- argument is items '+<length>:<pair id>' (opens) and '-<length>:<pair id>' (answers), answers
-- first. A pair id is 'c:<tool call id>', 'p:<tool call id>' (its approval) or
-- 'a:<approval request message id>'. Lua never reads a record: the pair ids are all it knows.
--
-- The thread's state is the sorted set `pairs`:
-- - member <pair id>, score = the sequence of the message that opened it: a pair id open now;
-- - member 'm<sequence>\t<that message's pairs argument>', score = the sequence: what a stored
--   message opens and answers, for replace and remove_turn (pair ids never start with 'm').
-- Both go with retention (the scores below deleted_before) and with delete. meta 'checked' = 1
-- says the state covers the thread from its first message: only such a thread is checked. A
-- write without strict checks to a checked thread drops the state (its messages' pairs are not
-- known), and the thread is not checked from then on.

-- The items of a pairs argument, as a list of {op, pair id}; nil for a malformed one.
local function parse_pairs(spec)
  local items, at = {}, 1
  while at <= #spec do
    local op = string.sub(spec, at, at)
    local colon = string.find(spec, ':', at + 1, true)
    local length = colon and tonumber(string.sub(spec, at + 1, colon - 1))
    if (op ~= '+' and op ~= '-') or not length or colon + length > #spec then return nil end
    items[#items + 1] = {op, string.sub(spec, colon + 1, colon + length)}
    at = colon + length + 1
  end
  return items
end

local PAIR_KINDS = {c = 'tool call', p = 'approval of tool call', a = 'approval request'}

local function history_error(detail)
  return redis.error_reply('KVS_HISTORY ' .. detail)
end

local function pair_name(pair_id)
  return (PAIR_KINDS[string.sub(pair_id, 1, 1)] or 'pair id') .. ' ' .. string.sub(pair_id, 3)
end

-- Reads the batch's pairs (strict checks only) into batch.pairs, one per message: `spec` is
-- '<length>;<pairs argument>' per message, or '' when no message of the batch has any.
local function read_batch_pairs(spec, batch, limits)
  if not limits.strict_history then return end
  batch.pairs = {}
  local at = 1
  for i = 1, #batch.ids do
    local pairs_of = ''
    if spec ~= '' then
      local semicolon = string.find(spec, ';', at, true)
      local length = semicolon and tonumber(string.sub(spec, at, semicolon - 1))
      if length then
        pairs_of = string.sub(spec, semicolon + 1, semicolon + length)
        at = semicolon + length + 1
      else
        pairs_of = '?'  -- malformed: check_history refuses it
      end
    end
    batch.pairs[i] = pairs_of
  end
end

-- Whether the thread is checked: its state covers every message (meta.checked), or it has none
-- yet and this store checks.
local function history_tracked(meta, limits)
  return limits.strict_history and (meta.checked > 0 or meta.last_seq == 0)
end

-- Checks the batch's answers against the open pair ids, before any write. Returns an error reply,
-- or nil and leaves in batch.history what apply_history writes: 'drop', or the pair ids' new
-- states. `lenient` (a restore) refuses no answer: one to nothing open changes nothing.
local function check_history(keys, batch, limits, meta, lenient)
  if not limits.strict_history then
    if meta.checked > 0 then batch.history = 'drop' end
    return nil
  end
  if not history_tracked(meta, limits) then return nil end
  local history = {states = {}, order = {}, mark = meta.checked == 0, any = false}
  local states, order = history.states, history.order
  for i = 1, #batch.ids do
    local spec = batch.pairs[i]
    if spec ~= '' then
      local items = parse_pairs(spec)
      if not items then return history_error(string.format('message %d: malformed pairs argument', i - 1)) end
      for _, item in ipairs(items) do
        local op, pair_id = item[1], item[2]
        local state = states[pair_id]
        if op == '-' then
          local open
          if state then
            open = state.open
          elseif history.any then
            open = redis.call('ZSCORE', keys.pairs, pair_id) ~= false
          else
            -- The first read of the key doubles as its type check.
            local score = redis.pcall('ZSCORE', keys.pairs, pair_id)
            if type(score) == 'table' and score.err then
              return check_key_types({{keys.pairs, 'zset'}}) or redis.error_reply(tostring(score.err))
            end
            open, history.any = score ~= false, true
          end
          if not open and not lenient then
            return history_error(string.format('message %d (%s) answers %s, which is not open in the thread: never made, or already answered',
              i - 1, batch.ids[i], pair_name(pair_id)))
          end
          if not state then order[#order + 1] = pair_id end
          states[pair_id] = {open = false, closed = true}
        else
          if not history.any then
            local err = check_key_types({{keys.pairs, 'zset'}})
            if err then return err end
            history.any = true
          end
          if not state then
            order[#order + 1] = pair_id
            states[pair_id] = {open = true, at = i}
          elseif not state.open then
            state.open, state.at = true, i
          end
        end
      end
    end
  end
  batch.history = history
  return nil
end

-- Drops the thread's state: a write the state does not cover.
local function drop_history(keys)
  redis.call('HDEL', keys.meta, 'checked')
  redis.call('DEL', keys.pairs)
end

-- Writes what check_history decided, for the batch stored from sequence `first`: one ZREM of
-- every pair id an answer touched, then one ZADD NX of the pair ids open now (a pair id still open
-- from before keeps its first sequence) and the messages' records.
local function apply_history(keys, batch, first)
  local history = batch.history
  if history == 'drop' then return drop_history(keys) end
  if not history then return end
  if history.mark then redis.call('HSET', keys.meta, 'checked', '1') end
  if not history.any then return end
  local answered, added = {}, {}
  -- In the order the pair ids came (a table's own order is not the same on every server).
  for _, pair_id in ipairs(history.order) do
    local state = history.states[pair_id]
    if state.closed then answered[#answered + 1] = pair_id end
    if state.open then
      added[#added + 1] = first + state.at - 1
      added[#added + 1] = pair_id
    end
  end
  for i, spec in ipairs(batch.pairs) do
    if spec ~= '' then
      added[#added + 1] = first + i - 1
      added[#added + 1] = 'm' .. fmt(first + i - 1) .. '\t' .. spec
    end
  end
  if #answered > 0 then redis.call('ZREM', keys.pairs, unpack(answered)) end
  if #added > 0 then redis.call('ZADD', keys.pairs, 'NX', unpack(added)) end
end

-- Retention deleted every sequence below `before`: their pair ids and pairs records go too.
local function trim_history(keys, before)
  redis.call('ZREMRANGEBYSCORE', keys.pairs, '-inf', '(' .. fmt(before))
end

-- The pairs argument stored for the message at `sequence` ('' for none).
local function stored_pairs(keys, sequence)
  local prefix = 'm' .. fmt(sequence) .. '\t'
  for _, member in ipairs(redis.call('ZRANGE', keys.pairs, sequence, sequence, 'BYSCORE')) do
    if string.sub(member, 1, #prefix) == prefix then return string.sub(member, #prefix + 1) end
  end
  return ''
end

-- Checks a replacement (the message at `sequence`, whose new pairs argument is `spec`) before
-- any write. Returns an error reply, or nil and 'drop' when the state must go (a replace
-- without strict checks on a checked thread).
local function check_replacement(keys, limits, sequence, spec)
  local checked = redis.call('HGET', keys.meta, 'checked')
  if not checked then return nil end
  if not limits.strict_history then return nil, 'drop' end
  if stored_pairs(keys, sequence) ~= spec then
    return history_error(string.format('the replacement of the message at sequence %d opens or answers other calls than it: a replacement keeps them',
      sequence))
  end
  return nil
end

-- Plans a turn removal, before any write. `turn` is the set of every sequence the turn still
-- holds. Reads every pairs record of the thread, oldest first (a removal is rare, and the
-- records are bounded by retention). Returns an error reply when a message after the turn
-- answers a call the turn opened (removing the turn would orphan it); else nil and the plan
-- remove_history applies ('drop' without strict checks on a checked thread, nil for a thread
-- not checked).
local function plan_turn_removal(keys, limits, turn)
  local checked = redis.call('HGET', keys.meta, 'checked')
  if not checked then return nil end
  if not limits.strict_history then return nil, 'drop' end
  local members = redis.call('ZRANGE', keys.pairs, '-inf', '+inf', 'BYSCORE', 'WITHSCORES')
  local opener, records = {}, {}
  for i = 1, #members, 2 do
    local member = members[i]
    if string.sub(member, 1, 1) == 'm' then
      local sequence = tonumber(members[i + 1])
      local tab = string.find(member, '\t', 2, true)
      local items = (tab and parse_pairs(string.sub(member, tab + 1))) or {}
      local record = turn[sequence] and {member = member, opens = {}, answers = {}}
      for _, item in ipairs(items) do
        local op, pair_id = item[1], item[2]
        if op == '+' then
          opener[pair_id] = sequence
          if record then record.opens[#record.opens + 1] = pair_id end
        elseif record then
          record.answers[#record.answers + 1] = {pair_id, opener[pair_id]}
        elseif opener[pair_id] and turn[opener[pair_id]] then
          return history_error(string.format('removing the turn would leave the message at sequence %d answering %s, which the turn made',
            sequence, pair_name(pair_id)))
        end
      end
      if record then records[sequence] = record end
    end
  end
  return nil, {records = records, turn = turn}
end

-- Applies a removal plan to the messages this call removes (`sequences`): their records go,
-- the calls they made go, and a call they answered is open again when it was made before the
-- turn (and is still stored).
local function remove_history(keys, plan, sequences)
  if plan == 'drop' then return drop_history(keys) end
  if not plan then return end
  local gone, reopened = {}, {}
  for _, sequence in ipairs(sequences) do
    local record = plan.records[sequence]
    if record then
      gone[#gone + 1] = record.member
      for _, pair_id in ipairs(record.opens) do
        if tonumber(redis.call('ZSCORE', keys.pairs, pair_id)) == sequence then gone[#gone + 1] = pair_id end
      end
      for _, answer in ipairs(record.answers) do
        local pair_id, opened_at = answer[1], answer[2]
        if opened_at and not plan.turn[opened_at] then
          reopened[#reopened + 1] = opened_at
          reopened[#reopened + 1] = pair_id
        end
      end
    end
  end
  if #gone > 0 then redis.call('ZREM', keys.pairs, unpack(gone)) end
  if #reopened > 0 then redis.call('ZADD', keys.pairs, unpack(reopened)) end
end
