--- @include "includes/layout"
--- @include "includes/numbers"
--- @include "includes/events"
--- @include "includes/layout2_format"
--- @include "includes/layout2_chunks"
--- @include "includes/layout3_store"
--- @include "includes/turns"
-- The common append, straight through (lua/append.lua tries it first). The general path is
-- written for every case, and its tables, checks and calls cost more Lua time than its server
-- commands; this one takes only the batch that needs none of them: no inline media or history
-- checks, a layout-3 thread that counts its events already (with a ttl, one whose deadline need
-- not move), every record joining the open chunk without closing it, no id or otid stored yet,
-- and with a turn id an open turn started in today's format, under its live lease when the call
-- sends one. Anything else
-- returns nil before any write, and the general path runs. Both make the same writes, so a thread
-- cannot tell which path stored a batch (tests/integration/test_append_direct.py).

-- The path's parts in one table: the library's main function has room for few more locals
-- (tests/integration/test_scripts.py). META: the meta fields it reads (a subset of load_meta's),
-- in the order it reads them by index.
local direct = {}
direct.META = {'layout', 'last_seq', 'stored', 'bytes', 'window_bytes', 'deleting', 'checked', 'tokens',
  'restoring', 'open_first', 'open_count', 'open_bytes', 'open_tokens', 'events', 'born', 'open_manifest_bytes'}

-- Whether meta (direct.META's values) is a plain layout-3 thread this path may write: no window
-- left to drain, not being deleted or restored, no history state to drop, a token total kept,
-- and its events counted already when the store makes events.
function direct.plain(v, limits)
  return v[1] == CURRENT_LAYOUT and (not v[5] or v[5] == '0') and not v[6] and (not v[7] or v[7] == '0')
    and v[8] and not v[9] and (limits.events_len <= 0 or tonumber(v[14] or 0) > 0)
end

-- Whether every record of `m` joins the open chunk (`count` records, `bytes` of them) as the
-- general path's plan_store would put it there, without a close or a chunk of its own; returns
-- the batch's record bytes and tokens, or nil.
function direct.fit(m, limits, count, bytes)
  local close_bytes, total, tokens = math.min(limits.chunk_max_bytes, CLOSE_BYTES), 0, 0
  for i = 1, m.n do
    local size, held = #m.record[i], count + i - 1
    if m.media[i] ~= 0 or size > limits.chunk_max_bytes or size > limits.max_message_bytes
      or held >= limits.chunk_size
      or held > 0 and (bytes + total + size > close_bytes or close_here(bytes + total, size)) then
      return nil
    end
    total, tokens = total + size, tokens + m.tokens[i]
  end
  return total, tokens
end

-- Whether no otid of the batch is stored, and (for a batch) no id is stored or repeated: a
-- replay or a conflict takes the general path, which names it. A single message's id is checked
-- by the HSETNX that stores it (append_direct).
function direct.new(keys, m)
  local otids
  for i = 1, m.n do
    if m.otid[i] ~= '' then otids = otids or {}; otids[#otids + 1] = m.otid[i] end
  end
  if otids then
    local stored = redis.pcall('HMGET', keys.otids, unpack(otids))
    if stored.err then return false end
    for i = 1, #otids do if stored[i] then return false end end
  end
  if m.n == 1 then return true end
  local seen = {}
  for _, name in ipairs(m.id) do if seen[name] then return false end; seen[name] = true end
  seen = {}
  for _, name in ipairs(otids or {}) do if seen[name] then return false end; seen[name] = true end
  local stored = redis.pcall('HMGET', keys.ids, unpack(m.id))
  if stored.err then return false end
  for i = 1, m.n do if stored[i] then return false end end
  return true
end

-- With a ttl, the keys this call may have made get meta's deadline: every key the thread had
-- before carries it already (the general path's apply_expiry: every write that moves it sets it
-- on all). The open chunk's strings are new when it held nothing, the id map when the thread
-- stored nothing (each stored message has its id there), the otid map may be whenever an otid
-- is written; the event stream sees to itself (emit_event).
function direct.expire_made(keys, open_new, ids_new, otids_written)
  local made = {}
  if open_new then made[1], made[2] = keys.open_data, keys.open_manifest end
  if ids_new then made[#made + 1] = keys.ids end
  if otids_written then made[#made + 1] = keys.otids end
  if #made == 0 then return end
  local deadline = redis.call('PEXPIRETIME', keys.meta)
  for _, key in ipairs(made) do redis.call('PEXPIREAT', key, deadline) end
end

-- The call's turn, as check_turn and check_lease read it, in one HMGET of its header, lease and
-- lease end: the turn and the lease's new end (nil: none to write), or nil when the general
-- path must take the call (no header in today's format: a turn not started, or one to convert;
-- a finished turn; a lease that is not the turn's, or that ended; turns of another type).
function direct.turn(keys, turn_id, lease, lease_ms)
  local got = redis.pcall('HMGET', keys.turns, turn_id, lease_field(turn_id), expires_field(turn_id))
  if got.err or not got[1] then return nil end
  local values = {string.match(got[1], TURN_HEADER)}
  if #values == 0 or values[2] ~= 'open' then return nil end
  local turn = {outcome = values[2], writes = {}, gone = {}}
  for i, name in pairs(TURN_NUMBERS) do turn[name] = tonumber(values[i]) end
  if lease == 0 then return turn, nil end
  if tonumber(got[2] or '0') ~= lease then return nil end
  if not got[3] then return turn, nil end
  local now = server_ms()
  if now >= tonumber(got[3]) then return nil end
  return turn, now + lease_ms
end

-- The turn's sequences first..last, and its lease's new end, in one HSET (store_ids writes the
-- same fields).
function direct.write_turn(keys, turn_id, turn, first, last, renewed)
  extend_turn(turn, first, last)
  local fields = {turn_id, turn_header(turn)}
  for k, range in pairs(turn.writes) do
    fields[#fields + 1], fields[#fields + 2] = range_field(turn_id, k), range
  end
  if renewed then fields[#fields + 1], fields[#fields + 2] = expires_field(turn_id), fmt(renewed) end
  redis.call('HSET', keys.turns, unpack(fields))
end

-- The append of `args` (the append script's arguments) when it is the common case, else nil with
-- nothing written.
local function append_direct(keys, limits, args)
  local m = args.messages
  if limits.strict_history or (args.lease ~= 0 and args.turn_id == '') then return nil end
  -- With a ttl, only while meta's deadline stays (a write that moves it sets it on every key of
  -- the thread, which the general path does).
  local ttl = limits.ttl_ms > 0
  if ttl and redis.call('PTTL', keys.meta) < limits.ttl_ms then return nil end
  local v = redis.pcall('HMGET', keys.meta, unpack(direct.META))
  if v.err or not direct.plain(v, limits) then return nil end
  local last_seq, count, bytes = tonumber(v[2] or 0), tonumber(v[11] or 0), tonumber(v[12] or 0)
  local total, tokens = direct.fit(m, limits, count, bytes)
  if not total or last_seq + m.n > MAX_SEQUENCE or tonumber(v[8] or 0) + tokens > MAX_THREAD_TOKENS then return nil end
  if not direct.new(keys, m) then return nil end
  local turn_id, turn, renewed = args.turn_id, nil, nil
  if turn_id ~= '' then
    turn, renewed = direct.turn(keys, turn_id, args.lease, limits.turn_lease_ms)
    if not turn then return nil end
  end
  local first, n = last_seq + 1, m.n
  if n == 1 then
    local claimed = redis.pcall('HSETNX', keys.ids, m.id[1], first)
    if claimed ~= 1 then return nil end  -- stored already, or not a hash: the general path says which
  end

  local open = {manifest_bytes = tonumber(v[16] or 0), server_bytes = bytes, data = m.record, lines = {}}
  local id_fields, otid_fields = {}, {}
  for i = 1, n do
    local sequence = first + i - 1
    open.lines[i] = manifest_line(sequence, side_info(m.id[i], m.otid[i], 0, #m.record[i], turn_id, m.tokens[i]))
    if n > 1 then id_fields[#id_fields + 1], id_fields[#id_fields + 2] = m.id[i], sequence end
    if m.otid[i] ~= '' then otid_fields[#otid_fields + 1], otid_fields[#otid_fields + 2] = m.otid[i], sequence end
  end
  local refused = flush_open(keys, open)
  if refused then
    if n == 1 then redis.call('HDEL', keys.ids, m.id[1]) end
    return refused
  end
  if n > 1 then redis.call('HSET', keys.ids, unpack(id_fields)) end
  if #otid_fields > 0 then redis.call('HSET', keys.otids, unpack(otid_fields)) end
  local last, events = last_seq + n, tonumber(v[14] or 0) + 1
  if turn then direct.write_turn(keys, turn_id, turn, first, last, renewed) end
  -- Only the fields that change, as store_batch writes them (every field costs the call, and
  -- its bytes in the AOF).
  local fields = {'last_seq', last, 'stored', tonumber(v[3] or 0) + n, 'bytes', tonumber(v[4] or 0) + total,
    'tokens', tonumber(v[8] or 0) + tokens, 'open_last', last, 'open_count', count + n, 'open_bytes', bytes + total,
    'open_tokens', tonumber(v[13] or 0) + tokens, 'open_manifest_bytes', open.manifest_bytes}
  if count == 0 and first ~= tonumber(v[10] or 0) then fields[19], fields[20] = 'open_first', first end
  local events_on = limits.events_len > 0
  if events_on then fields[#fields + 1], fields[#fields + 2] = 'events', events end
  redis.call('HSET', keys.meta, unpack(fields))
  emit_event(keys, limits, last, event_fields('added', first, last, turn_id), v[15] or false, events_on and events or nil, ttl)
  if ttl then direct.expire_made(keys, count == 0, tonumber(v[3] or 0) == 0, #otid_fields > 0) end
  return {1, first}
end
