#!lua
--- Restores a run of a backed-up thread's messages at their stored sequences.
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV limits (limits): the store's limits (includes/args.lua: read_limits)
--- ARGV turn_id (str): '' for none; every message of the run is of this turn
--- ARGV first (int): the sequence of the run's first message; the run is first..first+count-1
--- ARGV pairs (str): what each message opens and answers, with strict history checks
---      (includes/history.lua: read_batch_pairs); '' when none does, and without them
--- ARGV born (str): the incarnation (meta `born`) the call must find: '' for any (a restore's
---      first call into no thread); a later call sends the one the restore's first write made
---      or found, an import's first call the one of the thread it found
--- ARGV source (str): '' for an import; a fork sends its source's mark (what the copy so far was
---      made from: the source's incarnation, retention, summary and edits), kept in meta
---      `fork_source` while the fork is under way
--- ARGV messages[] id (str), otid (str): '' for none, media (int): the message's inline
---      media bytes, tokens (int): its token count, record (bytes)
---
--- A message whose id is stored at its own sequence was restored before: it is skipped. The
--- others must come after every sequence the thread holds (the thread's last_seq); an id or
--- otid stored at another sequence, or a sequence already taken, is refused and nothing is
--- written. Retention runs when a chunk was cut, as after an append. With strict history checks
--- the thread's open calls are built from the runs as they come, refusing nothing (the backup's
--- history is what it is): a thread restored whole by such a store is checked from then on.
--- A call that stores anything marks the thread `restoring` in meta: every other write refuses it
--- (KVS_RESTORING) until restore_state's last call, the restore's last step, clears the mark.
--- A call sending `born` writes into that incarnation only: another thread of the id (the one
--- it wrote deleted, its owner erased, or made again since) is refused (KVS_RESTORE_CONFLICT)
--- before anything is written, so no run lands in a thread missing the runs before it.
---
--- Reply: {restored, already_stored}
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_TOO_LARGE, KVS_MEDIA_OVER,
---         KVS_OTID_REPEATED, KVS_ID_REPEATED, KVS_RESTORE_CONFLICT, KVS_HISTORY,
---         KVS_QUOTA, KVS_QUOTA_BYTES, KVS_OWNER_ERASING (an owned thread: includes/owner.lua)
--- @include "includes/layout"
--- @include "includes/thread"
--- @include "includes/expiry"
--- @include "includes/history"
--- @include "includes/events"
--- @include "includes/layout3_store"
--- @include "includes/layout2_retention"
--- @include "includes/layout1"

local keys = thread_keys(KEYS)
local limits = args.limits
local turn_id = args.turn_id
local first = args.first
local count = args.messages.n
local batch = read_batch(args.messages, turn_id, 0)
read_batch_pairs(args.pairs, batch, limits)

local meta, failure = load_meta(keys, true)
if failure then return failure end
if args.born ~= '' and meta.born ~= args.born then
  return redis.error_reply('KVS_RESTORE_CONFLICT the thread is not the import or fork in progress this call started: deleted, its owner erased or made again since its first step (run it again to start over)')
end
if meta.layout ~= nil and meta.layout ~= CURRENT_LAYOUT then
  return redis.error_reply('KVS_LAYOUT thread is stored in layout ' .. meta.layout .. ', a restore writes into layout 3 only')
end
if legacy_exists(keys) then
  return redis.error_reply('KVS_LAYOUT thread holds a layout-1 message hash, a restore writes into layout 3 only')
end
local err

-- Messages restored before sit at their own sequences; the rest must follow all of them.
local stored
stored, err = checked_read(keys.ids, 'HMGET', keys.ids, unpack(batch.ids))
if err then return err end
local already = 0
for i = 1, count do
  local sequence = first + i - 1
  if stored[i] then
    if tonumber(stored[i]) ~= sequence then
      return redis.error_reply(string.format('KVS_RESTORE_CONFLICT message %s is stored at sequence %s, the backup has it at %d',
        batch.ids[i], stored[i], sequence))
    end
    if already ~= i - 1 then
      return redis.error_reply(string.format('KVS_RESTORE_CONFLICT message %s is stored but the one before it is not', batch.ids[i]))
    end
    already = i
  end
end
if already == count then return {0, count} end
local new_first = first + already
if new_first <= meta.last_seq then
  return redis.error_reply(string.format('KVS_RESTORE_CONFLICT sequence %d is taken: the thread holds messages up to %d that the backup does not',
    new_first, meta.last_seq))
end

local new = {ids = {}, otids = {}, media = {}, tokens = {}, records = {}, turn_id = turn_id, pairs = batch.pairs and {}}
for i = already + 1, count do
  new.ids[#new.ids + 1] = batch.ids[i]
  new.otids[#new.otids + 1] = batch.otids[i]
  new.media[#new.media + 1] = batch.media[i]
  new.tokens[#new.tokens + 1] = batch.tokens[i]
  new.records[#new.records + 1] = batch.records[i]
  if new.pairs then new.pairs[#new.pairs + 1] = batch.pairs[i] end
end
failure = check_history(keys, new, limits, meta, true)
if failure then return failure end
-- store_batch assigns last_seq + 1 ...: the run goes at its own sequences (a removed turn or
-- retention left the hole before it).
meta.last_seq = new_first - 1
local plan
plan, failure = check_store_keys(keys, new, limits, meta)
if failure then return failure end
-- An otid stored at all is at another sequence (its message is not among those skipped): some
-- or all of them, it is one conflict, and check_batch then sees no replay.
local otids = {}
for _, otid in ipairs(new.otids) do
  if otid ~= '' then otids[#otids + 1] = otid end
end
if #otids > 0 then
  stored, err = checked_read(keys.otids, 'HMGET', keys.otids, unpack(otids))
  if err then return err end
  for i = 1, #otids do
    if stored[i] then
      return redis.error_reply(string.format('KVS_RESTORE_CONFLICT otid %s is stored at sequence %s', otids[i], stored[i]))
    end
  end
end
failure = check_batch(keys, new, limits, meta)
if failure then return failure end

begin_expiry(keys, limits.ttl_ms)
if meta.layout == nil then begin_incarnation(keys) end  -- a new thread (includes/events.lua)
local _, closed, refused = store_batch(keys, new, limits, meta, plan)
if refused then return refused end
if args.source ~= '' then
  redis.call('HSET', keys.meta, 'restoring', '1', 'fork_source', args.source)
else
  redis.call('HSET', keys.meta, 'restoring', '1')
end
apply_history(keys, new, new_first)
if closed > 0 then
  retain(keys, limits.retained_limit, limits.max_move_chunks)
end
apply_expiry(keys)
return {count - already, already}
