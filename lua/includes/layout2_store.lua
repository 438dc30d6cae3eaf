--- @include "includes/layout"
--- @include "includes/checks"
--- @include "includes/turns"
--- @include "includes/numbers"
--- @include "includes/layout2"
--- @include "includes/layout2_rollover"
--- @include "includes/layout2_format"
--- @include "includes/layout1_migration"
--- @include "includes/layout2_index"
--- @include "includes/layout2_chunks"
-- Stores a batch of messages: the shared body of append and compact.
--
-- `batch` holds parallel lists ids, otids, media, tokens, records and the turn id ('' for none).
-- `limits` holds window_size, chunk_size, chunk_max_bytes, max_move_chunks, max_move_bytes,
-- max_message_bytes and max_media.
--
-- This is the hot path, so it makes few server calls: meta is read once (load_meta) and
-- written once (store_batch), and only the keys this call may write have their type checked;
-- the maps it reads first (meta, ids, otids) are checked by those reads themselves.

local META_FIELDS = {'layout', 'last_seq', 'stored', 'bytes', 'media', 'window_bytes', 'deleting', 'checked', 'tokens', 'restoring', 'born'}
local TOKENS_FIELD = 9

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
  local values, err = checked_read(keys.meta, 'HMGET', keys.meta, unpack(META_FIELDS))
  if err then return nil, err end
  local meta = {layout = values[1] or nil}
  for i = 2, #META_FIELDS - 1 do meta[META_FIELDS[i]] = tonumber(values[i] or '0') end
  -- The incarnation, as text (includes/events.lua); false for none yet.
  meta.born = values[#META_FIELDS] or false
  if meta.deleting > 0 then return nil, deleting_error() end
  if meta.restoring > 0 and not restoring_ok then return nil, restoring_error() end
  -- A thread written before meta kept a token total (store_batch counts it once).
  meta.tokens_missing = not values[TOKENS_FIELD] and (meta.stored > 0 or meta.layout ~= nil)
  return meta
end

-- The batch's window messages as {sequence, bytes, record} and its oversized ones as sequences.
local function split_batch(batch, limits, meta)
  local incoming, oversized, incoming_bytes = {}, {}, 0
  for i = 1, #batch.records do
    local sequence = meta.last_seq + i
    if #batch.records[i] > limits.chunk_max_bytes then
      oversized[#oversized + 1] = sequence
    else
      incoming[#incoming + 1] = {sequence, #batch.records[i], batch.records[i]}
      incoming_bytes = incoming_bytes + #batch.records[i]
    end
  end
  return incoming, oversized, incoming_bytes
end

-- Checks the layout and the types of the keys this batch may write, before any write: the
-- window by the ZCARD the rollover plan needs anyway (kept in meta.window_count), the window
-- side hash by being the first key written (store_batch), the others with TYPE; chunk keys this
-- call will create must not exist. Returns the rollover plan (includes/layout2_rollover.lua), or nil
-- and an error reply.
local function check_store_keys(keys, batch, limits, meta)
  local unreadable = unreadable_layout(meta.layout)
  if unreadable then return nil, unreadable end
  local count, err = checked_read(keys.window, 'ZCARD', keys.window)
  if err then return nil, err end
  meta.window_count = count
  local incoming, oversized, incoming_bytes = split_batch(batch, limits, meta)
  local expected = {}
  if batch.turn_id ~= '' then expected[#expected + 1] = {keys.turns, 'hash'} end
  if meta.layout ~= CURRENT_LAYOUT then expected[#expected + 1] = {keys.legacy, 'hash'} end
  if #oversized > 0 then expected[#expected + 1] = {keys.large_index, 'zset'} end
  for _, sequence in ipairs(oversized) do
    expected[#expected + 1] = {chunk_key(keys, sequence), 'none'}
  end
  if cut_possible(limits, count + #incoming, meta.window_bytes + incoming_bytes) then
    -- A cut writes the chunk index and may run retention, which touches these too.
    for _, pair in ipairs({{keys.chunk_index, 'zset'}, {keys.window_side, 'hash'}, {keys.large_index, 'zset'},
                           {keys.otids, 'hash'}, {keys.turns, 'hash'}, {keys.pairs, 'zset'}}) do
      expected[#expected + 1] = pair
    end
  end
  err = check_key_types(expected)
  if err then return nil, err end
  return plan_rollover(keys, limits, meta, incoming)
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

-- Writes a checked batch; returns its first sequence, or an error reply if the window side
-- hash, the first key written, has the wrong type (then nothing was written). `meta` (from
-- load_meta and check_store_keys, read after any migration step) is updated in place and
-- written back in one call.
local function store_batch(keys, batch, limits, meta)
  local count = #batch.ids
  local last = meta.last_seq
  local first = last + 1
  local total_bytes, total_media, total_tokens, window_bytes, window_added = 0, 0, 0, 0, 0
  local side_fields, window_members, id_fields, otid_fields, oversized = {}, {}, {}, {}, {}
  for i = 1, count do
    local sequence = last + i
    local record = batch.records[i]
    local side = side_info(batch.ids[i], batch.otids[i], batch.media[i], #record, batch.turn_id, batch.tokens[i])
    if #record > limits.chunk_max_bytes then
      oversized[#oversized + 1] = {sequence, record, side, batch.media[i], batch.tokens[i]}
    else
      side_fields[#side_fields + 1] = sequence
      side_fields[#side_fields + 1] = side
      window_members[#window_members + 1] = sequence
      window_members[#window_members + 1] = record
      window_bytes = window_bytes + #record
      window_added = window_added + 1
    end
    id_fields[#id_fields + 1] = batch.ids[i]
    id_fields[#id_fields + 1] = sequence
    if batch.otids[i] ~= '' then
      otid_fields[#otid_fields + 1] = batch.otids[i]
      otid_fields[#otid_fields + 1] = sequence
    end
    total_bytes = total_bytes + #record
    total_media = total_media + batch.media[i]
    total_tokens = total_tokens + batch.tokens[i]
  end

  if #side_fields > 0 then
    local reply = redis.pcall('HSET', keys.window_side, unpack(side_fields))
    if type(reply) == 'table' and reply.err then return nil, call_error(keys.window_side, reply) end
    redis.call('ZADD', keys.window, unpack(window_members))
  end
  for _, item in ipairs(oversized) do
    local sequence, record, side, media, tokens = item[1], item[2], item[3], item[4], item[5]
    write_chunk(keys, sequence, manifest_line(sequence, side), record)
    redis.call('ZADD', keys.large_index, sequence, large_index_member(sequence, #record, media, tokens))
  end
  redis.call('HSET', keys.ids, unpack(id_fields))
  if #otid_fields > 0 then redis.call('HSET', keys.otids, unpack(otid_fields)) end

  if batch.turn_id ~= '' then
    -- The header and at most one range field (includes/turns.lua), read by check_turn.
    local turn = batch.turn
    if turn == nil then turn = read_turn(keys, batch.turn_id) end
    turn = turn or new_turn()
    extend_turn(turn, first, last + count)
    write_turn(keys, batch.turn_id, turn)
  end

  meta.layout = meta.layout or CURRENT_LAYOUT  -- a migrating thread stays at 1 until done
  meta.last_seq = last + count
  meta.stored = meta.stored + count
  meta.bytes = meta.bytes + total_bytes
  meta.window_bytes = meta.window_bytes + window_bytes
  meta.window_count = meta.window_count + window_added
  meta.media = meta.media + total_media
  if meta.tokens_missing then
    meta.tokens, meta.tokens_missing = thread_tokens(keys) - total_tokens, false  -- the batch is stored already
  end
  meta.tokens = meta.tokens + total_tokens
  -- Numbers go to the server as they are: it writes an integer's digits exactly (to 2^53).
  redis.call('HSET', keys.meta, 'layout', meta.layout, 'last_seq', meta.last_seq,
    'stored', meta.stored, 'bytes', meta.bytes, 'window_bytes', meta.window_bytes, 'media', meta.media,
    'tokens', meta.tokens)
  return first
end

-- A layout-1 thread moves a bounded step before the batch is stored; a step that moved anything
-- takes this call's move budget (the caller then rolls over only what the call adds). Returns
-- the chunks moved and meta as it is now (the window is untouched by migration, so its count
-- carries over).
local function migrate_first(keys, limits, meta)
  if meta.layout == CURRENT_LAYOUT then return 0, meta end
  local migrated = migrate_step(keys, limits)
  local window_count = meta.window_count
  meta = load_meta(keys)
  meta.window_count = window_count
  return migrated, meta
end
