--- @include "includes/layout"
--- @include "includes/checks"
--- @include "includes/numbers"
--- @include "includes/events"
--- @include "includes/layout2_format"
--- @include "includes/layout2_chunks"
--- @include "includes/layout3_store"
--- @include "includes/turns"
--- @include "includes/args"
-- The common append, straight through (lua/append.lua tries it first). The general path is
-- written for every case, and its tables, checks and calls cost more Lua time than its server
-- commands; this one takes only the batch that needs none of them: no inline media or history
-- checks, a layout-3 thread that counts its events already (with a ttl, one whose deadline need
-- not move), every record joining the open chunk without closing it, no id or otid stored yet,
-- and with a turn id an open turn started in today's format, under its live lease when the call
-- sends one. Anything else
-- returns nil before any write, and the general path runs. Both make the same writes, so a thread
-- cannot tell which path stored a batch (tests/integration/test_append_direct.py).

-- It runs before the script's prologue (append.lua's header: `--- @first append_direct`) and
-- reads KEYS and ARGV by position, making no table it can do without: on a small call the
-- tables and strings a script makes cost about as much as its commands (a table ~0.7 us, the
-- prologue's group lists ~10 us on a 2-CPU server). DIRECT.AT names the positions append.lua's
-- header gives its arguments (tests/integration/test_append_direct.py checks them against it).

-- The path's parts in one table: the library's main function has room for few more locals
-- (tests/integration/test_scripts.py). META: the meta fields it reads (a subset of load_meta's),
-- in the order it reads them by index.
local direct = {}
direct.META = {'layout', 'last_seq', 'stored', 'bytes', 'window_bytes', 'deleting', 'checked', 'tokens',
  'restoring', 'open_first', 'open_count', 'open_bytes', 'open_tokens', 'events', 'born', 'open_manifest_bytes',
  'expires'}
-- ARGV: limits, turn_id, lease, pairs, then per message id, otid, media, tokens, record.
direct.AT = {limits = 1, turn_id = 2, lease = 3, pairs = 4, messages = 5, width = 5}
-- KEYS: the thread's keys in thread_keys' order (includes/layout.lua).
direct.KEY = {meta = 1, ids = 6, otids = 7, turns = 8, events = 11, open_data = 13, open_manifest = 14}

-- Whether meta (direct.META's values) is a plain layout-3 thread this path may write: no window
-- left to drain, not being deleted or restored, no history state to drop, a token total kept,
-- and its events counted already when the store makes events.
function direct.plain(v, limits)
  return v[1] == CURRENT_LAYOUT and (not v[5] or v[5] == '0') and not v[6] and (not v[7] or v[7] == '0')
    and v[8] and not v[9] and (limits.events_len <= 0 or tonumber(v[14] or 0) > 0)
end

-- Where the call's `n` messages from ARGV[at] go, as the general path's plan_store puts them
-- (the open chunk holds `count` records, `bytes` of them): the batch's record bytes and tokens,
-- and `split`, the index (from 0) of the first message after the one close the call makes
-- before it, or nil when every message joins the open chunk; or nil when the batch needs the
-- general path (inline media, a record of a chunk of its own or over the limit, two closes).
function direct.fit(ARGV, at, n, limits, count, bytes)
  local close_bytes, total, tokens, split = math.min(limits.chunk_max_bytes, CLOSE_BYTES), 0, 0, nil
  for i = 0, n - 1 do
    local b = at + i * 5
    local size, media, counted = #ARGV[b + 4], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
    if media ~= 0 or not counted or size > limits.chunk_max_bytes or size > limits.max_message_bytes then
      return nil
    end
    if count > 0 and (count >= limits.chunk_size or bytes + size > close_bytes or close_here(bytes, size)) then
      if split then return nil end
      split, count, bytes = i, 0, 0
    end
    count, bytes, total, tokens = count + 1, bytes + size, total + size, tokens + counted
  end
  return total, tokens, split
end

-- Whether no otid of the batch is stored, and (for a batch) no id is stored or repeated: a
-- replay or a conflict takes the general path, which names it. A single message's id is checked
-- by the HSETNX that stores it (append_direct).
function direct.new(KEYS, ARGV, at, n)
  if n == 1 then
    local otid = ARGV[at + 1]
    if otid == '' then return true end
    local stored = redis.pcall('HGET', KEYS[direct.KEY.otids], otid)
    return type(stored) ~= 'table' and not stored
  end
  local ids, otids, seen = {}, {}, {}
  for i = 0, n - 1 do
    local id, otid = ARGV[at + i * 5], ARGV[at + i * 5 + 1]
    if seen[id] then return false end
    seen[id], ids[i + 1] = true, id
    if otid ~= '' then otids[#otids + 1] = otid end
  end
  if #otids > 0 then
    seen = {}
    for _, otid in ipairs(otids) do
      if seen[otid] then return false end
      seen[otid] = true
    end
    local stored = redis.pcall('HMGET', KEYS[direct.KEY.otids], unpack(otids))
    if stored.err then return false end
    for i = 1, #otids do if stored[i] then return false end end
  end
  local stored = redis.pcall('HMGET', KEYS[direct.KEY.ids], unpack(ids))
  if stored.err then return false end
  for i = 1, n do if stored[i] then return false end end
  return true
end

-- The keys this call may have made get meta's deadline when it has one (with a ttl it does; a
-- store without one keeps a deadline another store set): every key the thread had before
-- carries it already (the general path's apply_expiry: every write that moves it sets it on
-- all). The open chunk's strings are new when it held nothing or closed, the id map when the thread
-- stored nothing (each stored message has its id there), the otid map may be whenever an otid
-- is written, the chunk index when a close makes it (`index`, the close's; a closed chunk is a
-- COPY of the open one, deadline and all); the event stream sees to itself (direct.event).
function direct.expire_made(KEYS, open_new, ids_new, otids_written, index)
  if not (open_new or ids_new or otids_written or index) then return end
  local deadline = redis.call('PEXPIRETIME', KEYS[direct.KEY.meta])
  if deadline <= 0 then return end
  if index then redis.call('PEXPIREAT', index, deadline) end
  if open_new then
    redis.call('PEXPIREAT', KEYS[direct.KEY.open_data], deadline)
    redis.call('PEXPIREAT', KEYS[direct.KEY.open_manifest], deadline)
  end
  if ids_new then redis.call('PEXPIREAT', KEYS[direct.KEY.ids], deadline) end
  if otids_written then redis.call('PEXPIREAT', KEYS[direct.KEY.otids], deadline) end
end

-- The call's turn, as check_turn and check_lease read it, in one HMGET of its header, lease and
-- lease end: the turn and the lease's new end (nil: none to write), or nil when the general
-- path must take the call (no header in today's format: a turn not started, or one to convert;
-- a finished turn; a lease that is not the turn's, or that ended; turns of another type).
function direct.turn(turns_key, turn_id, lease, lease_ms)
  local got = redis.pcall('HMGET', turns_key, turn_id, lease_field(turn_id), expires_field(turn_id))
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
function direct.write_turn(turns_key, turn_id, turn, first, last, renewed)
  extend_turn(turn, first, last)
  local fields = {turn_id, turn_header(turn)}
  for k, range in pairs(turn.writes) do
    fields[#fields + 1], fields[#fields + 2] = range_field(turn_id, k), range
  end
  if renewed then fields[#fields + 1], fields[#fields + 2] = expires_field(turn_id), fmt(renewed) end
  redis.call('HSET', turns_key, unpack(fields))
end

-- The manifest lines of the call's `n` messages from ARGV[at], stored from `first`, as
-- manifest_line and side_info write them: each line one string.format when nothing needs
-- escaping (a concatenation of its parts makes a string of each, ~2 us a line).
function direct.lines(ARGV, at, n, first, turn_id)
  if not string.find(turn_id, FRAMING) then
    local lines
    for i = 0, n - 1 do
      local b = at + i * 5
      local id, otid = ARGV[b], ARGV[b + 1]
      if string.find(id, FRAMING) or string.find(otid, FRAMING) then lines = nil; break end
      local line = string.format('%.0f\t%s\t%s\t0\t%.0f\t%s\t%.0f\n', first + i, id, otid, #ARGV[b + 4], turn_id, ARGV[b + 3])
      if n == 1 then return line end
      lines = lines or {}
      lines[i + 1] = line
    end
    if lines then return table.concat(lines) end
  end
  local lines = {}
  for i = 0, n - 1 do
    local b = at + i * 5
    lines[i + 1] = manifest_line(first + i, side_info(ARGV[b], ARGV[b + 1], 0, #ARGV[b + 4], turn_id, tonumber(ARGV[b + 3])))
  end
  return table.concat(lines)
end

-- The call's records from ARGV[at] joined, or the one record.
function direct.data(ARGV, at, n)
  if n == 1 then return ARGV[at + 4] end
  local data = {}
  for i = 0, n - 1 do data[i + 1] = ARGV[at + i * 5 + 4] end
  return table.concat(data)
end

-- Appends `lines` and `data` to the open chunk's manifest and data, which hold `manifest_bytes`
-- and `data_bytes` as meta accounts for them (flush_open's writes and refusals); nil, or the
-- refusal with nothing left written.
function direct.flush(KEYS, lines, data, manifest_bytes, data_bytes)
  local manifest_key, data_key = KEYS[direct.KEY.open_manifest], KEYS[direct.KEY.open_data]
  local manifest_length = redis.pcall('APPEND', manifest_key, lines)
  if type(manifest_length) == 'table' then return call_error(manifest_key, manifest_length) end
  if manifest_length ~= manifest_bytes + #lines then
    take_back(manifest_key, manifest_length, #lines)
    return unaccounted(manifest_key, manifest_length - #lines, manifest_bytes)
  end
  local data_length = redis.pcall('APPEND', data_key, data)
  if type(data_length) == 'table' or data_length ~= data_bytes + #data then
    take_back(manifest_key, manifest_length, #lines)
    if type(data_length) == 'table' then return call_error(data_key, data_length) end
    take_back(data_key, data_length, #data)
    return unaccounted(data_key, data_length - #data, data_bytes)
  end
  return nil
end

-- The close of the open chunk a call makes before ARGV message `split` (direct.fit), read and
-- checked before any write as the general path checks it (check_store_keys): the close's
-- state, or nil when the general path must take the call (a thread with a ttl, retention that
-- may run, a key of another type, a chunk already where this one goes). `v` is direct.META's;
-- `first`, where the open chunk starts: open_first, or the call's first sequence when the chunk
-- is empty (meta's open_first is then absent, or left by a chunk closed before).
function direct.close_plan(KEYS, limits, v, split, first)
  if limits.ttl_ms > 0 or split == nil then return nil end
  local meta = redis.call('HMGET', KEYS[direct.KEY.meta], 'open_last', 'open_media', 'summary_last', 'gen')
  if limits.retained_limit >= 0 and tonumber(meta[3] or '0') > 0 then return nil end
  local keys = thread_keys(KEYS)
  for _, pair in ipairs({{keys.open_data, tonumber(v[12] or 0)}, {keys.open_manifest, tonumber(v[16] or 0)}}) do
    local length = redis.pcall('STRLEN', pair[1])
    if type(length) ~= 'number' or length ~= pair[2] then return nil end
  end
  if redis.call('EXISTS', chunk_key(keys, first), chunk_data_key(keys, first), chunk_manifest_key(keys, first)) > 0 then
    return nil
  end
  local err = check_key_types({
    {keys.chunk_index, 'zset'}, {keys.window_side, 'hash'}, {keys.large_index, 'zset'},
    {keys.otids, 'hash'}, {keys.turns, 'hash'}, {keys.pairs, 'zset'},
  })
  if err then return nil end
  return {keys = keys, first = first, last = tonumber(meta[1] or 0), media = tonumber(meta[2] or 0),
    gen = tonumber(meta[4] or 0)}
end

-- Closes the open chunk as close_open does (COPY to the chunk's keys, the open pair deleted, the
-- chunk indexed), once it holds `count` records, `bytes` and `tokens` of them, up to `last`.
function direct.close(close, count, bytes, tokens, last)
  local keys, first = close.keys, close.first
  redis.call('COPY', keys.open_data, chunk_data_key(keys, first))
  redis.call('COPY', keys.open_manifest, chunk_manifest_key(keys, first))
  redis.call('DEL', keys.open_data, keys.open_manifest)
  redis.call('ZADD', keys.chunk_index, first, chunk_index_member(first, last, count, bytes, close.media, tokens))
end

-- The added event of first..last, as emit_event writes it for a call that counted it (`n`, the
-- event's number, never the thread's first), with the stream's deadline as emit_event keeps it.
function direct.event(KEYS, limits, n, first, last, turn_id, born, ttl)
  local events_key, cap, id = KEYS[direct.KEY.events], events_cap(limits), string.format('%.0f-%.0f', n, last)
  if not ttl then
    if born then
      redis.pcall('XADD', events_key, 'MAXLEN', '~', cap, id, 'k', 'added', 'a', first, 'b', last, 't', turn_id, 'g', born)
    else
      redis.pcall('XADD', events_key, 'MAXLEN', '~', cap, id, 'k', 'added', 'a', first, 'b', last, 't', turn_id)
    end
    local age = limits.events_age_ms
    if redis.call('PTTL', events_key) < age then
      -- A thread with a deadline (another store's ttl) keeps its stream to that deadline.
      local deadline = redis.call('PEXPIRETIME', KEYS[direct.KEY.meta])
      if deadline > 0 then
        redis.call('PEXPIREAT', events_key, deadline)
      else
        redis.pcall('PEXPIRE', events_key, age + math.floor(age / 2))
      end
    end
    return
  end
  local xadd = {'XADD', events_key, 'NOMKSTREAM', 'MAXLEN', '~', cap, id, 'k', 'added', 'a', first, 'b', last, 't', turn_id}
  if born then xadd[16], xadd[17] = 'g', born end
  if redis.pcall(unpack(xadd)) == false then
    table.remove(xadd, 3)
    redis.pcall(unpack(xadd))
    redis.call('PEXPIREAT', events_key, redis.call('PEXPIRETIME', KEYS[direct.KEY.meta]))
  end
end

-- Writes the call's messages (n from ARGV[at], stored from `first`) into the open chunk, closing
-- it before message `split` when `close` says so (direct.close_plan); `o` is the open chunk as
-- meta accounts for it (first, count, bytes, tokens, manifest_bytes), updated to what it holds
-- after. Returns nil, or flush_open's refusal with nothing written.
function direct.store(KEYS, ARGV, at, n, first, turn_id, o, close, split)
  local from = 0
  if close then
    local closed_bytes, closed_tokens = 0, 0
    if split > 0 then
      local lines, data = direct.lines(ARGV, at, split, first, turn_id), direct.data(ARGV, at, split)
      local refused = direct.flush(KEYS, lines, data, o.manifest_bytes, o.bytes)
      if refused then return refused end
      closed_bytes = #data
      for i = 0, split - 1 do closed_tokens = closed_tokens + tonumber(ARGV[at + i * 5 + 3]) end
    end
    local last = split > 0 and first + split - 1 or close.last
    direct.close(close, o.count + split, o.bytes + closed_bytes, o.tokens + closed_tokens, last)
    o.first, o.count, o.bytes, o.tokens, o.manifest_bytes = first + split, 0, 0, 0, 0
    from = split
  end
  local lines, data = direct.lines(ARGV, at + from * 5, n - from, first + from, turn_id), direct.data(ARGV, at + from * 5, n - from)
  local refused = direct.flush(KEYS, lines, data, o.manifest_bytes, o.bytes)
  if refused then return refused end
  if o.count == 0 then o.first = first + from end
  o.count, o.bytes, o.manifest_bytes = o.count + n - from, o.bytes + #data, o.manifest_bytes + #lines
  for i = from, n - 1 do o.tokens = o.tokens + tonumber(ARGV[at + i * 5 + 3]) end
  return nil
end

-- The ids (and otids) of the call's messages, stored from `first`; whether an otid was written.
-- A single message's id was claimed already (append_direct's HSETNX).
function direct.write_ids(KEYS, ARGV, at, n, first)
  if n == 1 then
    if ARGV[at + 1] == '' then return false end
    redis.call('HSET', KEYS[direct.KEY.otids], ARGV[at + 1], first)
    return true
  end
  local id_fields, otid_fields = {}, {}
  for i = 0, n - 1 do
    local b, sequence = at + i * 5, first + i
    id_fields[2 * i + 1], id_fields[2 * i + 2] = ARGV[b], sequence
    if ARGV[b + 1] ~= '' then otid_fields[#otid_fields + 1], otid_fields[#otid_fields + 2] = ARGV[b + 1], sequence end
  end
  redis.call('HSET', KEYS[direct.KEY.ids], unpack(id_fields))
  if #otid_fields == 0 then return false end
  redis.call('HSET', KEYS[direct.KEY.otids], unpack(otid_fields))
  return true
end

-- The append of the call (the append script's KEYS and ARGV) when it is the common case, else
-- nil with nothing written.
local function append_direct(KEYS, ARGV)
  local at = direct.AT.messages
  local n = (#ARGV - at + 1) / direct.AT.width
  local limits = read_limits(ARGV, direct.AT.limits)
  local turn_id, lease = ARGV[direct.AT.turn_id], tonumber(ARGV[direct.AT.lease])
  if n < 1 or n % 1 ~= 0 or not lease or limits.strict_history or (lease ~= 0 and turn_id == '') then return nil end
  local meta_key = KEYS[direct.KEY.meta]
  -- With a ttl, only while meta's deadline stays (a write that moves it sets it on every key of
  -- the thread, which the general path does).
  local ttl = limits.ttl_ms > 0
  if ttl and redis.call('PTTL', meta_key) < limits.ttl_ms then return nil end
  local v = redis.pcall('HMGET', meta_key, unpack(direct.META))
  if v.err or not direct.plain(v, limits) then return nil end
  local last_seq, count, bytes = tonumber(v[2] or 0), tonumber(v[11] or 0), tonumber(v[12] or 0)
  local total, tokens, split = direct.fit(ARGV, at, n, limits, count, bytes)
  if not total or last_seq + n > MAX_SEQUENCE or tonumber(v[8] or 0) + tokens > MAX_THREAD_TOKENS then return nil end
  if not direct.new(KEYS, ARGV, at, n) then return nil end
  local open_first = count > 0 and tonumber(v[10] or 0) or last_seq + 1
  local close = split and direct.close_plan(KEYS, limits, v, split, open_first)
  if split and not close then return nil end
  local turn, renewed
  if turn_id ~= '' then
    turn, renewed = direct.turn(KEYS[direct.KEY.turns], turn_id, lease, limits.turn_lease_ms)
    if not turn then return nil end
  end
  local first, ids_key = last_seq + 1, KEYS[direct.KEY.ids]
  if n == 1 then
    local claimed = redis.pcall('HSETNX', ids_key, ARGV[at], first)
    if claimed ~= 1 then return nil end  -- stored already, or not a hash: the general path says which
  end

  local open = {first = open_first, count = count, bytes = bytes, tokens = tonumber(v[13] or 0),
    manifest_bytes = tonumber(v[16] or 0)}
  local refused = direct.store(KEYS, ARGV, at, n, first, turn_id, open, close, split)
  if refused then
    if n == 1 then redis.call('HDEL', ids_key, ARGV[at]) end
    return refused
  end
  local otids_written = direct.write_ids(KEYS, ARGV, at, n, first)
  local last, events = last_seq + n, tonumber(v[14] or 0) + 1
  -- meta's `expires` (includes/expiry.lua): '1' a deadline, '0' none; a store without a ttl
  -- learns it once for a thread whose meta does not say (new, or older than the field).
  local expires = v[17]
  if not (ttl or expires) then expires = redis.call('PEXPIRETIME', meta_key) > 0 and '1' or '0' end
  if turn then direct.write_turn(KEYS[direct.KEY.turns], turn_id, turn, first, last, renewed) end
  -- Only the fields that change, as store_batch writes them (every field costs the call, and
  -- its bytes in the AOF).
  local events_on, stored = limits.events_len > 0, tonumber(v[3] or 0)
  local opens = open.first ~= tonumber(v[10] or 0)
  if events_on and not opens and expires == v[17] then
    redis.call('HSET', meta_key, 'last_seq', last, 'stored', stored + n, 'bytes', tonumber(v[4] or 0) + total,
      'tokens', tonumber(v[8] or 0) + tokens, 'open_last', last, 'open_count', open.count, 'open_bytes', open.bytes,
      'open_tokens', open.tokens, 'open_manifest_bytes', open.manifest_bytes, 'events', events)
  else
    local fields = {'last_seq', last, 'stored', stored + n, 'bytes', tonumber(v[4] or 0) + total,
      'tokens', tonumber(v[8] or 0) + tokens, 'open_last', last, 'open_count', open.count, 'open_bytes', open.bytes,
      'open_tokens', open.tokens, 'open_manifest_bytes', open.manifest_bytes}
    if close and close.media ~= 0 then fields[#fields + 1], fields[#fields + 2] = 'open_media', 0 end
    if opens then fields[#fields + 1], fields[#fields + 2] = 'open_first', open.first end
    if events_on then fields[#fields + 1], fields[#fields + 2] = 'events', events end
    if close then fields[#fields + 1], fields[#fields + 2] = 'gen', close.gen + 1 end
    if expires ~= v[17] then fields[#fields + 1], fields[#fields + 2] = 'expires', expires end
    redis.call('HSET', meta_key, unpack(fields))
  end
  if events_on then direct.event(KEYS, limits, events, first, last, turn_id, v[15] or false, ttl) end
  -- A thread without a deadline (no ttl, meta's `expires` '0') pays no PEXPIRETIME.
  if ttl or expires == '1' then
    direct.expire_made(KEYS, count == 0 or close ~= nil, stored == 0, otids_written, close and close.keys.chunk_index)
  end
  return {1, first}
end
