#!lua
--- Moves one bounded step of a layout-1 thread into chunks (includes/migration.lua).
---
--- KEYS[1..10] the thread's keys (docs/LAYOUT.md)
--- ARGV[1..10] the limits (includes/thread.lua: read_limits)
---
--- Reply: {chunks_written, layout_version}
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT
--- @include "includes/checks"
--- @include "includes/thread"
--- @include "includes/index"
--- @include "includes/turns"
--- @include "includes/expiry"
--- @include "includes/migration"

local keys = thread_keys()
local limits = read_limits()

local err = check_thread(keys)
if err then return err end

local deadline, moved = expiry_deadline(keys, limits.ttl_ms)
keys.deadline = deadline
local chunks = migrate_step(keys, limits)
if chunks > 0 then apply_expiry(keys, deadline, moved) end
return {chunks, tonumber(redis.call('HGET', keys.meta, 'layout') or '2')}
