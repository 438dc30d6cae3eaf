#!lua
--- An owner's usage and quotas in one call (docs/OWNERS.md), after its least recently active
--- threads whose keys expired have left the directory; with mode 'quota', sets the quotas first.
---
--- KEYS[1..4]  the owner's keys: recent, created, info, usage (includes/owner.lua)
--- ARGV mode (str: 'read' | 'quota')
--- ARGV max_threads (int): for 'quota': the most threads (0: no quota, -1: keep it)
--- ARGV max_bytes (int): the most record bytes stored (0: no quota, -1: keep it)
--- ARGV max_per_minute (int): the most messages appended a minute (0: no quota, -1: keep it)
---
--- Reply: {threads, messages, bytes, tokens, max_threads, max_bytes, max_per_minute, erasing}
--- Errors: KVS_WRONGTYPE (one of the owner's keys holds another type)
--- @include "includes/owner"

local dir = owner.keys(KEYS, 1)
local wrong = owner.wrong_type(dir, {'usage', 'recent', 'created', 'info'})
if wrong then return wrong end
if args.mode == 'quota' then
  local quotas = {max_threads = args.max_threads, max_bytes = args.max_bytes,
                  max_per_minute = args.max_per_minute}
  for field, value in pairs(quotas) do
    if value == 0 then
      redis.call('HDEL', dir.usage, field)
    elseif value > 0 then
      redis.call('HSET', dir.usage, field, value)
    end
  end
end

-- The least recently active threads are the first to expire: those whose deadline passed and
-- whose meta is gone leave, with their counts (all of a mass expiry, up to 1,000 a call).
owner.sweep(dir, owner.now_ms())

local totals = owner.totals(dir, nil)
return {totals.threads, totals.messages, totals.bytes, totals.tokens, totals.max_threads,
        totals.max_bytes, totals.max_per_minute, totals.erasing}
