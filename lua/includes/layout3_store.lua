--- @include "includes/layout"
--- @include "includes/checks"
--- @include "includes/turns"
--- @include "includes/numbers"
--- @include "includes/layout2"
--- @include "includes/layout2_format"
--- @include "includes/layout1_migration"
--- @include "includes/layout2_index"
--- @include "includes/layout2_chunks"
--- @include "includes/expiry"
--- @include "includes/layout3_migration"
-- Stores a batch of messages into the thread's open chunk (layout 3): the shared body of
-- append, compact and restore.
--
-- `batch` holds parallel lists ids, otids, media, tokens, records and the turn id ('' for none).
-- `limits` holds chunk_size, chunk_max_bytes, max_message_bytes and max_media.
--
-- Each record is written once: appended (APPEND) to the open chunk's records, `open:d`, and its
-- manifest line to `open:m`. Before a record joins a full open chunk, the chunk is closed on the
-- server: COPY of both strings to the chunk's own keys (an exact copy, without the greedy
-- growth APPEND leaves), DEL of the open pair, and its index member; no record passes through
-- Lua again. A record larger than chunk_max_bytes gets its own chunk. This is the hot path, so
-- it makes few server calls: meta is read once (load_meta) and written once (store_batch), and
-- only the keys this call may write have their type checked; the maps it reads first (meta,
-- ids, otids) are checked by those reads themselves.

local META_FIELDS = {'layout', 'last_seq', 'stored', 'bytes', 'media', 'window_bytes', 'deleting', 'checked', 'tokens',
  'restoring', 'open_first', 'open_last', 'open_count', 'open_bytes', 'open_media', 'open_tokens', 'events', 'born',
  'open_manifest_bytes', 'expires'}

local function wrong_type(key)
  return redis.error_reply('KVS_WRONGTYPE ' .. key .. ' does not hold the type kvstore keeps there')
end

-- An error reply from pcall: a wrong type is named as kvstore's, anything else (an ACL denial)
-- is passed on as the server said it.
local function call_error(key, reply)
  local message = tostring(reply.err)  -- fakeredis hands the error over as userdata
  if string.find(message, 'WRONGTYPE', 1, true) then return wrong_type(key) end
  return redis.error_reply(message)
end

-- A read that doubles as the type check of its key.
local function checked_read(key, ...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then return nil, call_error(key, reply) end
  return reply
end

-- The meta fields the store path needs, as numbers (layout as a string or nil); refuses a
-- thread being deleted, or restored (unless `restoring_ok`: lua/restore.lua).
local function load_meta(keys, restoring_ok)
  local v, err = checked_read(keys.meta, 'HMGET', keys.meta, unpack(META_FIELDS))
  if err then return nil, err end
  -- One constructor (a table sized once: this runs on every write), in META_FIELDS' order; the
  -- incarnation stays text (includes/events.lua), false for none yet.
  local meta = {
    layout = v[1] or nil, last_seq = tonumber(v[2] or 0), stored = tonumber(v[3] or 0), bytes = tonumber(v[4] or 0),
    media = tonumber(v[5] or 0), window_bytes = tonumber(v[6] or 0), deleting = v[7], checked = tonumber(v[8] or 0),
    tokens = tonumber(v[9] or 0), restoring = v[10], open_first = tonumber(v[11] or 0),
    open_last = tonumber(v[12] or 0), open_count = tonumber(v[13] or 0), open_bytes = tonumber(v[14] or 0),
    open_media = tonumber(v[15] or 0), open_tokens = tonumber(v[16] or 0), events = tonumber(v[17] or 0),
    born = v[18] or false, open_manifest_bytes = tonumber(v[19] or 0), expires = v[20] or false,
    -- A thread written before meta kept a token total (store_batch counts it once).
    tokens_missing = not v[9] and (tonumber(v[3] or 0) > 0 or v[1] ~= false),
  }
  if meta.deleting then return nil, deleting_error() end
  if meta.restoring and not restoring_ok then return nil, restoring_error() end
  return meta
end

-- Where the batch's records go: plan.oversized, the sequences of those that get a chunk of their
-- own; plan.close_before[i], true when the open chunk is closed before record i joins it (at
-- chunk_size records, before its records would pass close_bytes, or where it fills a size
-- class: close_here); plan.closes, the first sequence of each chunk closed.
local function plan_store(batch, limits, meta)
  local close_bytes = math.min(limits.chunk_max_bytes, CLOSE_BYTES)
  local count, bytes, first = meta.open_count, meta.open_bytes, meta.open_first
  local plan = {oversized = {}, close_before = {}, closes = {}}
  for i = 1, #batch.records do
    local sequence, size = meta.last_seq + i, #batch.records[i]
    if size > limits.chunk_max_bytes then
      plan.oversized[#plan.oversized + 1] = sequence
    else
      if count > 0 and (count >= limits.chunk_size or bytes + size > close_bytes or close_here(bytes, size)) then
        plan.close_before[i] = true
        plan.closes[#plan.closes + 1] = first
        count, bytes = 0, 0
      end
      if count == 0 then first = sequence end
      count, bytes = count + 1, bytes + size
    end
  end
  return plan
end

-- The refusal of an open-chunk string that does not hold what meta accounts for (a foreign value
-- at its name).
local function unaccounted(key, length, expected)
  return redis.error_reply(string.format('KVS_WRONGTYPE %s holds %d bytes where the thread accounts for %d',
    key, length, expected))
end

-- Checks the layout and the types of the keys this batch may write, before any write: the open
-- chunk's two strings by STRLEN (type and length) where other writes come before theirs, the
-- others with TYPE; no key may be where a chunk this call makes goes (COPY does not overwrite, and the open chunk is deleted after it). Returns the plan
-- (plan_store), or nil and an error reply.
local function check_store_keys(keys, batch, limits, meta)
  local unreadable = unreadable_layout(meta.layout)
  if unreadable then return nil, unreadable end
  local plan = plan_store(batch, limits, meta)
  if #plan.closes > 0 or #plan.oversized > 0 or meta.layout ~= CURRENT_LAYOUT or meta.window_bytes > 0 then
    -- Other writes come first on this path: the open chunk's strings are checked now. (On the
    -- common path their own APPENDs are the call's first writes and check them: flush_open.)
    for _, pair in ipairs({{keys.open_data, meta.open_bytes}, {keys.open_manifest, meta.open_manifest_bytes}}) do
      local length, err = checked_read(pair[1], 'STRLEN', pair[1])
      if err then return nil, err end
      if length ~= pair[2] then return nil, unaccounted(pair[1], length, pair[2]) end
    end
  end
  local expected = {}
  if batch.turn_id ~= '' then expected[#expected + 1] = {keys.turns, 'hash'} end
  if meta.layout ~= CURRENT_LAYOUT then expected[#expected + 1] = {keys.legacy, 'hash'} end
  if #plan.oversized > 0 then expected[#expected + 1] = {keys.large_index, 'zset'} end
  local new_chunks = {unpack(plan.oversized)}
  for _, first in ipairs(plan.closes) do new_chunks[#new_chunks + 1] = first end
  for _, first in ipairs(new_chunks) do
    for _, key in ipairs({chunk_key(keys, first), chunk_data_key(keys, first), chunk_manifest_key(keys, first)}) do
      expected[#expected + 1] = {key, 'none'}
    end
  end
  if #plan.closes > 0 then
    -- A close writes the chunk index and may run retention, which touches these too.
    for _, pair in ipairs({{keys.chunk_index, 'zset'}, {keys.window_side, 'hash'}, {keys.large_index, 'zset'},
                           {keys.otids, 'hash'}, {keys.turns, 'hash'}, {keys.pairs, 'zset'}}) do
      expected[#expected + 1] = pair
    end
  end
  local err = check_key_types(expected)
  if err then return nil, err end
  return plan
end

-- The reply to a replay: {0, sequence_1, id_1, ...}, each stored message's sequence and id. The
-- id comes from the side info (an otid replay sends ids of its own), so that the client can name
-- a message even when retention deletes it before the client reads it back. A layout-1 message
-- not yet migrated has no side info: its id is ''.
local function replay_reply(keys, sequences)
  local err = check_key_types({{keys.window_side, 'hash'}, {keys.large_index, 'zset'}, {keys.chunk_index, 'zset'}})
  if err then return err end
  local reply = {0}
  for _, value in ipairs(sequences) do
    local sequence = tonumber(value)
    local where, first = locate(keys, sequence)
    local side
    if where == 'window' then
      side = redis.call('HGET', keys.window_side, sequence)
    elseif where == 'open' then
      side = manifest_find(read_open(keys), sequence)
    elseif where then
      side = manifest_find(chunk_manifest(keys, first), sequence)
    end
    reply[#reply + 1] = sequence
    reply[#reply + 1] = (side and parse_side(side)) or ''
  end
  return reply
end

-- Checks the batch against the thread; returns nil when it may be stored, or a reply: an error,
-- or replay_reply's when every message is already stored (a replay).
local function check_batch(keys, batch, limits, meta)
  local count = #batch.ids
  for i = 1, count do
    if #batch.records[i] > limits.max_message_bytes then
      return redis.error_reply(string.format('KVS_TOO_LARGE message %d is %d bytes, the limit is %d',
        i - 1, #batch.records[i], limits.max_message_bytes))
    end
  end

  -- otids: all stored means a replay, none stored means new, anything else is refused.
  local given, seen = {}, nil
  for i = 1, count do
    local otid = batch.otids[i]
    if otid ~= '' then
      seen = seen or {}
      if seen[otid] then return redis.error_reply('KVS_OTID_REPEATED otid ' .. otid .. ' appears twice in the batch') end
      seen[otid] = true
      given[#given + 1] = otid
    end
  end
  local otids_stored = 0
  if #given > 0 then
    local stored, err = checked_read(keys.otids, 'HMGET', keys.otids, unpack(given))
    if err then return err end
    for _, sequence in ipairs(stored) do
      if sequence then otids_stored = otids_stored + 1 end
    end
    if otids_stored > 0 and otids_stored < #given then
      return redis.error_reply(string.format('KVS_OTID_CONFLICT %d of %d otids in the batch are already stored', otids_stored, #given))
    end
    if otids_stored == count then
      return replay_reply(keys, stored)
    end
  end

  -- Message ids double as the call's idempotency token: a retried call re-sends the same ids.
  if count > 1 then
    seen = {}
    for i = 1, count do
      if seen[batch.ids[i]] then return redis.error_reply('KVS_ID_REPEATED message id ' .. batch.ids[i] .. ' appears twice in the batch') end
      seen[batch.ids[i]] = true
    end
  end
  local stored, err = checked_read(keys.ids, 'HMGET', keys.ids, unpack(batch.ids))
  if err then return err end
  local present = 0
  for _, sequence in ipairs(stored) do
    if sequence then present = present + 1 end
  end
  if present > 0 then
    if present == count then
      return replay_reply(keys, stored)
    end
    return redis.error_reply(string.format('KVS_DUPLICATE_ID %d of %d message ids are already stored', present, count))
  end
  if otids_stored > 0 then
    -- Every otid is stored but the messages without one are new: a mix.
    return redis.error_reply(string.format('KVS_OTID_CONFLICT the batch\'s %d otids are stored but its other messages are new', otids_stored))
  end

  -- The thread's inline media budget: the client strips the incoming messages' own inline parts
  -- to fit what is left, and sends the call again.
  local incoming = 0
  for i = 1, count do incoming = incoming + batch.media[i] end
  if incoming > 0 then
    local current = meta.media
    if current + incoming > limits.max_media then
      return redis.error_reply(string.format('KVS_MEDIA_OVER %.0f bytes of inline media are left in the thread',
        math.max(0, limits.max_media - current)))
    end
  end
  -- The thread's sums stay exact in Lua's doubles (includes/numbers.lua).
  if meta.last_seq + count > MAX_SEQUENCE then
    return redis.error_reply(string.format('KVS_TOO_LARGE the thread\'s sequences would pass %.0f (2^50)', MAX_SEQUENCE))
  end
  local tokens = 0
  for i = 1, count do tokens = tokens + batch.tokens[i] end
  if meta.tokens + tokens > MAX_THREAD_TOKENS then
    return redis.error_reply(string.format('KVS_TOO_LARGE the thread\'s token total would pass %.0f (2^52)', MAX_THREAD_TOKENS))
  end
  return nil
end

-- The open chunk's helpers: its writer and what joins it (store_batch), its trim (trim_open).
local open_chunk = {}

-- The open chunk while a call writes it: what the server holds (meta's open_* fields) and the
-- records this call adds that are not yet written (data, lines).
function open_chunk.writer(meta)
  return {
    first = meta.open_first, last = meta.open_last, count = meta.open_count, bytes = meta.open_bytes,
    media = meta.open_media, tokens = meta.open_tokens, manifest_bytes = meta.open_manifest_bytes,
    server_bytes = meta.open_bytes, on_server = meta.open_count > 0, data = {}, lines = {},
  }
end

-- Takes back an APPEND of `added` bytes that made `key` `length` bytes long (KEEPTTL: the
-- thread's deadline stays).
local function take_back(key, length, added)
  if length > added then
    redis.call('SET', key, redis.call('GETRANGE', key, 0, length - added - 1), 'KEEPTTL')
  else
    redis.call('DEL', key)
  end
end

-- Writes the records the open chunk holds but the server does not yet, appended to the open pair
-- (APPEND to a missing key writes an exact string: no growth slack). Each APPEND's reply (the
-- new length) is its check: a key of another type, or a string meta does not account for, takes
-- back what this call appended and refuses (on the common path these are the call's first
-- writes, so the call then wrote nothing; on the others check_store_keys checked both first).
local function flush_open(keys, open)
  if #open.data == 0 then return nil end
  local lines, data = table.concat(open.lines), table.concat(open.data)
  local manifest_length = redis.pcall('APPEND', keys.open_manifest, lines)
  if type(manifest_length) == 'table' then return call_error(keys.open_manifest, manifest_length) end
  if manifest_length ~= open.manifest_bytes + #lines then
    take_back(keys.open_manifest, manifest_length, #lines)
    return unaccounted(keys.open_manifest, manifest_length - #lines, open.manifest_bytes)
  end
  local data_length = redis.pcall('APPEND', keys.open_data, data)
  if type(data_length) == 'table' or data_length ~= open.server_bytes + #data then
    take_back(keys.open_manifest, manifest_length, #lines)
    if type(data_length) == 'table' then return call_error(keys.open_data, data_length) end
    take_back(keys.open_data, data_length, #data)
    return unaccounted(keys.open_data, data_length - #data, open.server_bytes)
  end
  open.manifest_bytes, open.server_bytes = manifest_length, data_length
  open.on_server, open.data, open.lines = true, {}, {}
  return nil
end

-- Closes the open chunk: its records and manifest become the chunk's keys (COPY on the server,
-- or written straight there when this call made all of it), indexed in the chunk index.
-- check_store_keys made sure no key is where the chunk goes.
local function close_open(keys, open)
  local first = open.first
  local data_key, manifest_key = chunk_data_key(keys, first), chunk_manifest_key(keys, first)
  if open.on_server then
    local refused = flush_open(keys, open)
    if refused then error(refused) end  -- check_store_keys checked both strings on this path
    redis.call('COPY', keys.open_data, data_key)
    redis.call('COPY', keys.open_manifest, manifest_key)
    redis.call('DEL', keys.open_data, keys.open_manifest)
    -- COPY carries the open chunk's deadline; one this call made has none yet.
    expire_new_chunk(keys, data_key)
    expire_new_chunk(keys, manifest_key)
  else
    write_chunk(keys, first, table.concat(open.lines), table.concat(open.data))
  end
  redis.call('ZADD', keys.chunk_index, first,
    chunk_index_member(first, open.last, open.count, open.bytes, open.media, open.tokens))
  open.first, open.last, open.count, open.bytes, open.media, open.tokens = 0, 0, 0, 0, 0, 0
  open.manifest_bytes, open.server_bytes, open.on_server, open.data, open.lines = 0, 0, false, {}, {}
end

-- Leaves the open chunk's records exact, where a thread goes quiet (a finished turn, a
-- compaction). APPEND grows a string greedily (below 1 MB each reallocation doubles what it
-- needs), so an open chunk carries up to as many bytes again as it holds, and an idle thread
-- would keep that until its chunk closes. COPY writes an exact copy and carries the deadline;
-- copied back over the string (REPLACE), it frees the grown one. RENAME would keep the slack
-- (and is not among the least-privilege ACL's commands). No byte through Lua; `spare` is gone
-- again before the call ends. The manifest is left as it is: its slack is a few hundred bytes,
-- not worth two more commands on every finished turn.
function open_chunk.trim(keys)
  local spare = keys.chunk_prefix .. 'spare'
  if redis.call('COPY', keys.open_data, spare, 'REPLACE') == 1 then
    redis.call('COPY', spare, keys.open_data, 'REPLACE')
    redis.call('DEL', spare)
  end
end

-- One record joins the open chunk (written by flush_open).
function open_chunk.add(open, sequence, side, record, media, tokens)
  if open.count == 0 then open.first = sequence end
  open.data[#open.data + 1] = record
  open.lines[#open.lines + 1] = manifest_line(sequence, side)
  open.last, open.count, open.bytes = sequence, open.count + 1, open.bytes + #record
  open.media, open.tokens = open.media + media, open.tokens + tokens
end

-- The id, otid and turn writes of a stored batch at first..first+count-1.
local function store_ids(keys, batch, first)
  local id_fields, otid_fields = {}, {}
  for i = 1, #batch.ids do
    id_fields[#id_fields + 1] = batch.ids[i]
    id_fields[#id_fields + 1] = first + i - 1
    if batch.otids[i] ~= '' then
      otid_fields[#otid_fields + 1] = batch.otids[i]
      otid_fields[#otid_fields + 1] = first + i - 1
    end
  end
  redis.call('HSET', keys.ids, unpack(id_fields))
  if #otid_fields > 0 then redis.call('HSET', keys.otids, unpack(otid_fields)) end
  if batch.turn_id ~= '' then
    -- The header and at most one range field (includes/turns.lua), read by check_turn.
    local turn = batch.turn
    if turn == nil then turn = read_turn(keys, batch.turn_id) end
    turn = turn or new_turn()
    extend_turn(turn, first, first + #batch.ids - 1)
    write_turn(keys, batch.turn_id, turn)
    if batch.lease_renewed then redis.call('HSET', keys.turns, expires_field(batch.turn_id), fmt(batch.lease_renewed)) end
  end
end

-- Writes a checked batch as `plan` (check_store_keys) says; returns its first sequence and the
-- number of chunks closed, or nil, nil and flush_open's refusal (then nothing was written). `meta` (from load_meta, read after any migration step) is updated in
-- place and written back in one call.
local function store_batch(keys, batch, limits, meta, plan)
  local count, first = #batch.ids, meta.last_seq + 1
  local open = open_chunk.writer(meta)
  local total_bytes, total_media, total_tokens, closed = 0, 0, 0, 0
  for i = 1, count do
    local sequence, record, media, tokens = first + i - 1, batch.records[i], batch.media[i], batch.tokens[i]
    local side = side_info(batch.ids[i], batch.otids[i], media, #record, batch.turn_id, tokens)
    if #record > limits.chunk_max_bytes then
      write_chunk(keys, sequence, manifest_line(sequence, side), record)
      redis.call('ZADD', keys.large_index, sequence, large_index_member(sequence, #record, media, tokens))
    else
      if plan.close_before[i] then
        close_open(keys, open)
        closed = closed + 1
      end
      open_chunk.add(open, sequence, side, record, media, tokens)
    end
    total_bytes, total_media, total_tokens = total_bytes + #record, total_media + media, total_tokens + tokens
  end
  local refused = flush_open(keys, open)
  if refused then return nil, nil, refused end
  store_ids(keys, batch, first)

  if meta.tokens_missing then
    meta.tokens, meta.tokens_missing = thread_tokens(keys) - total_tokens, false  -- the batch is stored already
  end
  -- Only the fields that change: every field costs the call. Numbers go to the server as they
  -- are: it writes an integer's digits exactly (to 2^53).
  local fields = {'last_seq', meta.last_seq + count, 'stored', meta.stored + count, 'bytes', meta.bytes + total_bytes,
    'tokens', meta.tokens + total_tokens, 'open_last', open.last, 'open_count', open.count, 'open_bytes', open.bytes,
    'open_tokens', open.tokens, 'open_manifest_bytes', open.manifest_bytes}
  if meta.layout == nil or meta.layout == '2' then  -- a layout-1 thread stays at 1 until migrated
    fields[#fields + 1], fields[#fields + 2] = 'layout', CURRENT_LAYOUT
  end
  if total_media > 0 then fields[#fields + 1], fields[#fields + 2] = 'media', meta.media + total_media end
  if open.media ~= meta.open_media then fields[#fields + 1], fields[#fields + 2] = 'open_media', open.media end
  if open.first ~= meta.open_first then fields[#fields + 1], fields[#fields + 2] = 'open_first', open.first end
  -- The event this call will make, counted here rather than by its own write (includes/events.lua).
  if meta.events_counted then fields[#fields + 1], fields[#fields + 2] = 'events', meta.events end
  -- Whether the thread has a deadline, where meta does not say yet (includes/expiry.lua).
  if not meta.expires then
    fields[#fields + 1], fields[#fields + 2] = 'expires', (keys.ttl_moved or keys.deadline > 0) and '1' or '0'
  end
  redis.call('HSET', keys.meta, unpack(fields))
  if closed > 0 then redis.call('HINCRBY', keys.meta, 'gen', 1) end
  return first, closed
end

-- A layout-1 thread moves a bounded step before the batch is stored, and so does the window a
-- layout-2 thread left (meta's window_bytes > 0: includes/layout3_migration.lua). Returns meta
-- as it is now.
local function migrate_first(keys, limits, meta)
  if meta.layout == CURRENT_LAYOUT or meta.layout == '2' or meta.layout == nil then
    if meta.window_bytes <= 0 or drain_window(keys, limits) == 0 then return meta end
    return load_meta(keys)
  end
  migrate_step(keys, limits)
  return load_meta(keys)
end
