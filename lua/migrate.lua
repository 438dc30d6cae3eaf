#!lua
--- Moves one bounded step of a layout-1 thread into chunks (includes/layout1_migration.lua).
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV limits (limits): the store's limits (includes/args.lua: read_limits)
---
--- Reply: {chunks_written, layout_version, scanning, fields_left}
---   scanning is 1 while the legacy range is still being scanned (writes refuse with
---   KVS_MIGRATING until it is 0); fields_left, once the layout is 2, counts the legacy fields
---   that were not sequences and stay in the legacy hash.
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_RESTORING
--- @include "includes/thread"
--- @include "includes/expiry"
--- @include "includes/layout1_migration"
--- @include "includes/layout1"

local limits = args.limits
local keys, err = begin_thread_call(KEYS, limits)
if err then return err end

local chunks = migrate_step(keys, limits)
if chunks > 0 then apply_expiry(keys) end
local state = redis.call('HMGET', keys.meta, 'layout', 'legacy_last')
local layout = tonumber(state[1] or '2') or 2
local scanning = (layout ~= 2 and not state[2]) and 1 or 0
return {chunks, layout, scanning, layout == 2 and legacy_fields(keys) or 0}
