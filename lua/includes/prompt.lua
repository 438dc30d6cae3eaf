--- @include "includes/layout2_format"
--- @include "includes/layout2_chunks"
--- @include "includes/expiry"
-- The system prompt outlives retention (docs/HISTORY.md, "The system prompt"). The system
-- messages a thread starts with are its model's instructions, not history: before retention
-- deletes a unit holding any of the thread's first prompt.LIMIT sequences, those of its messages
-- that continue the run of system messages from the thread's first message are appended to the
-- prompt, a chunk's two strings at chunk_key(keys, 'prompt') (':m' its manifest lines, ':d' the
-- records, as the unit held them). context() reads them there once retention passed the start.
--
-- meta 'prompt' says where the run stands: 'open' while every message deleted so far continued
-- it, 'closed' once one did not (or the prompt.LIMIT-th was kept). A thread whose retention had
-- passed its start before the prompt was kept (no field, deleted_before set) is closed: its
-- prompt went then.

-- One table, not a local per name: a script's locals are few (includes/layout.lua).
-- LIMIT as kvstore/_engine/system_prompt.py: LEADING_SYSTEM_LIMIT.
local prompt = {LIMIT = 16, SYSTEM_V2 = '\172message_type\174system_message'}

-- A record of a system message: a version-2 record as the client packs it ([2, {message_type,
-- ...}] with message_type first, in a map of up to 15 or up to 65535 fields), or a version-1
-- JSON record. Any other form is not taken for one: the run ends there.
function prompt.is_system_record(record)
  if string.byte(record, 1) == 123 then  -- '{': version 1
    local ok, body = pcall(cjson.decode, record)
    return ok and type(body) == 'table' and body.message_type == 'system_message'
  end
  if string.find(record, '^[\146\147]\2[\128-\143]' .. prompt.SYSTEM_V2) then return true end
  return string.find(record, '^[\146\147]\2\222..' .. prompt.SYSTEM_V2) ~= nil
end

-- Where the run stands before this call's retention: 'open', 'closed'.
function prompt.state(keys)
  local state = redis.call('HMGET', keys.meta, 'prompt', 'deleted_before')
  if state[1] then return state[1] end
  if tonumber(state[2] or '0') > 1 then return 'closed' end
  return 'open'
end

-- Before `unit` (retention's {first, index key, member, ...} chunks, up to sequence `last`) is
-- deleted: appends its messages that continue the open run to the prompt. Returns the run's
-- state after it.
function prompt.keep(keys, unit, last, state)
  if state ~= 'open' then return state end
  local found = {}
  for _, chunk in ipairs(unit) do
    local manifest, data = read_chunk(keys, chunk[1])
    local at = 1
    for sequence, side in manifest_lines(manifest or '') do
      local bytes = select(4, parse_side(side))
      local number = tonumber(sequence)
      if not bytes or not number then break end
      if number <= prompt.LIMIT then
        found[#found + 1] = {number, sequence .. '\t' .. side .. '\n', string.sub(data, at, at + bytes - 1)}
      end
      at = at + bytes
    end
  end
  table.sort(found, function(a, b) return a[1] < b[1] end)
  local lines, records = {}, {}
  for _, message in ipairs(found) do
    if not prompt.is_system_record(message[3]) then state = 'closed'; break end
    lines[#lines + 1], records[#records + 1] = message[2], message[3]
  end
  -- A unit reaching the limit ends the run too: no later message is among the first ones.
  if last >= prompt.LIMIT then state = 'closed' end
  if #lines > 0 then
    local manifest_key, data_key = keys.prompt_manifest, keys.prompt_data
    redis.call('APPEND', manifest_key, table.concat(lines))
    redis.call('APPEND', data_key, table.concat(records))
    expire_new_chunk(keys, manifest_key)
    expire_new_chunk(keys, data_key)
  end
  redis.call('HSET', keys.meta, 'prompt', state)
  return state
end

-- remove_turn: the turn's messages kept aside here leave the prompt too (retention took them
-- from the history and its counts already). The prompt keys are strings (checked before the
-- call's first write). Returns how many went; gen moves when any did (messages went).
function prompt.drop_turn(keys, turn_id)
  local manifest = redis.call('GET', keys.prompt_manifest)
  if not manifest then return 0 end
  local data = redis.call('GET', keys.prompt_data) or ''
  local lines, records, at, dropped = {}, {}, 1, 0
  for sequence, side in manifest_lines(manifest) do
    local bytes, turn = select(4, parse_side(side))
    if not bytes then return 0 end  -- a line no script wrote: left as it is
    if turn == turn_id then
      dropped = dropped + 1
    else
      lines[#lines + 1], records[#records + 1] = sequence .. '\t' .. side .. '\n', string.sub(data, at, at + bytes - 1)
    end
    at = at + bytes
  end
  if dropped == 0 then return 0 end
  if #lines == 0 then
    redis.call('DEL', keys.prompt_manifest, keys.prompt_data)
  else
    redis.call('SET', keys.prompt_manifest, table.concat(lines), 'KEEPTTL')
    redis.call('SET', keys.prompt_data, table.concat(records), 'KEEPTTL')
  end
  redis.call('HINCRBY', keys.meta, 'gen', 1)
  return dropped
end
