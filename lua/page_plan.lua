#!lua flags=no-writes
--- Reads, in one step, what a page plan needs when only a script can read it: an id cursor,
--- resolved through the ids map, or a layout-1 thread's legacy range still to migrate. A page
--- with sequence cursors on a layout-2 thread reads the same facts with native commands instead
--- (kvstore/_engine/layout/plan.py: _native_facts). The client picks the containers from them (plan.py:
--- _select) and fetches the records natively, comparing `gen`. No message is read here.
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV lo_kind (str: '' | 'seq' | 'id'): the exclusive lower bound of the range
--- ARGV lo (str): a sequence or a message id, '' for none
--- ARGV hi_kind (str: '' | 'seq' | 'id'): the exclusive upper bound of the range
--- ARGV hi (str): a sequence or a message id, '' for none
--- ARGV walk (str: 'up' | 'down'): which end of the range the page starts from
--- ARGV need (int): messages wanted (the page limit + 1)
--- ARGV max_chunks (int): chunks a plan names at most
---
--- Reply: {gen, deleted_before, lo, hi, layout, below, n_above, above..., n_large,
---         large..., legacy_first, legacy_last, legacy_count, window_first, window_last,
---         window_count, open_first, open_last, open_count}
---   lo and hi are the range, clamped (exclusive bounds); layout the thread's (1, 2 or 3).
---   Walk up: `below` is the chunk index member at or before lo ('' for none) and `above` the
---   first max_chunks + 1 members after it in the range. Walk down: `above` are the chunk index
---   members before hi, newest first. `large` are the first `need` oversized members in the
---   range in walk order. legacy_* are 0 but for a layout-1 thread: the part of its legacy hash
---   not yet migrated, read like one more chunk. window_*: the window's lowest and highest
---   sequence in the range and its count there (0s for none); open_*: meta's (layout 3's open
---   chunk, 0s when empty).
--- Errors: KVS_CURSOR_NOT_FOUND, KVS_CURSOR_EXPIRED <deleted_before>. A key of another type
---   fails the command that reads it (nothing is written either way).
--- @include "includes/layout"
--- @include "includes/cursors"
--- @include "includes/layout1"
--- @include "includes/layout2_reads"

local keys = thread_keys(KEYS)
local lo_kind, lo_arg, hi_kind, hi_arg = args.lo_kind, args.lo, args.hi_kind, args.hi
local walk, need, max_chunks = args.walk, args.need, args.max_chunks

local meta = redis.call('HMGET', keys.meta, 'gen', 'deleted_before', 'last_seq', 'deleting', 'layout',
  'migrated', 'legacy_last', 'open_first', 'open_last', 'open_count')
local gen = tonumber(meta[1] or '0')
local deleted_before = tonumber(meta[2] or '0')
local last_seq = tonumber(meta[3] or '0')
local deleting, layout = meta[4], meta[5]
-- A thread being deleted (lua/delete.lua) reads as empty, whatever chunks it still has.
if deleting then deleted_before, last_seq = 0, 0 end

-- A layout-1 thread's legacy messages not yet migrated (includes/layout1.lua, legacy_range).
local legacy_first, legacy_last, legacy_count = 0, 0, 0
local layout_number = tonumber(layout or CURRENT_LAYOUT)
if not deleting and holds_legacy(keys, layout) then
  layout_number = 1
  legacy_count = legacy_fields(keys)
  legacy_first, legacy_last, last_seq = legacy_range(keys, meta[6], meta[7], last_seq, legacy_count)
end

local lo, lo_err = resolve_cursor(keys.ids, lo_kind, lo_arg, deleted_before)
if lo_err then return lo_err end
local hi, hi_err = resolve_cursor(keys.ids, hi_kind, hi_arg, deleted_before)
if hi_err then return hi_err end
lo = lo or 0
if deleted_before > 0 and lo < deleted_before - 1 then lo = deleted_before - 1 end
if not hi or hi > last_seq + 1 then hi = last_seq + 1 end

local below, above, large, window = plan_containers(keys, lo, hi, walk, need, max_chunks)

local reply = {gen, deleted_before, lo, hi, layout_number, below, #above}
for _, member in ipairs(above) do reply[#reply + 1] = member end
reply[#reply + 1] = #large
for _, member in ipairs(large) do reply[#reply + 1] = member end
reply[#reply + 1] = legacy_first
reply[#reply + 1] = legacy_last
reply[#reply + 1] = legacy_count
for _, value in ipairs(window) do reply[#reply + 1] = value end
local open_count = deleting and 0 or tonumber(meta[10] or '0')
reply[#reply + 1] = open_count > 0 and tonumber(meta[8]) or 0
reply[#reply + 1] = open_count > 0 and tonumber(meta[9]) or 0
reply[#reply + 1] = open_count
return reply
