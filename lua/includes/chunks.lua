--- @include "includes/index"
--- @include "includes/expiry"
-- A chunk is a hash of two fields: `d`, its messages' records concatenated in sequence order,
-- and `_m`, its manifest (one "sequence\t<side info>\n" line per message, in the same order; the
-- side info's bytes field is the record's length). One value per chunk instead of one per
-- message keeps the per-message overhead of the server's hash entries and allocator out of the
-- thread's memory; a reader fetches both fields in one native HMGET and splits them itself.

local function write_chunk(keys, first, manifest, data)
  local chunk_key = keys.chunk_prefix .. fmt(first)
  redis.call('HSET', chunk_key, '_m', manifest, 'd', data)
  expire_new_chunk(keys, chunk_key)
  return chunk_key
end

-- Where a sequence's record lies in a chunk's data: 1-based start, length, and the manifest
-- line's bounds (at, stop); nil when the manifest does not list it.
local function chunk_slot(manifest, sequence)
  local offset, at = 1, 1
  local wanted = fmt(sequence)
  while at <= #manifest do
    local stop = string.find(manifest, '\n', at, true)
    local line = string.sub(manifest, at, stop - 1)
    local tab = string.find(line, '\t', 1, true)
    local _, _, _, bytes = parse_side(string.sub(line, tab + 1))
    if string.sub(line, 1, tab - 1) == wanted then
      return offset, bytes, at, stop
    end
    offset = offset + bytes
    at = stop + 1
  end
  return nil
end
