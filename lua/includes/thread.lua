--- @include "includes/checks"
--- @include "includes/expiry"
-- The thread's keys, named once from KEYS (every script takes the same twelve). KEYS is passed
-- in: a script's is a global, a library function's is its argument.
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

-- The batch of messages a call sends (its `messages[]` argument: id, otid, media, tokens,
-- record), of the turn `turn_id` ('' for none), with the caller's lease of the turn (0 for none:
-- check_turn refuses the batch when another lease holds the turn).
local function read_batch(messages, turn_id, lease)
  return {
    ids = messages.id, otids = messages.otid, media = messages.media, tokens = messages.tokens,
    records = messages.record, turn_id = turn_id, lease = lease ~= 0 and lease or nil,
  }
end

-- The start of a call that needs nothing of the thread but that it is writable: its keys
-- named, the thread checked (before any write), the call's expiry begun. Returns the keys and,
-- when the thread is not writable, an error reply.
local function begin_thread_call(KEYS, limits)
  local keys = thread_keys(KEYS)
  local err = check_thread(keys)
  if not err then begin_expiry(keys, limits.ttl_ms) end
  return keys, err
end
