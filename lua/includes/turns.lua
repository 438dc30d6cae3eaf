-- A turn's record in the turns hash: "<reply start>|<ranges>", where ranges are the turn's
-- message sequences as "a-b,c-d" (several when other turns interleave) and reply start is the
-- sequence start_turn recorded (0 before it ran).

local function parse_turn(record)
  if not record then return nil end
  local start, ranges = string.match(record, '^(%d+)|(.*)$')
  return tonumber(start), ranges
end

-- Adds sequences first..last to a turn's ranges, merging with the last range when contiguous.
local function extend_ranges(ranges, first, last)
  if ranges == '' then
    return string.format('%d-%d', first, last)
  end
  local head, a, b = string.match(ranges, '^(.-)(%d+)-(%d+)$')
  if tonumber(b) + 1 == first then
    return head .. a .. '-' .. string.format('%d', last)
  end
  return ranges .. ',' .. string.format('%d-%d', first, last)
end

-- Counts the turn's sequences at or after `start`; returns count, first, last.
local function count_from(ranges, start)
  local count, first, last = 0, nil, nil
  for a, b in string.gmatch(ranges, '(%d+)-(%d+)') do
    a, b = tonumber(a), tonumber(b)
    if b >= start then
      if a < start then a = start end
      count = count + (b - a + 1)
      first = first or a
      last = b
    end
  end
  return count, first, last
end

-- The ranges that remain at or after `from`.
local function trim_from(ranges, from)
  local kept = {}
  for a, b in string.gmatch(ranges, '(%d+)-(%d+)') do
    a, b = tonumber(a), tonumber(b)
    if b >= from then
      kept[#kept + 1] = string.format('%d-%d', math.max(a, from), b)
    end
  end
  return table.concat(kept, ',')
end
