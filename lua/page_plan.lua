#!lua flags=no-writes
--- Plans a page read: resolves cursors and names the containers that hold the next messages
--- of a walk, without reading any message. The client then fetches the records with native
--- commands and compares `gen` to detect a concurrent rollover or deletion.
---
--- KEYS[1..10]  the thread's keys (includes/thread.lua: thread_keys; docs/LAYOUT.md);
---              the window is only counted here
--- ARGV[1]      lo_kind (str: '' | 'seq' | 'id'): the exclusive lower bound of the range
--- ARGV[2]      lo (str): a sequence or a message id, '' for none
--- ARGV[3]      hi_kind (str: '' | 'seq' | 'id'): the exclusive upper bound of the range
--- ARGV[4]      hi (str): a sequence or a message id, '' for none
--- ARGV[5]      walk (str: 'up' | 'down'): which end of the range the page starts from
--- ARGV[6]      need (int): messages wanted (the page limit + 1)
--- ARGV[7]      max_chunks (int): chunks named per plan at most
---
--- Reply: {gen, deleted_before, lo, hi, bound, window (0|1), n_chunks,
---         (first, last, kind) per chunk..., n_large, large sequences...}
---   kind 0 is a chunk hash; kind 1 is the part of a layout-1 thread's legacy hash not yet
---   migrated, which is read like one more chunk.
---   Messages of the walk are complete up to `bound` (walk up: seq <= bound; walk down:
---   seq >= bound); past it the client plans again from `bound`. hi = -1 means unbounded.
--- Errors: KVS_WRONGTYPE, KVS_CURSOR_NOT_FOUND, KVS_CURSOR_EXPIRED <deleted_before>
--- @include "includes/checks"
--- @include "includes/cursors"
--- @include "includes/thread"
--- @include "includes/index"
--- @include "includes/migration"

local keys = thread_keys(KEYS)
local meta_key, window_key, chunk_index_key, large_index_key, ids_key = keys.meta, keys.window, keys.chunk_index, keys.large_index, keys.ids
local lo_kind, lo_arg, hi_kind, hi_arg = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local walk, need, max_chunks = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])

local err = check_key_types({
  {meta_key, 'hash'}, {window_key, 'zset'}, {chunk_index_key, 'zset'},
  {large_index_key, 'zset'}, {ids_key, 'hash'}, {keys.legacy, 'hash'},
})
if err then return err end

local meta = redis.call('HMGET', meta_key, 'gen', 'deleted_before', 'last_seq', 'deleting')
local gen = tonumber(meta[1] or '0')
local deleted_before = tonumber(meta[2] or '0')
local last_seq = tonumber(meta[3] or '0')
-- A thread being deleted (lua/delete.lua) reads as empty, whatever chunks it still has.
if meta[4] then deleted_before, last_seq = 0, 0 end


-- A layout-1 thread's legacy messages not yet migrated, as one more candidate. Until the scan
-- (includes/migration.lua) has found the legacy range, meta's last_seq may lag the hash: the
-- range then reaches at least the hash's field count (a hole reads as nothing).
local legacy = nil
if is_layout_1(keys) then
  local state = redis.call('HMGET', meta_key, 'migrated', 'legacy_last')
  local count = redis.call('HLEN', keys.legacy)
  local first = tonumber(state[1] or '0') + 1
  local last = tonumber(state[2] or '') or math.max(last_seq, count)
  if last >= first then legacy = {first, last, count, 1} end
  if last > last_seq then last_seq = last end
end

local lo, lo_err = resolve_cursor(ids_key, lo_kind, lo_arg, deleted_before)
if lo_err then return lo_err end
local hi, hi_err = resolve_cursor(ids_key, hi_kind, hi_arg, deleted_before)
if hi_err then return hi_err end
lo = lo or 0
if deleted_before > 0 and lo < deleted_before - 1 then lo = deleted_before - 1 end
if not hi or hi > last_seq + 1 then hi = last_seq + 1 end

-- How many of a chunk's messages can lie inside (lo, hi): at most its count, at most its span.
local function in_range(first, last, count)
  local a, b = math.max(first, lo + 1), math.min(last, hi - 1)
  if b < a then return 0 end
  return math.min(count, b - a + 1)
end

local function candidate(member)
  local first, last, count = parse_chunk_member(member)
  return {first, last, count, 0}
end

-- Puts the legacy candidate among the others in walk order.
local function with_legacy(candidates, ascending)
  if not legacy then return candidates end
  local merged, placed = {}, false
  for _, c in ipairs(candidates) do
    if not placed and ((ascending and legacy[1] < c[1]) or (not ascending and legacy[1] > c[1])) then
      merged[#merged + 1] = legacy
      placed = true
    end
    merged[#merged + 1] = c
  end
  if not placed then merged[#merged + 1] = legacy end
  return merged
end

local chunks, include_window, bound = {}, 0, nil
if hi - lo > 1 then
  if walk == 'up' then
    local acc = 0
    local below = redis.call('ZRANGE', chunk_index_key, lo, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)
    local candidates = {}
    if below[1] then candidates[1] = candidate(below[1]) end
    local above = redis.call('ZRANGE', chunk_index_key, '(' .. lo, '(' .. hi, 'BYSCORE', 'LIMIT', 0, max_chunks + 1)
    for _, member in ipairs(above) do candidates[#candidates + 1] = candidate(member) end
    local stopped = false
    for _, c in ipairs(with_legacy(candidates, true)) do
      local first, last, count = c[1], c[2], c[3]
      local n = in_range(first, last, count)
      if n > 0 then
        if acc >= need or #chunks >= max_chunks then
          stopped = true
          break
        end
        chunks[#chunks + 1] = c
        acc = acc + n
        bound = last
      end
    end
    if not stopped and acc < need then
      include_window = 1
      bound = hi
    elseif not stopped then
      -- The chunks read hold enough; whatever lies past them is for the next page.
      bound = bound or hi
    end
  else
    local in_window = redis.call('ZCOUNT', window_key, '(' .. lo, '(' .. hi)
    include_window = 1
    bound = lo
    if in_window < need then
      local acc = in_window
      local candidates = {}
      for _, member in ipairs(redis.call('ZRANGE', chunk_index_key, '(' .. hi, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, max_chunks + 1)) do
        candidates[#candidates + 1] = candidate(member)
      end
      for _, c in ipairs(with_legacy(candidates, false)) do
        local first, last, count = c[1], c[2], c[3]
        if last <= lo then break end
        local n = in_range(first, last, count)
        if n > 0 then
          if acc >= need or #chunks >= max_chunks then
            bound = chunks[#chunks] and chunks[#chunks][1] or lo
            break
          end
          chunks[#chunks + 1] = c
          acc = acc + n
        end
      end
    end
  end
end

-- Oversized single-message chunks can sit anywhere in the range; the first `need` of them in
-- walk order are enough, whatever else the walk reads.
local large = {}
if hi - lo > 1 then
  if walk == 'up' then
    large = redis.call('ZRANGE', large_index_key, '(' .. lo, '(' .. hi, 'BYSCORE', 'LIMIT', 0, need)
  else
    large = redis.call('ZRANGE', large_index_key, '(' .. hi, '(' .. lo, 'BYSCORE', 'REV', 'LIMIT', 0, need)
  end
end

local reply = {gen, deleted_before, lo, hi, bound or (walk == 'up' and hi or lo), include_window, #chunks}
for _, chunk in ipairs(chunks) do
  reply[#reply + 1] = chunk[1]
  reply[#reply + 1] = chunk[2]
  reply[#reply + 1] = chunk[4]
end
reply[#reply + 1] = #large
for _, member in ipairs(large) do
  reply[#reply + 1] = tonumber(string.match(member, '^(%d+):'))
end
return reply
