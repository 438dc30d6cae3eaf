-- The chunk index and the per-message side info.
--
-- Normal chunks are listed in the chunk index, a sorted set scored by a chunk's first sequence
-- whose member is "first:last:count:bytes:media". Oversized single-message chunks are listed
-- apart, in the large index, as "sequence:bytes:media", so normal chunks keep disjoint, ordered
-- ranges. A message's side info, "id\totid\tmedia\tbytes\tturn" (escaped: see side_info), lives
-- in the window side hash while the message is in the window and in its chunk's manifest ("_m",
-- one "sequence\t<side info>\n" line per message) afterwards: it is what retention and turn
-- removal need, without unpacking records.

local function fmt(n)
  return string.format('%d', n)
end

local function chunk_index_member(first, last, count, bytes, media)
  return string.format('%d:%d:%d:%d:%d', first, last, count, bytes, media)
end

local function parse_chunk_member(member)
  local first, last, count, bytes, media = string.match(member, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
  return tonumber(first), tonumber(last), tonumber(count), tonumber(bytes), tonumber(media)
end

local function large_index_member(sequence, bytes, media)
  return string.format('%d:%d:%d', sequence, bytes, media)
end

local function parse_large_member(member)
  local sequence, bytes, media = string.match(member, '^(%d+):(%d+):(%d+)$')
  return tonumber(sequence), tonumber(bytes), tonumber(media)
end

-- Ids, otids and turn ids are free text in layout 1, and a side info is framed by tabs and (in
-- a manifest) newlines. A side info whose id, otid or turn holds '\t', '\n', '\r' or '\0' is
-- written with those three fields %XX-escaped ('%' too) and a sixth field, '%', that says so;
-- any other is written as it is, so side infos written before the escaping read as they did. An
-- appended id never holds those bytes (the client refuses them): the hot path pays one find.
local FRAMING = '[\t\n\r%z]'
local ESCAPED = '[%%\t\n\r%z]'

local function escape_field(value)
  return (string.gsub(value, ESCAPED, function(c) return string.format('%%%02X', string.byte(c)) end))
end

local function unescape_field(value)
  return (string.gsub(value, '%%(%x%x)', function(hex) return string.char(tonumber(hex, 16)) end))
end

local function side_info(id, otid, media, bytes, turn)
  -- One class test per field (%c: any control byte) before the exact one.
  if (string.find(id, '%c') or string.find(otid, '%c') or string.find(turn, '%c'))
      and string.find(id .. otid .. turn, FRAMING) then
    return escape_field(id) .. '\t' .. escape_field(otid) .. '\t' .. fmt(media) .. '\t' .. fmt(bytes)
      .. '\t' .. escape_field(turn) .. '\t%'
  end
  -- Lua writes these small integers as digits (%.14g); no string.format call on the hot path.
  return id .. '\t' .. otid .. '\t' .. media .. '\t' .. bytes .. '\t' .. turn
end

-- Returns id, otid, media, bytes, turn (unescaped); nil for a malformed side info.
local SIDE = '^([^\t\n]*)\t([^\t\n]*)\t(%d+)\t(%d+)\t([^\t\n]*)'
local function parse_side(side)
  local id, otid, media, bytes, turn = string.match(side, SIDE .. '$')
  if not id then
    id, otid, media, bytes, turn = string.match(side, SIDE .. '\t%%$')
    if not id then return nil end
    id, otid, turn = unescape_field(id), unescape_field(otid), unescape_field(turn)
  end
  return id, otid, tonumber(media), tonumber(bytes), turn
end

-- A side info's media bytes (its third field, never escaped); 0 for a malformed one. Plain finds
-- of the tabs, since a rollover reads one per message it moves and most say '0'.
local function side_media(side)
  local first = string.find(side, '\t', 1, true)
  local second = first and string.find(side, '\t', first + 1, true)
  local third = second and string.find(side, '\t', second + 1, true)
  if not third or third == second + 1 then return 0 end
  if third == second + 2 and string.byte(side, second + 1) == 48 then return 0 end  -- '0'
  return tonumber(string.sub(side, second + 1, third - 1)) or 0
end

local function manifest_line(sequence, side)
  return fmt(sequence) .. '\t' .. side .. '\n'
end

-- The side info of one sequence in a manifest, or nil.
local function manifest_find(manifest, sequence)
  local prefix = fmt(sequence) .. '\t'
  local at = 1
  while true do
    if string.sub(manifest, at, at + #prefix - 1) == prefix then
      local stop = string.find(manifest, '\n', at, true)
      return string.sub(manifest, at + #prefix, stop - 1), at, stop
    end
    local stop = string.find(manifest, '\n', at, true)
    if not stop then return nil end
    at = stop + 1
  end
end

-- Finds where a sequence is stored: 'window', 'large' (with its index member) or 'chunk'
-- (with its first sequence and index member); nil when it is not stored.
local function locate(keys, sequence)
  if redis.call('HEXISTS', keys.window_side, sequence) == 1 then
    return 'window'
  end
  local large = redis.call('ZRANGE', keys.large_index, sequence, sequence, 'BYSCORE', 'LIMIT', 0, 1)[1]
  if large then
    return 'large', sequence, large
  end
  local member = redis.call('ZRANGE', keys.chunk_index, sequence, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)[1]
  if member then
    local first, last = parse_chunk_member(member)
    if last >= sequence and manifest_find(redis.call('HGET', keys.chunk_prefix .. fmt(first), '_m') or '', sequence) then
      return 'chunk', first, member
    end
  end
  return nil
end
