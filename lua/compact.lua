#!lua
--- Stores a summary message and moves the context summary to it, then runs retention.
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV limits (limits): the store's limits (includes/args.lua: read_limits)
--- ARGV summary_last (int): the last sequence the summary covers
--- ARGV asked (int): the last_sequence the caller sent (summary_last before the pair rule moved
---   it back, docs/HISTORY.md; else the same)
--- ARGV id (str): the summary message's
--- ARGV otid (str): its otid, '' for none
--- ARGV media (int): its inline media bytes
--- ARGV tokens (int): its token count
--- ARGV record (bytes): its record
---
--- The summary covers messages up to summary_last; it must be stored (or deleted) already and
--- may not move back. A summary_last equal to the current summary's is a replay when the caller
--- asked for that range (asked is the current summary's summary_last or meta's summary_asked):
--- the current summary is returned and nothing is written. Moved back onto it from further
--- (a tool call just after it is answered after asked), it is refused: no range is left that
--- keeps the pair whole. Retention then deletes the oldest chunks it allows
--- (includes/layout2_retention).
---
--- Reply: {1, summary_sequence, chunks_deleted}, or {0, summary_sequence, 0} for a replay
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_RESTORING, KVS_MIGRATING, KVS_TOO_LARGE, KVS_MEDIA_OVER,
---         KVS_BAD_SUMMARY, KVS_DUPLICATE_ID (the summary's id stored, but withdrawn by a replace),
---         KVS_QUOTA, KVS_QUOTA_BYTES, KVS_OWNER_ERASING (an owned thread: includes/owner.lua)
--- @include "includes/layout"
--- @include "includes/thread"
--- @include "includes/events"
--- @include "includes/expiry"
--- @include "includes/layout3_store"
--- @include "includes/layout1_migration"
--- @include "includes/layout2_retention"

local keys = thread_keys(KEYS)
local limits = args.limits
local summary_last = args.summary_last
local batch = read_batch({id = {args.id}, otid = {args.otid}, media = {args.media}, tokens = {args.tokens}, record = {args.record}}, '', 0)

local meta, failure = load_meta(keys)
local plan
failure = failure or check_thread(keys)
if not failure then plan, failure = check_store_keys(keys, batch, limits, meta) end
failure = failure or check_batch(keys, batch, limits, meta)
if not failure and meta.layout ~= CURRENT_LAYOUT then failure = check_migration(keys) end
if failure then
  if type(failure) == 'table' and failure[1] == 0 then
    -- Found by its id: a replay, unless a replace withdrew that summary since (the thread's
    -- summary is none, or older than it: docs/HISTORY.md, "Replacing the summary").
    if tonumber(redis.call('HGET', keys.meta, 'summary_seq') or '0') < failure[2] then
      return redis.error_reply('KVS_DUPLICATE_ID the summary id names a stored message that is not the thread\'s summary now (it was replaced): compact with another text or range')
    end
    return {0, failure[2], 0}
  end
  return failure
end
local last_seq = meta.last_seq
local current = redis.call('HMGET', keys.meta, 'summary_last', 'summary_asked')
local previous = tonumber(current[1] or '0')
if summary_last < 1 or summary_last > last_seq then
  return redis.error_reply(string.format('KVS_BAD_SUMMARY last_sequence %d is not a stored sequence (1..%d)', summary_last, last_seq))
end
if summary_last < previous then
  return redis.error_reply(string.format('KVS_BAD_SUMMARY last_sequence %d is before the current summary\'s %d', summary_last, previous))
end
if summary_last == previous then
  -- The current summary already covers exactly this range: a compaction sent again (with a new
  -- summary id) is a replay of it, not a second summary.
  if args.asked == previous or args.asked == tonumber(current[2] or '0') then
    return {0, tonumber(redis.call('HGET', keys.meta, 'summary_seq')), 0}
  end
  return redis.error_reply(string.format('KVS_BAD_SUMMARY this summary was not stored: last_sequence %d splits a tool call from its answer, and the call is the first message after the current summary\'s range (up to %d), so nothing before it is left to summarize: compact through the answer, or later', args.asked, previous))
end

begin_expiry(keys, limits.ttl_ms)
meta = migrate_first(keys, limits, meta)
local sequence, _, refused = store_batch(keys, batch, limits, meta, plan)
if refused then return refused end
-- What the caller asked for, where the pair rule moved it back: a replay asks for it again.
if args.asked ~= summary_last then
  redis.call('HSET', keys.meta, 'summary_last', summary_last, 'summary_seq', sequence, 'summary_asked', args.asked)
else
  redis.call('HSET', keys.meta, 'summary_last', summary_last, 'summary_seq', sequence)
  redis.call('HDEL', keys.meta, 'summary_asked')
end
local deleted = retain(keys, limits.retained_limit, limits.max_move_chunks)
emit_event(keys, limits, sequence, event_fields('compacted', sequence, summary_last, ''))
-- A compaction is where a thread rests: its open chunk without APPEND's slack.
open_chunk.trim(keys)
apply_expiry(keys)
return {1, sequence, deleted}
