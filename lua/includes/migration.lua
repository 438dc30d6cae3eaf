--- @include "includes/chunks"
--- @include "includes/turns"
-- Layout 1 and its migration to layout 2.
--
-- Layout 1 kept a thread's messages in one large hash, `legacy` (sequence -> version-1 JSON
-- record), beside `meta`, `ids` and `otids`, with no chunks and no index. A layout-1 thread is
-- read as it is: the part not yet moved is one more container between the chunks and the window.
-- Every write to it first moves the oldest legacy messages into chunks through the same caps as
-- a rollover (chunk_size, chunk_max_bytes, at most max_move_chunks chunks and max_move_bytes
-- per call); `meta.migrated` is the last sequence moved and `meta.legacy_last` the last one the
-- legacy hash held. When nothing is left, the legacy hash goes and `layout` becomes 2.
--
-- This is the one place a script opens a record: a version-1 record is JSON, and its `id` and
-- `otid` are read with cjson for the chunk manifest. Version-2 records are never opened.

-- Whether the thread is stored in layout 1 (wholly or in part).
local function is_layout_1(keys)
  local layout = redis.call('HGET', keys.meta, 'layout')
  if layout == '1' then return true end
  return layout == false and redis.call('EXISTS', keys.legacy) == 1
end

-- The side info of a version-1 record; a record cjson cannot read keeps an empty id.
local function legacy_side(record, sequence, turn_from, turn_id)
  local ok, decoded = pcall(cjson.decode, record)
  local id, otid = '', ''
  if ok and type(decoded) == 'table' then
    if type(decoded.id) == 'string' then id = decoded.id end
    if type(decoded.otid) == 'string' then otid = decoded.otid end
  end
  local turn = ''
  if turn_from and sequence >= turn_from then turn = turn_id end
  return side_info(id, otid, 0, #record, turn)
end

-- Starts the migration: counts the legacy messages into meta and gives the turn in progress a
-- turn record, so its reply count stays right.
local function begin_migration(keys)
  local meta = redis.call('HMGET', keys.meta, 'legacy_last', 'last_seq', 'turn_id', 'turn_seq')
  if meta[1] then return end
  local last = tonumber(meta[2] or '0')
  redis.call('HSET', keys.meta, 'layout', '1', 'legacy_last', last, 'migrated', 0, 'last_seq', last)
  redis.call('HINCRBY', keys.meta, 'stored', redis.call('HLEN', keys.legacy))
  if meta[3] and meta[4] and redis.call('HEXISTS', keys.turns, meta[3]) == 0 then
    redis.call('HSET', keys.turns, meta[3],
      layout_1_turn(tonumber(meta[4]), last, redis.call('HGET', keys.meta, 'turn_outcome')))
  end
end

-- Moves the oldest legacy messages into chunks; returns the number of chunks written.
local function migrate_step(keys, limits)
  if not is_layout_1(keys) then return 0 end
  begin_migration(keys)
  local meta = redis.call('HMGET', keys.meta, 'migrated', 'legacy_last', 'turn_id', 'turn_seq', 'turn_outcome')
  local migrated, legacy_last = tonumber(meta[1]), tonumber(meta[2])
  local turn_id, turn_from = meta[3], nil
  if turn_id and meta[4] and (meta[5] == false or meta[5] == 'open') then turn_from = tonumber(meta[4]) end

  local chunks, moved_bytes = 0, 0
  while chunks < limits.max_move_chunks and migrated < legacy_last do
    local sequences = {}
    for s = migrated + 1, math.min(migrated + limits.chunk_size, legacy_last) do sequences[#sequences + 1] = s end
    local records = redis.call('HMGET', keys.legacy, unpack(sequences))
    local moved, data, manifest, take, bytes, last = {}, {}, {}, 0, 0, migrated
    local first = nil
    for i, record in ipairs(records) do
      local sequence = sequences[i]
      if record then
        local size = #record
        if size > limits.chunk_max_bytes then
          if take > 0 then break end
          -- An oversized legacy message gets its own chunk, as an oversized append would.
          local side = legacy_side(record, sequence, turn_from, turn_id or '')
          write_chunk(keys, sequence, manifest_line(sequence, side), record)
          redis.call('ZADD', keys.large_index, sequence, large_index_member(sequence, size, 0))
          redis.call('HDEL', keys.legacy, sequence)
          redis.call('HINCRBY', keys.meta, 'bytes', size)
          last = sequence
          moved_bytes = moved_bytes + size
          take = -1
          break
        end
        if take > 0 and bytes + size > limits.chunk_max_bytes then break end
        first = first or sequence
        take = take + 1
        bytes = bytes + size
        moved[take] = sequence
        data[take] = record
        manifest[#manifest + 1] = manifest_line(sequence, legacy_side(record, sequence, turn_from, turn_id or ''))
      end
      last = sequence
    end
    if take > 0 then
      if chunks > 0 and moved_bytes + bytes > limits.max_move_bytes then break end
      write_chunk(keys, first, table.concat(manifest), table.concat(data))
      redis.call('ZADD', keys.chunk_index, first, chunk_index_member(first, moved[#moved], take, bytes, 0))
      redis.call('HDEL', keys.legacy, unpack(moved))
      redis.call('HINCRBY', keys.meta, 'bytes', bytes)
      last = moved[#moved]
      moved_bytes = moved_bytes + bytes
    end
    migrated = last
    chunks = chunks + 1
  end
  redis.call('HSET', keys.meta, 'migrated', migrated)
  if migrated >= legacy_last then
    redis.call('DEL', keys.legacy)
    redis.call('HSET', keys.meta, 'layout', '2')
    redis.call('HDEL', keys.meta, 'migrated', 'legacy_last')
  end
  redis.call('HINCRBY', keys.meta, 'gen', 1)
  return chunks
end
