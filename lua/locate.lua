#!lua flags=no-writes
--- Finds where messages live, by sequence, by id or by otid, without reading them.
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV kind (str: 'seq' | 'id' | 'otid')
--- ARGV targets[] target (str): a sequence (in decimal), message id or otid, as kind says
---
--- Reply: {gen, deleted_before, seq_1, where_1, ..., seq_n, where_n}
---   where = -1 in the window, -2 in a layout-1 thread's legacy hash, -3 in layout 3's open
---   chunk, -4 lost (an id or otid the index keeps, in no container), 0 not stored, otherwise
---   the first sequence of its chunk (an oversized message's chunk is named by its own
---   sequence). seq = 0 for an unknown id.
--- Errors: KVS_WRONGTYPE
--- @include "includes/layout"
--- @include "includes/checks"
--- @include "includes/layout2_reads"

local keys = thread_keys(KEYS)
local kind = args.kind

local err = check_key_types(located_key_types(keys, kind == 'otid'))
if err then return err end

local meta = redis.call('HMGET', keys.meta, 'gen', 'deleted_before', 'deleting')
local reply = {tonumber(meta[1] or '0'), tonumber(meta[2] or '0')}
-- A thread being deleted (lua/delete.lua) stores nothing, whatever chunks it still has.
local deleting = meta[3]
for _, target in ipairs(args.targets.target) do
  local sequence
  if kind == 'id' then
    sequence = tonumber(redis.call('HGET', keys.ids, target) or '0')
  elseif kind == 'otid' then
    sequence = tonumber(redis.call('HGET', keys.otids, target) or '0')
  else
    sequence = tonumber(target)
  end
  local where, first = nil, nil
  if sequence > 0 and not deleting then
    where, first = locate_stored(keys, sequence)
  end
  -- An id or otid the index keeps, above retention, yet in no container: its chunk's keys are
  -- gone (something else deleted them), so it is lost, not absent (-4).
  local lost = not where and not deleting and kind ~= 'seq' and sequence > 0 and sequence >= reply[2]
  reply[#reply + 1] = sequence
  reply[#reply + 1] = (where == 'window' and -1) or (where == 'legacy' and -2) or (where == 'open' and -3)
    or (lost and -4) or first or 0
end
return reply
