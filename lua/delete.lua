#!lua flags=allow-oom
--- Deletes a thread in bounded steps (allowed at maxmemory: deleting frees memory): up to max_chunks chunks per call, then, once no chunk is
--- listed, every other key in the same call (so a rollover racing the delete leaves no orphan).
---
--- KEYS[1..10] the thread's keys (docs/LAYOUT.md)
--- ARGV[1]     max_chunks (int)
---
--- Reply: 1 when the thread is gone, 0 when more calls are needed
--- Errors: KVS_WRONGTYPE
--- @include "includes/checks"
--- @include "includes/thread"

local keys = thread_keys()
local max_chunks = tonumber(ARGV[1])

local err = check_key_types({{keys.chunk_index, 'zset'}, {keys.large_index, 'zset'}})
if err then return err end

local left = max_chunks
for _, index in ipairs({keys.chunk_index, keys.large_index}) do
  if left > 0 then
    local entries = redis.call('ZRANGE', index, 0, left - 1, 'WITHSCORES')
    for i = 1, #entries, 2 do
      redis.call('DEL', keys.chunk_prefix .. entries[i + 1])
      redis.call('ZREM', index, entries[i])
      left = left - 1
    end
  end
end
if left < max_chunks then return 0 end
redis.call('DEL', keys.meta, keys.window, keys.window_side, keys.chunk_index, keys.large_index,
  keys.ids, keys.otids, keys.turns, keys.legacy)
return 1
