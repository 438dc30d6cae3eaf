#!lua
--- Moves one bounded step of a thread toward layout 3 with an empty window: a layout-1 thread's
--- legacy hash into chunks (includes/layout1_migration.lua; it ends in layout 2), else a
--- layout-2 thread becomes layout 3 and its window's oldest messages move into closed layout-3
--- chunks (includes/layout3_migration.lua). A missing thread is left alone.
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV limits (limits): the store's limits (includes/args.lua: read_limits)
---
--- Reply: {chunks_written, layout_version, scanning, fields_left, window_left}
---   scanning is 1 while the legacy range is still being scanned (writes refuse with
---   KVS_MIGRATING until it is 0); fields_left, once the layout is 2 or 3, counts the legacy
---   fields that were not sequences and stay in the legacy hash; window_left the messages still
---   in the window (0 with layout 3: the migration is done).
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_RESTORING,
---         KVS_QUOTA, KVS_QUOTA_BYTES, KVS_OWNER_ERASING (an owned thread: includes/owner.lua)
--- @include "includes/layout"
--- @include "includes/thread"
--- @include "includes/expiry"
--- @include "includes/layout1_migration"
--- @include "includes/layout1"
--- @include "includes/layout3_migration"

local limits = args.limits
local keys, err = begin_thread_call(KEYS, limits)
if err then return err end

local chunks, scanning = 0, 0
if is_layout_1(keys) then
  chunks = migrate_step(keys, limits)
  scanning = redis.call('HGET', keys.meta, 'legacy_last') and 0 or 1
elseif redis.call('EXISTS', keys.meta) == 1 then
  local cuts, plan_err = plan_drain(keys, limits)
  if plan_err and #cuts == 0 then return plan_err end
  if redis.call('HGET', keys.meta, 'layout') ~= CURRENT_LAYOUT then
    redis.call('HSET', keys.meta, 'layout', CURRENT_LAYOUT)
  end
  chunks = run_drain(keys, cuts)
end
if chunks > 0 then apply_expiry(keys) end
local layout = tonumber(redis.call('HGET', keys.meta, 'layout') or CURRENT_LAYOUT)
local fields = 0
if layout > 1 then fields = legacy_fields(keys) end
return {chunks, layout, scanning, fields, redis.call('ZCARD', keys.window)}
