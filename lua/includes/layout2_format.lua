--- @include "includes/numbers"
-- Every text format layout 2 writes into the thread's keys, each with its writer and its
-- reader in one place (docs/LAYOUT.md; the Python side reads them in kvstore/_engine/replies.py):
--
-- - a chunk index member "first:last:count:bytes:media:tokens" and a large index member
--   "sequence:bytes:media:tokens";
-- - a side info "id\totid\tmedia\tbytes\tturn\ttokens" (escaped: see side_info), in the window
--   side hash while the message is in the window, and in its chunk's manifest afterwards;
--
-- Those written before token counts existed lack the last field (tokens) and still read: a
-- message without a count counts bytes_tokens(its record bytes), an index member without a
-- total bytes_tokens(its bytes).
-- - a manifest ("_m" of a chunk): one "sequence\t<side info>\n" line per message, in the order
--   of the records in the chunk's data ("d"); the side info's bytes field is the record's length.
-- The turn records' format lives with the turns (includes/turns.lua).

local function chunk_index_member(first, last, count, bytes, media, tokens)
  return string.format('%.0f:%.0f:%.0f:%.0f:%.0f:%.0f', first, last, count, bytes, media, tokens)
end

-- first, last, count, bytes, media, tokens (a member written without tokens: bytes_tokens).
local function parse_chunk_member(member)
  local first, last, count, bytes, media, tokens = string.match(member, '^(%d+):(%d+):(%d+):(%d+):(%d+):(%d+)$')
  if not first then
    first, last, count, bytes, media = string.match(member, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
    if not first then return nil end
    return tonumber(first), tonumber(last), tonumber(count), tonumber(bytes), tonumber(media), bytes_tokens(tonumber(bytes))
  end
  return tonumber(first), tonumber(last), tonumber(count), tonumber(bytes), tonumber(media), tonumber(tokens)
end

local function large_index_member(sequence, bytes, media, tokens)
  return string.format('%.0f:%.0f:%.0f:%.0f', sequence, bytes, media, tokens)
end

-- sequence, bytes, media, tokens (a member written without tokens: bytes_tokens).
local function parse_large_member(member)
  local sequence, bytes, media, tokens = string.match(member, '^(%d+):(%d+):(%d+):(%d+)$')
  if not sequence then
    sequence, bytes, media = string.match(member, '^(%d+):(%d+):(%d+)$')
    if not sequence then return nil end
    return tonumber(sequence), tonumber(bytes), tonumber(media), bytes_tokens(tonumber(bytes))
  end
  return tonumber(sequence), tonumber(bytes), tonumber(media), tonumber(tokens)
end

-- Ids, otids and turn ids are free text in layout 1, and a side info is framed by tabs and (in
-- a manifest) newlines. A side info whose id, otid or turn holds '\t', '\n', '\r' or '\0' is
-- written with those three fields %XX-escaped ('%' too) and a sixth field, '%', that says so;
-- any other is written as it is, so side infos written before the escaping read as they did. An
-- appended id never holds those bytes (the client refuses them): the hot path pays one find.
local FRAMING = '[\t\n\r%z]'

local function escape_field(value)  -- FRAMING's bytes and '%'
  return (string.gsub(value, '[%%\t\n\r%z]', function(c) return string.format('%%%02X', string.byte(c)) end))
end

local function unescape_field(value)
  return (string.gsub(value, '%%(%x%x)', function(hex) return string.char(tonumber(hex, 16)) end))
end

local function side_info(id, otid, media, bytes, turn, tokens)
  -- One search over the three (a pattern search costs more than the concatenation).
  if string.find(id .. otid .. turn, FRAMING) then
    return escape_field(id) .. '\t' .. escape_field(otid) .. '\t' .. fmt(media) .. '\t' .. fmt(bytes)
      .. '\t' .. escape_field(turn) .. '\t' .. fmt(tokens) .. '\t%'
  end
  return id .. '\t' .. otid .. '\t' .. fmt(media) .. '\t' .. fmt(bytes) .. '\t' .. turn .. '\t' .. fmt(tokens)
end

-- Returns id, otid, media, bytes, turn (unescaped), tokens; nil for a malformed side info. A side
-- info written before counts existed (five fields, or six ending in '%') counts bytes_tokens.
-- Ids, otids and turns hold no tab, so the number of fields tells the forms apart.
local SIDE = '^([^\t\n]*)\t([^\t\n]*)\t(%d+)\t(%d+)\t([^\t\n]*)'
local function parse_side(side)
  local id, otid, media, bytes, turn, tokens = string.match(side, SIDE .. '\t(%d+)$')
  if not id then
    id, otid, media, bytes, turn = string.match(side, SIDE .. '$')
    if not id then
      id, otid, media, bytes, turn, tokens = string.match(side, SIDE .. '\t(%d+)\t%%$')
      if not id then
        id, otid, media, bytes, turn = string.match(side, SIDE .. '\t%%$')
        if not id then return nil end
      end
      id, otid, turn = unescape_field(id), unescape_field(otid), unescape_field(turn)
    end
  end
  bytes = tonumber(bytes)
  return id, otid, tonumber(media), bytes, turn, tonumber(tokens) or bytes_tokens(bytes)
end

local function manifest_line(sequence, side)
  return fmt(sequence) .. '\t' .. side .. '\n'
end

-- The manifest of the `n` messages from position `from` of parallel lists of sequences and side
-- infos, as manifest_line would write each, joined once.
local function manifest_of(sequences, sides, from, n)
  local parts = {}
  for i = 1, n do
    parts[4 * i - 3], parts[4 * i - 2], parts[4 * i - 1], parts[4 * i] = sequences[from + i - 1], '\t', sides[i], '\n'
  end
  return table.concat(parts)
end

-- Walks a manifest's lines: each call returns the line's sequence (text), its side info, and the
-- line's bounds in the manifest (at, stop: stop is its '\n'); nil after the last whole line, or
-- at a line without a tab or a '\n' (a malformed manifest ends there: callers that need it whole
-- check what they counted).
local function manifest_lines(manifest)
  local at = 1
  return function()
    local stop = string.find(manifest, '\n', at, true)
    if not stop then return nil end
    local tab = string.find(manifest, '\t', at, true)
    if not tab or tab > stop then return nil end
    local line_at = at
    at = stop + 1
    return string.sub(manifest, line_at, tab - 1), string.sub(manifest, tab + 1, stop - 1), line_at, stop
  end
end

-- The side info of one sequence in a manifest and its line's bounds, or nil.
local function manifest_find(manifest, sequence)
  local wanted = fmt(sequence)
  for line_sequence, side, at, stop in manifest_lines(manifest) do
    if line_sequence == wanted then return side, at, stop end
  end
  return nil
end
