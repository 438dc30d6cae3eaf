#!lua
--- Runs retention alone: compact calls it again while the per-call cap stopped it short.
---
--- KEYS[1..12]  the thread's keys (includes/thread.lua: thread_keys; docs/LAYOUT.md)
--- ARGV[1..9]   limits (int): includes/thread.lua, read_limits
--- ARGV[10]     limits key (str): ARGV[1..9] joined by ':', then the event limits
---
--- Reply: the number of chunks deleted (at most max_move_chunks)
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_RESTORING
--- @include "includes/thread"
--- @include "includes/expiry"
--- @include "includes/retention"

local keys, limits, err = begin_thread_call(KEYS, ARGV)
if err then return err end

local deleted = retain(keys, limits.retained_limit, limits.max_move_chunks)
apply_expiry(keys)
return deleted
