--- @include "includes/layout"
--- @include "includes/expiry"
-- A chunk is a hash of two fields: `d`, its messages' records concatenated in sequence order,
-- and `_m`, its manifest (one "sequence\t<side info>\n" line per message, in the same order; the
-- side info's bytes field is the record's length). One value per chunk instead of one per
-- message keeps the per-message overhead of the server's hash entries and allocator out of the
-- thread's memory; a reader fetches both fields in one native HMGET and splits them itself.

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

local function write_chunk(keys, first, manifest, data)
  local chunk = chunk_key(keys, first)
  redis.call('HSET', chunk, '_m', manifest, 'd', data)
  expire_new_chunk(keys, chunk)
  return chunk
end

-- A closed chunk's manifest and records: layout-3 strings first, else the layout-2 hash; nils
-- when neither.
local function read_chunk(keys, first)
  local prefix = chunk_key(keys, first)
  local found = redis.call('MGET', prefix .. ':m', prefix .. ':d')
  if found[1] and found[2] then return found[1], found[2], false end
  found = redis.call('HMGET', prefix, '_m', 'd')
  if found[1] and found[2] then return found[1], found[2], true end
  return nil, nil, nil
end

-- The open chunk's manifest and records, '' when empty.
local function read_open(keys)
  local found = redis.call('MGET', keys.open_manifest, keys.open_data)
  return found[1] or '', found[2] or ''
end
