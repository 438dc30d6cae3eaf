#!lua flags=no-writes
--- Finds where messages live, by sequence or by id, without reading them.
---
--- KEYS[1] meta         hash
--- KEYS[2] window_side  hash   a sequence listed here is in the window
--- KEYS[3] chunk_index  zset
--- KEYS[4] large_index  zset
--- KEYS[5] ids          hash
---
--- ARGV[1] kind  'seq' | 'id'
--- ARGV[2..] sequences or message ids
---
--- Reply: {gen, deleted_before, seq_1, where_1, ..., seq_n, where_n}
---   where = -1 in the window, 0 not stored, otherwise the first sequence of its chunk
---   (an oversized message's chunk is named by its own sequence). seq = 0 for an unknown id.
--- Errors: KVS_WRONGTYPE
--- @include "includes/checks"

local meta_key, side_key, chunk_index_key, large_index_key, ids_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local kind = ARGV[1]

local err = check_key_types({
  {meta_key, 'hash'}, {side_key, 'hash'}, {chunk_index_key, 'zset'},
  {large_index_key, 'zset'}, {ids_key, 'hash'},
})
if err then return err end

local meta = redis.call('HMGET', meta_key, 'gen', 'deleted_before')
local reply = {tonumber(meta[1] or '0'), tonumber(meta[2] or '0')}
for i = 2, #ARGV do
  local sequence
  if kind == 'id' then
    sequence = tonumber(redis.call('HGET', ids_key, ARGV[i]) or '0')
  else
    sequence = tonumber(ARGV[i])
  end
  local where = 0
  if sequence > 0 then
    if redis.call('HEXISTS', side_key, sequence) == 1 then
      where = -1
    elseif redis.call('ZRANGE', large_index_key, sequence, sequence, 'BYSCORE', 'LIMIT', 0, 1)[1] then
      where = sequence
    else
      local member = redis.call('ZRANGE', chunk_index_key, sequence, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)[1]
      if member then
        local first, last = string.match(member, '^(%d+):(%d+):')
        if tonumber(last) >= sequence then where = tonumber(first) end
      end
    end
  end
  reply[#reply + 1] = sequence
  reply[#reply + 1] = where
end
return reply
