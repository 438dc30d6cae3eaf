--- @include "includes/checks"
--- @include "includes/numbers"
-- Checked updates (StoreConfig(history_checks="strict"); docs/HISTORY.md, "Checked updates").
--
-- A message's *pairs* are the pair ids it opens and answers, computed by the client
-- (kvstore/_engine/tool_pairs.py: history_pairs) and sent with strict checks only: a message's pairs
-- argument is items '+<length>:<pair id>' (opens) and '-<length>:<pair id>' (answers), answers
-- first. A pair id is 'c:<tool call id>', 'p:<tool call id>' (its approval) or
-- 'a:<approval request message id>'. Lua never reads a record: the pair ids are all it knows.
--
-- The thread's state is the sorted set `pairs`:
-- - member <pair id>, score = the sequence of the message that opened it: a pair id open now;
-- - member 'm<sequence>\t<that message's pairs argument>', score = the sequence: what a stored
--   message opens and answers, for replace and remove_turn (pair ids never start with 'm');
-- - member 'o<sequence>\t<opener>\t<pair id>', score = the sequence: an answer of the message
--   at that sequence and the sequence of the message whose call it answered, so that remove_turn
--   reads only the scores of the turn's own messages.
-- All go with retention (the scores below deleted_before) and with delete. meta 'checked' says
-- the state covers the thread from its first message: only such a thread is checked; '2' (since
-- answers keep their 'o' member) lets remove_turn read by the turn's sequences, '1' (a thread
-- checked before) makes it read the whole state. A write without strict checks to a checked
-- thread drops the state (its messages' pairs are not known), and the thread is not checked
-- from then on.

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
  local history = {states = {}, order = {}, mark = meta.checked == 0, any = false, answers = {}}
  -- Answers keep their openers ('o' members) on a thread marked '2', or one this call marks.
  local linked = meta.checked ~= 1
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
          -- opener: the batch position (a number) or the stored sequence (a string) of the call
          local open, opener
          if state then
            open = state.open
            if open then opener = state.at end
          elseif history.any then
            opener = redis.call('ZSCORE', keys.pairs, pair_id)
            open = opener ~= false
          else
            -- The first read of the key doubles as its type check.
            local score = redis.pcall('ZSCORE', keys.pairs, pair_id)
            if type(score) == 'table' and score.err then
              return check_key_types({{keys.pairs, 'zset'}}) or redis.error_reply(tostring(score.err))
            end
            open, history.any, opener = score ~= false, true, score
          end
          if type(opener) == 'string' then opener = string.format('%d', tonumber(opener)) end
          if open and linked then history.answers[#history.answers + 1] = {i, pair_id, opener} end
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
  redis.call('UNLINK', keys.pairs)
end

-- Writes what check_history decided, for the batch stored from sequence `first`: one ZREM of
-- every pair id an answer touched, then one ZADD NX of the pair ids open now (a pair id still open
-- from before keeps its first sequence) and the messages' records.
local function apply_history(keys, batch, first)
  local history = batch.history
  if history == 'drop' then return drop_history(keys) end
  if not history then return end
  if history.mark then redis.call('HSET', keys.meta, 'checked', '2') end
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
  for _, answer in ipairs(history.answers) do
    local i, pair_id, opener = answer[1], answer[2], answer[3]
    if type(opener) == 'number' then opener = first + opener - 1 end
    added[#added + 1] = first + i - 1
    added[#added + 1] = 'o' .. (first + i - 1) .. '\t' .. opener .. '\t' .. pair_id
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

-- The same plan from every record of the thread, oldest first: for a thread checked before
-- answers kept their openers (meta checked '1'), bounded by retention only.
local function plan_turn_removal_scan(keys, turn)
  local members = redis.call('ZRANGE', keys.pairs, '-inf', '+inf', 'BYSCORE', 'WITHSCORES')
  local opener, answers = {}, {}
  for i = 1, #members, 2 do
    local member = members[i]
    if string.sub(member, 1, 1) == 'm' then
      local sequence = tonumber(members[i + 1])
      local tab = string.find(member, '\t', 2, true)
      local items = (tab and parse_pairs(string.sub(member, tab + 1))) or {}
      for _, item in ipairs(items) do
        local op, pair_id = item[1], item[2]
        if op == '+' then
          opener[pair_id] = sequence
        elseif turn[sequence] then
          if opener[pair_id] then
            answers[sequence] = answers[sequence] or {}
            table.insert(answers[sequence], {pair_id, opener[pair_id]})
          end
        elseif opener[pair_id] and turn[opener[pair_id]] then
          return history_error(string.format('removing the turn would leave the message at sequence %d answering %s, which the turn made',
            sequence, pair_name(pair_id)))
        end
      end
    end
  end
  return nil, {answers = answers, turn = turn}
end

-- Plans a turn removal, before any write. `ranges` are the turn's sequence ranges ({a, b}, all of
-- them) and `turn` the set of their sequences. On a thread marked '2' it reads only the state
-- scored inside the ranges (the turn's records and answers, the calls it opened) and one ZSCORE
-- per call the turn made; on one marked '1', every record (plan_turn_removal_scan). Returns an
-- error reply when a message outside the turn answers a call the turn made (removing the turn
-- would orphan it); else nil and the plan remove_history applies ('drop' without strict checks
-- on a checked thread, nil for a thread not checked).
local function plan_turn_removal(keys, limits, ranges, turn)
  local checked = redis.call('HGET', keys.meta, 'checked')
  if not checked then return nil end
  if not limits.strict_history then return nil, 'drop' end
  if checked ~= '2' then return plan_turn_removal_scan(keys, turn) end
  local answers, opened, answered_inside = {}, {}, {}
  for _, range in ipairs(ranges) do
    local members = redis.call('ZRANGE', keys.pairs, range[1], range[2], 'BYSCORE', 'WITHSCORES')
    for i = 1, #members, 2 do
      local member, sequence = members[i], tonumber(members[i + 1])
      local kind = string.sub(member, 1, 1)
      local tab = string.find(member, '\t', 2, true)
      if kind == 'm' and tab then
        for _, item in ipairs(parse_pairs(string.sub(member, tab + 1)) or {}) do
          if item[1] == '+' then opened[#opened + 1] = {sequence, item[2]} end
        end
      elseif kind == 'o' and tab then
        local second = string.find(member, '\t', tab + 1, true)
        if second then
          local opener, pair_id = tonumber(string.sub(member, tab + 1, second - 1)), string.sub(member, second + 1)
          answered_inside[opener .. '\t' .. pair_id] = true
          answers[sequence] = answers[sequence] or {}
          table.insert(answers[sequence], {pair_id, opener})
        end
      end
    end
  end
  -- A call the turn made at s is open still (scored s, or before s when it was open already), or
  -- was answered once: by a message of the turn, or by one outside it.
  for _, open in ipairs(opened) do
    local sequence, pair_id = open[1], open[2]
    local score = tonumber(redis.call('ZSCORE', keys.pairs, pair_id))
    if not (score and score <= sequence) and not answered_inside[sequence .. '\t' .. pair_id] then
      return history_error(string.format('removing the turn would leave a later message answering %s, which the turn made at sequence %d',
        pair_name(pair_id), sequence))
    end
  end
  return nil, {answers = answers, turn = turn}
end

-- Applies a removal plan to the messages this call removes (`sequences`, ascending): the state
-- scored at their sequences goes (their records and answers, the calls they opened that are
-- open at their sequence), and a call they answered is open again when it was made before the
-- turn and is still stored, at its own sequence unless its pair id is open already (a later
-- call with the same id keeps its sequence).
local function remove_history(keys, plan, sequences)
  if plan == 'drop' then return drop_history(keys) end
  if not plan or #sequences == 0 then return end
  local deleted_before = tonumber(redis.call('HGET', keys.meta, 'deleted_before') or '0')
  local run_first, run_last = sequences[1], sequences[1]
  for i = 2, #sequences + 1 do
    local sequence = sequences[i]
    if sequence ~= run_last + 1 then
      redis.call('ZREMRANGEBYSCORE', keys.pairs, run_first, run_last)
      run_first = sequence
    end
    run_last = sequence
  end
  local reopened = {}
  for _, sequence in ipairs(sequences) do
    for _, answer in ipairs(plan.answers[sequence] or {}) do
      local pair_id, opened_at = answer[1], answer[2]
      if not plan.turn[opened_at] and opened_at >= deleted_before then
        reopened[#reopened + 1] = opened_at
        reopened[#reopened + 1] = pair_id
      end
    end
  end
  if #reopened > 0 then redis.call('ZADD', keys.pairs, 'NX', unpack(reopened)) end
end
