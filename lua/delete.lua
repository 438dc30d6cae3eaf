#!lua flags=allow-oom
--- Deletes a thread in bounded steps (allowed at maxmemory: deleting frees memory).
---
--- The first call tombstones the thread: it removes every key but the two chunk indexes and
--- meta (the open chunk and a layout-2 window among those it removes), and leaves meta holding
--- only `deleting` and a moved `gen` (so a read in flight plans again). From then on the thread
--- reads as empty and every writing script refuses it (KVS_DELETING) before writing: the client
--- finishes the deletion and writes again. Each call then removes up to max_chunks chunks, of
--- either kind (a chunk's layout-3 strings, or its layout-2 hash); the call that leaves none
--- removes the indexes and meta.
--- Keys that can be large go with UNLINK, so the server frees them in the background.
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV max_chunks (int): the most chunks this call removes
--- ARGV mode (str: 'start' | 'continue'): 'start' for delete() (tombstone the thread if
---      it is not yet), 'continue' to finish only a deletion already started (a live thread
---      is left as it is)
--- ARGV events_len (int): the event limits (includes/events.lua); 0 for no event
--- ARGV events_age_ms (int)
---
--- The call that tombstones the thread adds its 'deleted' event (watchers blocked on the stream
--- get it before the next call); the call that removes meta removes the stream too.
---
--- Reply: 1 when the thread is gone (or, for 'continue', was not being deleted), 0 when more
---        calls are needed
--- Errors: KVS_WRONGTYPE
--- @include "includes/layout"
--- @include "includes/checks"
--- @include "includes/events"

local keys = thread_keys(KEYS)
local max_chunks, mode = args.max_chunks, args.mode
local limits = {events_len = args.events_len, events_age_ms = args.events_age_ms, ttl_ms = 0}

local err = check_key_types(chunk_index_types(keys))
if err then return err end

local meta_is_hash = redis.call('TYPE', keys.meta)['ok'] == 'hash'
local announced = false
if not (meta_is_hash and redis.call('HEXISTS', keys.meta, 'deleting') == 1) then
  if mode ~= 'start' then return 1 end
  redis.call('UNLINK', unpack(tombstone_keys(keys)))
  -- Any other value at meta goes too; a hash stays a key (and keeps its expiry): the tombstone
  -- first, then every other field goes.
  if not meta_is_hash then redis.call('UNLINK', keys.meta) end
  if meta_is_hash then announced = emit_event(keys, limits, nil, event_fields('deleted', '', '', '')) end
  redis.call('HSET', keys.meta, 'deleting', '1')
  local fields, drop = redis.call('HGETALL', keys.meta), {}
  for i = 1, #fields, 2 do
    if fields[i] ~= 'deleting' and fields[i] ~= 'gen' then drop[#drop + 1] = fields[i] end
  end
  if #drop > 0 then redis.call('HDEL', keys.meta, unpack(drop)) end
  redis.call('HINCRBY', keys.meta, 'gen', 1)
end

local left = max_chunks
for _, index in ipairs(chunk_indexes(keys)) do
  if left > 0 then
    local entries = redis.call('ZRANGE', index, 0, left - 1, 'WITHSCORES')
    if #entries > 0 then
      local chunk_keys, members = {}, {}
      for i = 1, #entries, 2 do
        members[#members + 1] = entries[i]
        -- A chunk of either kind: its layout-3 strings or its layout-2 hash.
        local chunk = chunk_key(keys, tonumber(entries[i + 1]))
        chunk_keys[#chunk_keys + 1] = chunk
        chunk_keys[#chunk_keys + 1] = chunk .. ':d'
        chunk_keys[#chunk_keys + 1] = chunk .. ':m'
      end
      redis.call('UNLINK', unpack(chunk_keys))
      redis.call('ZREM', index, unpack(members))
      left = left - #members
    end
  end
end
-- Both indexes gave fewer chunks than asked for: none is left. A call that added the 'deleted'
-- event leaves the stream to the next call, so that the watchers blocked on it get the event.
if left == 0 or announced then return 0 end
redis.call('UNLINK', keys.meta, keys.events, unpack(chunk_indexes(keys)))
return 1
