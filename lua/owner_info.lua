#!lua
--- Sets an owned thread's title and metadata (docs/OWNERS.md), and puts the thread in its
--- owner's directory if it is not there yet (a new chat is listed before its first message),
--- checked against the owner's thread quota and erasure first. A thread whose keys expired
--- leaves the directory first, with its old title and metadata, and is listed anew. A title or metadata change is not
--- activity: the thread keeps its place in the listing.
---
--- KEYS[1..4]  the owner's keys: recent, created, info, usage (includes/owner.lua)
--- ARGV thread_id (str)
--- ARGV title_set (int): 1 to set the title (an empty one removes it), 0 to keep it
--- ARGV title (str)
--- ARGV metadata_set (int): 1 to set the metadata (replacing it whole), 0 to keep it
--- ARGV metadata (str): a JSON object of strings
--- ARGV ttl_ms (int): the store's thread_ttl in ms (0: none): how long a thread listed without
---      a message stays listed
---
--- Reply: 1 when the call put the thread in the directory, 0 when it was there
--- Errors: KVS_QUOTA, KVS_OWNER_ERASING, KVS_WRONGTYPE (one of the owner's keys holds another type)
--- @include "includes/owner"

local dir = owner.keys(KEYS, 1)
local thread_id = args.thread_id
local now = owner.now_ms()
local totals, wrong = owner.read_totals(dir, thread_id)
wrong = wrong or owner.wrong_type(dir, {'recent', 'created', 'info'})
if wrong then return wrong end
-- A thread whose keys expired is listed anew, without what it had.
totals = owner.current(dir, thread_id, totals, now)
local refused
refused, totals = owner.checked('info', dir, thread_id, totals, 0, 0, 0, now)
if refused then return refused end
local registered = totals.record ~= nil

local info = {}
local stored = redis.call('HGET', dir.info, thread_id)
if stored then
  local ok, decoded = pcall(cjson.decode, stored)
  if ok and type(decoded) == 'table' then info = decoded end
end
if args.title_set == 1 then info.title = args.title ~= '' and args.title or nil end
if args.metadata_set == 1 then info.metadata = cjson.decode(args.metadata) end
if info.title == nil and info.metadata == nil then
  redis.call('HDEL', dir.info, thread_id)
else
  redis.call('HSET', dir.info, thread_id, cjson.encode(info))
end
if registered then return 0 end

local deadline = redis.call('PEXPIRETIME', owner.meta_key(dir, thread_id))
if deadline < 0 then deadline = args.ttl_ms > 0 and now + args.ttl_ms or 0 end
local updates = {}
owner.register(dir, thread_id, now, updates, totals)
redis.call('ZADD', dir.recent, now, thread_id)
redis.call('HSET', dir.usage, 'threads', updates.threads, 't:' .. thread_id, '0:0:0:' .. deadline)
return 1
