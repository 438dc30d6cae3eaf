--- @include "includes/checks"
--- @include "includes/expiry"
-- The thread's keys, named once from KEYS (every script takes the same twelve). KEYS and ARGV
-- are passed in: a script's are globals, a library function's are its arguments.
local function thread_keys(KEYS)
  return {
    meta = KEYS[1], window = KEYS[2], window_side = KEYS[3], chunk_index = KEYS[4],
    large_index = KEYS[5], ids = KEYS[6], otids = KEYS[7], turns = KEYS[8], legacy = KEYS[9],
    chunk_prefix = KEYS[10], events = KEYS[11], pairs = KEYS[12],
  }
end

-- Fails unless every key is missing or of its type, and the thread is in layout 2 (and writable:
-- includes/checks.lua, check_layout).
local function check_thread(keys, restoring_ok)
  return check_key_types({
    {keys.meta, 'hash'}, {keys.window, 'zset'}, {keys.window_side, 'hash'},
    {keys.chunk_index, 'zset'}, {keys.large_index, 'zset'}, {keys.ids, 'hash'},
    {keys.otids, 'hash'}, {keys.turns, 'hash'}, {keys.legacy, 'hash'}, {keys.pairs, 'zset'},
  }) or check_layout(keys.meta, restoring_ok)
end

-- The arguments of one message of a batch: id, otid, media, tokens, record.
local BATCH_STRIDE = 5

-- Reads the batch of `count` messages whose BATCH_STRIDE arguments each (id, otid, media,
-- tokens, record) start after ARGV[offset]; batch.next_arg is the index of the first argument
-- after the batch.
local function read_batch(ARGV, offset, count, turn_id)
  local batch = {ids = {}, otids = {}, media = {}, tokens = {}, records = {}, turn_id = turn_id}
  -- A turn id sent as "<turn_id>\t<lease>" carries the caller's lease of the turn (turn ids hold
  -- no tab): check_turn refuses the batch when another lease holds the turn.
  local turn, lease = string.match(turn_id, '^([^\t]*)\t(%d+)$')
  if turn then batch.turn_id, batch.lease = turn, tonumber(lease) end
  for i = 1, count do
    local base = offset + (i - 1) * BATCH_STRIDE
    batch.ids[i] = ARGV[base + 1]
    batch.otids[i] = ARGV[base + 2]
    batch.media[i] = tonumber(ARGV[base + 3])
    batch.tokens[i] = tonumber(ARGV[base + 4])
    batch.records[i] = ARGV[base + 5]
  end
  batch.next_arg = offset + count * BATCH_STRIDE + 1
  return batch
end

-- The limits every writing script takes as ARGV[1..10]:
-- window_size, chunk_size, chunk_max_bytes, max_move_chunks, max_move_bytes,
-- max_message_bytes, max_media, retained_limit (-1 keeps all), ttl_ms (0: none), and ARGV[10],
-- their key: the nine as sent, joined by ':', then '|' and the event limits events_len (0: no
-- events) and events_age_ms and history_checks (1: strict, 0: off; includes/history.lua)
-- joined by ':' (carried in the key so that no script's own arguments move).
--
-- A store sends the same limits on every call, and parsing nine numbers is a good part of a
-- small call's Lua time. A library's functions keep this table between calls (a script's is new
-- on every call), so a store's limits are parsed once: a key is remembered only when it names
-- exactly the values sent with it, and the tables handed out are never written to.
local LIMITS_BY_KEY, LIMITS_KEPT, LIMITS_KEEP_AT_MOST = {}, 0, 64

local function read_limits(ARGV)
  local key = ARGV[10]
  local limits = LIMITS_BY_KEY[key]
  if limits then return limits end
  limits = {
    window_size = tonumber(ARGV[1]), chunk_size = tonumber(ARGV[2]),
    chunk_max_bytes = tonumber(ARGV[3]), max_move_chunks = tonumber(ARGV[4]),
    max_move_bytes = tonumber(ARGV[5]), max_message_bytes = tonumber(ARGV[6]),
    max_media = tonumber(ARGV[7]), retained_limit = tonumber(ARGV[8]),
    ttl_ms = tonumber(ARGV[9]),
  }
  local events_len, events_age, checks = string.match(key, '|(%d+):(%d+):([01])$')
  limits.events_len, limits.events_age_ms = tonumber(events_len or '0'), tonumber(events_age or '0')
  limits.strict_history = checks == '1'
  if key == table.concat({ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]}, ':')
      .. '|' .. (events_len or '') .. ':' .. (events_age or '') .. ':' .. (checks or '') then
    if LIMITS_KEPT >= LIMITS_KEEP_AT_MOST then LIMITS_BY_KEY, LIMITS_KEPT = {}, 0 end
    LIMITS_BY_KEY[key] = limits
    LIMITS_KEPT = LIMITS_KEPT + 1
  end
  return limits
end

-- The start of a call that needs nothing of the thread but that it is writable: its keys and
-- limits named, the thread checked (before any write), the call's expiry begun. Returns keys,
-- limits and, when the thread is not writable, an error reply.
local function begin_thread_call(KEYS, ARGV)
  local keys, limits = thread_keys(KEYS), read_limits(ARGV)
  local err = check_thread(keys)
  if not err then begin_expiry(keys, limits.ttl_ms) end
  return keys, limits, err
end
