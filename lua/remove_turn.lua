#!lua
--- Retracts a turn: removes its messages wherever they are stored, the system prompt
--- retention kept aside too (includes/prompt.lua). Nothing evicted by the media budget is
--- restored; removed messages give their bytes and media back.
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV limits (limits): the store's limits (includes/args.lua: read_limits)
--- ARGV turn_id (str)
--- ARGV max_messages (int): the most sequences one call walks; the client calls again for
---      more
---
--- Reply: {removed, remaining}: removed counts the kept prompt's messages too
--- With strict history checks on a checked thread, a removal that would leave a later message
--- answering a call the turn made is refused; the calls the turn's messages answered that were
--- made before it are open again (includes/history.lua).
---
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_RESTORING, KVS_MIGRATING, KVS_HISTORY,
---         KVS_QUOTA, KVS_QUOTA_BYTES, KVS_OWNER_ERASING (an owned thread: includes/owner.lua)
--- @include "includes/layout"
--- @include "includes/events"
--- @include "includes/turns"
--- @include "includes/expiry"
--- @include "includes/history"
--- @include "includes/layout2_index"
--- @include "includes/layout1"
--- @include "includes/layout2_edit"
--- @include "includes/checks"
--- @include "includes/prompt"

local keys = thread_keys(KEYS)
local limits = args.limits
local turn_id, max_messages = args.turn_id, args.max_messages

local err = check_thread(keys) or check_key_types({{keys.prompt_manifest, 'string'}, {keys.prompt_data, 'string'}})
if err then return err end
if is_layout_1(keys) then
  return redis.error_reply('KVS_MIGRATING the thread is still in layout 1: migrate it first')
end

local turn = read_turn(keys, turn_id)
if not turn then
  -- Retention may have taken the turn's record with its messages, and kept some aside.
  -- Its writes keep every deadline (SET ... KEEPTTL): the expiry step runs only for the event.
  local dropped = prompt.drop_turn(keys, turn_id)
  if dropped > 0 then
    begin_expiry(keys, limits.ttl_ms)
    redis.call('HINCRBY', keys.meta, 'edits', 1)  -- as below
    emit_event(keys, limits, nil, event_fields('turn_removed', '', '', turn_id, 'n', dropped, 'r', 0))
    apply_expiry(keys)
  end
  return {dropped, 0}
end
-- The oldest max_messages sequences of the turn, from its oldest ranges on.
local sequences = {}
local k = turn.k0
while turn.kept > 0 and k <= turn.k1 and #sequences < max_messages do
  local a, b = turn_range(keys, turn_id, turn, k)
  for s = a, math.min(b, a + max_messages - #sequences - 1) do sequences[#sequences + 1] = s end
  k = k + 1
end

local history_plan
if redis.call('HEXISTS', keys.meta, 'checked') == 1 then
  local ranges, whole = {}, {}
  for k = turn.k0, turn.k1 do
    if turn.kept == 0 then break end
    local a, b = turn_range(keys, turn_id, turn, k)
    ranges[#ranges + 1] = {a, b}
    for s = a, b do whole[s] = true end
  end
  local refusal
  refusal, history_plan = plan_turn_removal(keys, limits, ranges, whole)
  if refusal then return refusal end
end

begin_expiry(keys, limits.ttl_ms)
local dropped = prompt.drop_turn(keys, turn_id)
if #sequences > 0 then ensure_tokens(keys) end
remove_history(keys, history_plan, sequences)
local removed, bytes, media, tokens = 0, 0, 0, 0
local ids, otids = {}, {}
local last_done = nil
for _, sequence in ipairs(sequences) do
  local found, id, otid, m_media, m_bytes, _, m_tokens = remove_stored(keys, sequence)
  if found then
    ids[#ids + 1] = id
    if otid ~= '' then otids[#otids + 1] = otid end
    bytes = bytes + m_bytes
    media = media + m_media
    tokens = tokens + m_tokens
    removed = removed + 1
  end
  last_done = sequence
end

if #ids > 0 then redis.call('HDEL', keys.ids, unpack(ids)) end
if #otids > 0 then redis.call('HDEL', keys.otids, unpack(otids)) end
if last_done then drop_turn_through(keys, turn_id, turn, last_done) end
local remaining = turn.kept
if remaining > 0 then
  write_turn(keys, turn_id, turn)
else
  delete_turn(keys, turn_id, turn)
  local current = redis.call('HGET', keys.meta, 'turn_id')
  if current == turn_id then redis.call('HDEL', keys.meta, 'turn_id', 'turn_seq', 'turn_outcome') end
end
if removed > 0 then
  redis.call('HINCRBY', keys.meta, 'stored', 0 - removed)
  redis.call('HINCRBY', keys.meta, 'bytes', 0 - bytes)
  if media > 0 then redis.call('HINCRBY', keys.meta, 'media', 0 - media) end
  redis.call('HINCRBY', keys.meta, 'tokens', 0 - tokens)
  redis.call('HINCRBY', keys.meta, 'gen', 1)
end
-- The kept prompt's messages count as removed (the thread's counts took them with retention).
removed = removed + dropped
if removed > 0 or remaining == 0 then
  -- A fork copying the thread meanwhile compares it (kvstore/_engine/fork.py): its copy so far
  -- may hold part of the turn.
  redis.call('HINCRBY', keys.meta, 'edits', 1)
  emit_event(keys, limits, nil, event_fields('turn_removed', '', '', turn_id, 'n', removed, 'r', remaining))
end
apply_expiry(keys)
return {removed, remaining}
