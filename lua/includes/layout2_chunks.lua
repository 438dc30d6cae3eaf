--- @include "includes/layout"
--- @include "includes/expiry"
-- A chunk is two strings: its messages' records concatenated in sequence order (`:d`), and its
-- manifest (`:m`, one "sequence\t<side info>\n" line per message, in the same order; the side
-- info's bytes field is the record's length); layout 2 kept the two as fields `d` and `_m` of one
-- hash. One value per chunk instead of one per message keeps the per-message overhead of the
-- server's hash entries and allocator out of the thread's memory; a reader fetches both in one
-- native MGET and splits them itself. The open chunk (layout 3) is the same pair at fixed keys,
-- `open:d` and `open:m`, appended to in place; closing it copies both to a chunk's keys.

-- jemalloc, the allocator of Redis and of most Valkey builds, rounds an allocation up to its
-- size class: four per power of two (32 KiB, 40 KiB, 48 KiB, 56 KiB, 64 KiB, 80 KiB, ...). A
-- chunk's data value of 32 records of 1.1 KB, 35.9 KB, takes 40 KiB. From 16 KiB up (where the
-- classes are whole pages) a cut whose data would be rounded up ends instead where it fills the
-- class below, when that wastes a smaller share of what it holds; the records past it go into
-- the next chunk. Below 16 KiB a chunk keeps its chunk_size messages. VALUE_HEADROOM covers the
-- string header and terminator the server adds to the value.
local FIT_FROM = 16384
local VALUE_HEADROOM = 16

-- The size class holding `size` bytes (from FIT_FROM up), and the class below it.
local function size_classes(size)
  local _, exponent = math.frexp(size - 1)
  local step = 2 ^ (exponent - 3)
  local class = math.ceil(size / step) * step
  return class, class - step
end

-- The most record bytes a layout-3 chunk closes with: 64 KiB less the string's header, so a
-- chunk of records up to this size fills the 64 KiB class (an allocation past 64 KiB takes 80).
local CLOSE_BYTES = 65520

-- Whether the open chunk, holding `bytes` of records (48 KiB and up), closes before a record of
-- `size` joins it because it fills its size class within 1/16 and the record would take it into
-- the next class (where it would close wasting up to a fifth of that class). Not below 48 KiB:
-- a chunk of fewer records means more closes, and a newest page (50) that needs more chunks.
local function close_here(bytes, size)
  local now = bytes + VALUE_HEADROOM
  if now <= 3 * FIT_FROM then return false end
  local class = size_classes(now)
  return now + size > class and (class - now) * 16 < class
end

-- Ends a cut of the `n` records from records[from], `bytes` in all, where its data fills a size
-- class (above); returns the count and bytes it keeps (the records past it go into the next cut).
local function fit_size_class(records, from, n, bytes)
  local size = bytes + VALUE_HEADROOM
  if size <= FIT_FROM then return n, bytes end
  local class, below = size_classes(size)
  local count, kept = n, bytes
  while count > 1 and kept + VALUE_HEADROOM > below do
    kept = kept - #records[from + count - 1]
    count = count - 1
  end
  -- Shorter only if it fits and wastes a smaller share: (below - kept) / kept < (class - bytes) / bytes.
  if kept + VALUE_HEADROOM > below or (below - kept) * bytes >= (class - bytes) * kept then
    return n, bytes
  end
  return count, kept
end

-- A chunk's two layout-3 strings: its records and its manifest. A layout-2 chunk is one hash
-- at chunk_key, fields `d` and `_m`; a thread migrated from layout 2 keeps its hash chunks as
-- they are, so every reader of a chunk tries the strings first, then the hash.
local function chunk_data_key(keys, first)
  return chunk_key(keys, first) .. ':d'
end

local function chunk_manifest_key(keys, first)
  return chunk_key(keys, first) .. ':m'
end

-- A chunk's manifest and records, and whether it is a layout-2 hash; nils when neither exists.
local function read_chunk(keys, first)
  local found = redis.call('MGET', chunk_manifest_key(keys, first), chunk_data_key(keys, first))
  if found[1] then return found[1], found[2] or '', false end
  found = redis.call('HMGET', chunk_key(keys, first), '_m', 'd')
  if found[1] then return found[1], found[2] or '', true end
  return nil, nil, false
end

-- A chunk's manifest, either kind; '' for no chunk.
local function chunk_manifest(keys, first)
  local manifest = redis.call('GET', chunk_manifest_key(keys, first))
  if manifest then return manifest end
  return redis.call('HGET', chunk_key(keys, first), '_m') or ''
end

-- A new chunk: always the layout-3 strings, with the thread's deadline.
local function write_chunk(keys, first, manifest, data)
  local data_key, manifest_key = chunk_data_key(keys, first), chunk_manifest_key(keys, first)
  redis.call('SET', data_key, data)
  redis.call('SET', manifest_key, manifest)
  expire_new_chunk(keys, data_key)
  expire_new_chunk(keys, manifest_key)
  return data_key
end

-- An edited chunk, written back in its own kind (read_chunk's is_hash).
local function rewrite_chunk(keys, first, is_hash, manifest, data)
  if is_hash then
    local chunk = chunk_key(keys, first)
    redis.call('HSET', chunk, '_m', manifest, 'd', data)
    return
  end
  -- SET drops a key's time to live: KEEPTTL holds the thread's deadline.
  redis.call('SET', chunk_data_key(keys, first), data, 'KEEPTTL')
  redis.call('SET', chunk_manifest_key(keys, first), manifest, 'KEEPTTL')
end

-- Deletes a chunk of either kind.
local function delete_chunk(keys, first)
  redis.call('DEL', chunk_key(keys, first), chunk_data_key(keys, first), chunk_manifest_key(keys, first))
end

-- The open chunk's manifest and records ('' when it is empty).
local function read_open(keys)
  local found = redis.call('MGET', keys.open_manifest, keys.open_data)
  return found[1] or '', found[2] or ''
end

-- The open chunk after an edit: both strings, or neither when it is empty. KEEPTTL holds the
-- thread's deadline.
local function write_open(keys, manifest, data)
  if manifest == '' then
    redis.call('DEL', keys.open_manifest, keys.open_data)
    return
  end
  redis.call('SET', keys.open_data, data, 'KEEPTTL')
  redis.call('SET', keys.open_manifest, manifest, 'KEEPTTL')
end
