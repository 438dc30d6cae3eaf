#!lua flags=no-writes
--- Plans a page of one turn's messages: the sequences of the page, from the turn's record,
--- without reading any message. It reads the header, finds the range a cursor falls in by a
--- binary search over the range fields, and reads the ranges the page needs from there.
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV turn_id (str)
--- ARGV lo_kind (str: '' | 'seq' | 'id'): the exclusive lower bound
--- ARGV lo (str): a sequence or a message id, '' for none
--- ARGV hi_kind (str: '' | 'seq' | 'id'): the exclusive upper bound
--- ARGV hi (str): a sequence or a message id, '' for none
--- ARGV walk (str: 'up' | 'down'): which end of the range the page starts from
--- ARGV limit (int): the page's messages at most
---
--- Reply: {deleted_before, has_more (0|1), sequences of the page in walk order...}
--- Errors: KVS_WRONGTYPE, KVS_CURSOR_NOT_FOUND, KVS_CURSOR_EXPIRED <deleted_before>
--- @include "includes/layout"
--- @include "includes/checks"
--- @include "includes/cursors"
--- @include "includes/turns"

local keys = thread_keys(KEYS)
local turn_id = args.turn_id
local lo_kind, lo_arg, hi_kind, hi_arg = args.lo_kind, args.lo, args.hi_kind, args.hi
local walk, limit = args.walk, args.limit

local err = check_key_types({{keys.meta, 'hash'}, {keys.ids, 'hash'}, {keys.turns, 'hash'}})
if err then return err end

local deleted_before = tonumber(redis.call('HGET', keys.meta, 'deleted_before') or '0')

local lo, lo_err = resolve_cursor(keys.ids, lo_kind, lo_arg, deleted_before)
if lo_err then return lo_err end
local hi, hi_err = resolve_cursor(keys.ids, hi_kind, hi_arg, deleted_before)
if hi_err then return hi_err end
if not lo or lo < deleted_before - 1 then lo = deleted_before - 1 end

local reply = {deleted_before, 0}
local record = redis.call('HGET', keys.turns, turn_id)
if not record then return reply end

-- The ranges: of an earlier-format record, parsed from it; of a record, read as needed.
local first_k, last_k, range_at
if string.find(record, '|', 1, true) then
  local ranges = {}
  for a, b in string.gmatch(record, '(%d+)-(%d+)') do ranges[#ranges + 1] = {tonumber(a), tonumber(b)} end
  first_k, last_k = 1, #ranges
  range_at = function(k) return ranges[k][1], ranges[k][2] end
else
  local turn = read_turn(keys, turn_id)
  if turn.kept == 0 then return reply end
  first_k, last_k = turn.k0, turn.k1
  range_at = function(k) return turn_range(keys, turn_id, turn, k) end
end
if last_k < first_k then return reply end

-- The first range holding a sequence above lo (walk up), or the last holding one below hi
-- (walk down).
local low, high = first_k, last_k
local k
if walk == 'up' then
  k = last_k + 1
  while low <= high do
    local mid = math.floor((low + high) / 2)
    local _, b = range_at(mid)
    if b > lo then k, high = mid, mid - 1 else low = mid + 1 end
  end
else
  k = first_k - 1
  while low <= high do
    local mid = math.floor((low + high) / 2)
    local a = range_at(mid)
    if not hi or a < hi then k, low = mid, mid + 1 else high = mid - 1 end
  end
end

-- limit + 1 sequences tell whether there are more. Each range is clamped to the bounds first,
-- so a long range costs no more than the sequences the page takes from it.
local found, done = 0, false
while not done and k >= first_k and k <= last_k do
  local a, b = range_at(k)
  local from, to = math.max(a, lo + 1), b
  if hi then to = math.min(b, hi - 1) end
  if walk == 'up' then
    done = hi ~= nil and b >= hi
    for s = from, to do
      if found == limit then found, done = found + 1, true break end
      found = found + 1
      reply[#reply + 1] = s
    end
    k = k + 1
  else
    done = a <= lo
    for s = to, from, -1 do
      if found == limit then found, done = found + 1, true break end
      found = found + 1
      reply[#reply + 1] = s
    end
    k = k - 1
  end
end
if found > limit then reply[2] = 1 end
return reply
