#!lua flags=allow-oom
--- One step of an owner's erasure (docs/OWNERS.md; allowed at maxmemory: it frees memory). The
--- first step marks the owner erasing: from then on every write to its threads but a delete is
--- refused (KVS_OWNER_ERASING) before writing. Each step names the next threads to delete, by
--- creation; the client deletes each (delete.lua, which takes it out of the directory and counts
--- it in the receipt), and calls again. The step that finds none left removes the owner's keys
--- and answers the receipt. Idempotent: an erasure stopped anywhere goes on when called again.
---
--- KEYS[1..4]  the owner's keys: recent, created, info, usage (includes/owner.lua)
--- ARGV step (int): the most threads one step names
---
--- Reply: {done, threads erased, messages erased, thread id...}: done 1 when the owner's keys
---        are gone (its threads were erased before)
--- Errors: KVS_WRONGTYPE (one of the owner's keys holds another type: nothing is erased)
--- @include "includes/owner"

local dir = owner.keys(KEYS, 1)
local wrong = owner.wrong_type(dir, {'recent', 'created', 'info', 'usage'})
if wrong then return wrong end
local ids = redis.call('ZRANGE', dir.created, 0, args.step - 1)
local orphans = redis.call('ZRANGE', dir.recent, 0, args.step - 1)
local totals = owner.totals(dir, nil)
if #ids == 0 and #orphans == 0 then
  redis.call('DEL', dir.recent, dir.created, dir.info, dir.usage)
  return {1, totals.erased_threads, totals.erased_messages}
end
if totals.erasing == 0 then redis.call('HSET', dir.usage, 'erasing', 1) end
local reply = {0, totals.erased_threads, totals.erased_messages}
for _, id in ipairs(#ids > 0 and ids or orphans) do reply[#reply + 1] = id end
return reply
