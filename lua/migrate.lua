#!lua
--- Moves one bounded step of a layout-1 thread into chunks (includes/migration.lua).
---
--- KEYS[1..12]  the thread's keys (includes/thread.lua: thread_keys; docs/LAYOUT.md)
--- ARGV[1..9]   limits (int): includes/thread.lua, read_limits
--- ARGV[10]     limits key (str): ARGV[1..9] joined by ':', then the event limits
---
--- Reply: {chunks_written, layout_version, scanning, fields_left}
---   scanning is 1 while the legacy range is still being scanned (writes refuse with
---   KVS_MIGRATING until it is 0); fields_left, once the layout is 2, counts the legacy fields
---   that were not sequences and stay in the legacy hash.
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_RESTORING
--- @include "includes/thread"
--- @include "includes/expiry"
--- @include "includes/migration"

local keys, limits, err = begin_thread_call(KEYS, ARGV)
if err then return err end

local chunks = migrate_step(keys, limits)
if chunks > 0 then apply_expiry(keys) end
local state = redis.call('HMGET', keys.meta, 'layout', 'legacy_last')
local layout = tonumber(state[1] or '2') or 2
local scanning = (layout ~= 2 and not state[2]) and 1 or 0
return {chunks, layout, scanning, layout == 2 and redis.call('HLEN', keys.legacy) or 0}
