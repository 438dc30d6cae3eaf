-- The chunk index: a sorted set scored by a chunk's first sequence, whose member carries
-- "first:last:count:bytes:media". Oversized single-message chunks are listed apart, in the
-- large index, as "sequence:bytes:media", so normal chunks keep disjoint, ordered ranges.

local function chunk_index_member(first, last, count, bytes, media)
  return string.format('%d:%d:%d:%d:%d', first, last, count, bytes, media)
end

local function large_index_member(sequence, bytes, media)
  return string.format('%d:%d:%d', sequence, bytes, media)
end

-- A chunk's manifest line: what retention and remove_turn need without unpacking records.
local function manifest_line(sequence, side)
  return string.format('%d', sequence) .. '\t' .. side .. '\n'
end
