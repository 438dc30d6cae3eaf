#!lua flags=no-writes
--- Reads a range of the thread's messages, records included, in one step: the consistent read
--- that a read of several round trips (a page walk, context) falls back on when writes changed
--- the thread under each of its optimistic tries (kvstore/_engine/pages.py, views.py). It reads
--- whole containers, in walk order, until they hold what the walk needs; the client cuts.
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV lo_kind (str: '' | 'seq' | 'id' | 'summary'): the exclusive lower bound of the
---      range; 'summary': the context summary's last sequence (0 without a summary)
--- ARGV lo (str): a sequence or a message id, '' for none
--- ARGV hi_kind (str: '' | 'seq' | 'id'): the exclusive upper bound of the range
--- ARGV hi (str): a sequence or a message id, '' for none
--- ARGV walk (str: 'up' | 'down'): which end of the range the read starts from
--- ARGV need (int): the records the walk needs, 0 for every record of the range
--- ARGV max_tokens (int): 0 for none; else the walk needs the records whose stored counts,
---      summed in walk order, pass it
--- ARGV lookback (int): with lo_kind 'summary' and a summary, also the `lookback` records at
---      and before the summary's last sequence, newest first; 0 for none
--- ARGV extras (str: '' | 'snapshot'): 'snapshot' also replies the summary (as lo_kind
---      'summary' does) and, after the records, what stats() reads
---
--- Reply: {deleted_before, summary_last, summary_seq, summary_record, summary_tokens,
---         n, sequence_1, record_1, tokens_1, ..., m, (the lookback's records likewise)}
---   summary_*: 0, 0, '', 0 without a summary or with another lo_kind. The n records are the
---   range's in walk order: every one, or at least the `need` (or those passing max_tokens)
---   first of the walk when the range holds them, and whole containers past them. With
---   'snapshot' the reply goes on: k, meta's fields and values (k of them, flat), the window's,
---   chunk index's and large index's ZCARD and the legacy hash's HLEN.
--- Errors: KVS_CURSOR_NOT_FOUND, KVS_CURSOR_EXPIRED <deleted_before>. A key of another type
---   fails the command that reads it (nothing is written either way).
--- @include "includes/layout"
--- @include "includes/cursors"
--- @include "includes/layout1"
--- @include "includes/layout2_reads"

local keys = thread_keys(KEYS)
local lo_kind, lo_arg, hi_kind, hi_arg = args.lo_kind, args.lo, args.hi_kind, args.hi
local walk, need, max_tokens, lookback = args.walk, args.need, args.max_tokens, args.lookback
local snapshot = args.extras == 'snapshot'

local meta = redis.call('HMGET', keys.meta, 'deleted_before', 'last_seq', 'deleting', 'layout', 'migrated',
  'legacy_last', 'summary_last', 'summary_seq')
local deleted_before = tonumber(meta[1] or '0')
local last_seq = tonumber(meta[2] or '0')
local deleting, layout = meta[3], meta[4]
local summary_last, summary_seq = tonumber(meta[7] or '0'), tonumber(meta[8] or '0')
-- A thread being deleted (lua/delete.lua) reads as empty, whatever it still holds.
if deleting then deleted_before, last_seq, summary_last, summary_seq = 0, 0, 0, 0 end

-- A layout-1 thread's legacy messages not yet migrated (includes/layout1.lua, legacy_range).
local legacy_first, legacy_last = 0, 0
if not deleting and holds_legacy(keys, layout) then
  legacy_first, legacy_last, last_seq = legacy_range(keys, meta[5], meta[6], last_seq)
end

local lo, hi
if lo_kind == 'summary' then
  lo = summary_last
else
  local err
  lo, err = resolve_cursor(keys.ids, lo_kind, lo_arg, deleted_before)
  if err then return err end
end
local hi_resolved, hi_err = resolve_cursor(keys.ids, hi_kind, hi_arg, deleted_before)
if hi_err then return hi_err end
lo, hi = lo or 0, hi_resolved
if deleted_before > 0 and lo < deleted_before - 1 then lo = deleted_before - 1 end
if not hi or hi > last_seq + 1 then hi = last_seq + 1 end

local reply = {deleted_before, 0, 0, '', 0}
if (lo_kind == 'summary' or snapshot) and summary_seq > 0 then
  reply[2], reply[3] = summary_last, summary_seq
  local found = walk_range(keys, summary_seq - 1, summary_seq + 1, 'up', 1, 0, legacy_first, legacy_last)
  if found[1] then reply[4], reply[5] = found[1][2], found[1][3] end
end
local function add(records)
  reply[#reply + 1] = #records
  for _, record in ipairs(records) do
    reply[#reply + 1] = record[1]
    reply[#reply + 1] = record[2]
    reply[#reply + 1] = record[3]
  end
end
add(walk_range(keys, lo, hi, walk, need, max_tokens, legacy_first, legacy_last))
if lo_kind == 'summary' and summary_seq > 0 and lookback > 0 then
  local before = {}
  for i, record in ipairs(walk_range(keys, math.max(0, deleted_before - 1), summary_last + 1, 'down', lookback, 0,
    legacy_first, legacy_last)) do
    if i <= lookback then before[i] = record end
  end
  add(before)
else
  add({})
end
if snapshot then
  local fields = redis.call('HGETALL', keys.meta)
  reply[#reply + 1] = #fields
  for _, value in ipairs(fields) do reply[#reply + 1] = value end
  add_container_sizes(keys, reply)
end
return reply
