--- @include "includes/layout"
--- @include "includes/expiry"
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
