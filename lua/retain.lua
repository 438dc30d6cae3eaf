#!lua
--- Runs retention alone: compact calls it again while the per-call cap stopped it short.
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV limits (limits): the store's limits (includes/args.lua: read_limits)
---
--- Reply: the number of chunks deleted (at most max_move_chunks)
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_RESTORING,
---         KVS_QUOTA, KVS_QUOTA_BYTES, KVS_OWNER_ERASING (an owned thread: includes/owner.lua)
--- @include "includes/thread"
--- @include "includes/expiry"
--- @include "includes/layout2_retention"

local limits = args.limits
local keys, err = begin_thread_call(KEYS, limits)
if err then return err end

local deleted = retain(keys, limits.retained_limit, limits.max_move_chunks)
apply_expiry(keys)
return deleted
