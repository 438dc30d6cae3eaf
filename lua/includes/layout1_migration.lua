--- @include "includes/turns"
--- @include "includes/numbers"
--- @include "includes/layout2_format"
--- @include "includes/layout2_index"
--- @include "includes/layout1"
--- @include "includes/layout2_chunks"
-- Layout 1 and its migration to layout 2.
--
-- Layout 1 kept a thread's messages in one large hash, `legacy` (sequence -> version-1 JSON
-- record), beside `meta`, `ids` and `otids`, with no chunks and no index. A layout-1 thread is
-- read as it is: the part not yet moved is one more container between the chunks and the window.
--
-- The migration first scans the legacy hash for its last sequence (meta's `last_seq` may lack
-- or lag it), in bounded HSCAN steps whose cursor and running maximum are kept in meta
-- (`legacy_scan`, `legacy_max`); until the range is known, a write that would give a message a
-- sequence is refused with KVS_MIGRATING and the client runs the steps (lua/migrate.lua). Then
-- every write first moves the oldest legacy messages into chunks through the same caps as a
-- rollover (chunk_size, chunk_max_bytes, at most max_move_chunks chunks and max_move_bytes per
-- call); `meta.migrated` is the last sequence moved and `meta.legacy_last` the last one the
-- legacy hash held. A moved message is HDEL'd from the legacy hash; when the range is done,
-- `layout` becomes 2 (then 3, as any layout-2 thread), and a field that is not a sequence stays
-- where it is. The chunks it writes are layout-3 ones (write_chunk).
--
-- This is the one place a script opens a record: a version-1 record is JSON, and its `id` and
-- `otid` are read with cjson for the chunk manifest. Version-2 records are never opened.

-- Fields of the legacy hash one HSCAN asks for, and per call, at most (about) this many times
-- the messages a call may move.
local SCAN_COUNT = 128
local SCAN_CALL_FACTOR = 8

-- The header of a layout-1 thread's turn in progress (migration): replies start..last.
local function layout_1_turn(start, last, outcome)
  local turn = new_turn()
  turn.start, turn.outcome = start, outcome or 'open'
  if start <= last then
    turn.kept, turn.replies, turn.first, turn.a, turn.b = last - start + 1, last - start + 1, start, start, last
  end
  if turn.outcome ~= 'open' then
    turn.count, turn.first_seq, turn.last_seq = turn.replies, turn.first, turn.b
  end
  return turn_header(turn)
end

-- The side info of a version-1 record; a record cjson cannot read keeps an empty id. Sequences
-- from `turn_from` on belong to the legacy turn (begin_migration).
local function legacy_side(record, sequence, turn_from, turn_id)
  local ok, decoded = pcall(cjson.decode, record)
  local id, otid = '', ''
  if ok and type(decoded) == 'table' then
    if type(decoded.id) == 'string' then id = decoded.id end
    if type(decoded.otid) == 'string' then otid = decoded.otid end
  end
  local turn = ''
  if turn_from and sequence >= turn_from then turn = turn_id end
  return side_info(id, otid, 0, #record, turn, bytes_tokens(#record))
end

-- A legacy field's sequence: a positive integer written plainly (no sign, no leading zero, at
-- most 15 digits, so it is exact in Lua); nil for any other field, which is not migrated.
local function legacy_sequence(field)
  if #field > 15 or not string.find(field, '^[1-9]%d*$') then return nil end
  return tonumber(field)
end

-- Refuses a write while a layout-1 thread's legacy range is still unknown: no message may take
-- a sequence before the scan has found the last one the legacy hash holds. Nil when the write
-- may go on.
local function check_migration(keys)
  local state = redis.call('HMGET', keys.meta, 'layout', 'legacy_last')
  if state[1] == '2' or state[1] == '3' or state[2] then return nil end
  if state[1] ~= '1' and redis.call('EXISTS', keys.legacy) == 0 then return nil end
  return redis.error_reply('KVS_MIGRATING the layout-1 thread\'s legacy hash is being scanned: run migrate steps, then send the call again')
end

-- Starts the migration once the scan found the legacy range: counts the legacy messages into
-- meta and gives the turn in progress a turn record, so its reply count stays right.
local function begin_migration(keys, legacy_max)
  local meta = redis.call('HMGET', keys.meta, 'last_seq', 'turn_id', 'turn_seq')
  local last = math.max(tonumber(meta[1] or '0') or 0, legacy_max)
  redis.call('HSET', keys.meta, 'layout', '1', 'legacy_last', fmt(last), 'migrated', 0, 'last_seq', fmt(last))
  redis.call('HDEL', keys.meta, 'legacy_scan', 'legacy_max')
  redis.call('HINCRBY', keys.meta, 'stored', redis.call('HLEN', keys.legacy))
  local start = tonumber(meta[3] or '')
  if meta[2] and start and redis.call('HEXISTS', keys.turns, meta[2]) == 0 then
    redis.call('HSET', keys.turns, meta[2],
      layout_1_turn(start, last, redis.call('HGET', keys.meta, 'turn_outcome')))
    -- The messages this record covers name the turn in their manifests when they move, whatever
    -- the thread's turn is by then, so retention trims the record as it deletes them.
    redis.call('HSET', keys.meta, 'legacy_turn', meta[2], 'legacy_turn_seq', fmt(start))
  end
end

-- One bounded step of the scan: HSCAN from the cursor kept in meta, until about
-- SCAN_CALL_FACTOR times a call's move budget of fields, or max_move_bytes of records, were
-- seen. Returns true when the scan is done and the migration has begun.
local function scan_step(keys, limits)
  local state = redis.call('HMGET', keys.meta, 'legacy_scan', 'legacy_max')
  local cursor, max = state[1] or '0', tonumber(state[2] or '0')
  local budget = SCAN_CALL_FACTOR * limits.max_move_chunks * limits.chunk_size
  local fields, bytes = 0, 0
  repeat
    local reply = redis.call('HSCAN', keys.legacy, cursor, 'COUNT', SCAN_COUNT)
    cursor = tostring(reply[1])
    local entries = reply[2]
    for i = 1, #entries, 2 do
      local sequence = legacy_sequence(entries[i])
      if sequence and sequence > max then max = sequence end
      bytes = bytes + #entries[i + 1]
    end
    fields = fields + #entries / 2
  until cursor == '0' or fields >= budget or bytes >= limits.max_move_bytes
  if cursor ~= '0' then
    redis.call('HSET', keys.meta, 'layout', '1', 'legacy_scan', cursor, 'legacy_max', fmt(max))
    return false
  end
  begin_migration(keys, max)
  return true
end

-- Moves an oversized legacy message into its own chunk, as an oversized append would.
local function migrate_oversized(keys, record, sequence, turn_from, turn_id)
  local size = #record
  local side = legacy_side(record, sequence, turn_from, turn_id or '')
  write_chunk(keys, sequence, manifest_line(sequence, side), record)
  redis.call('ZADD', keys.large_index, sequence, large_index_member(sequence, size, 0, bytes_tokens(size)))
  redis.call('HDEL', keys.legacy, sequence)
  redis.call('HINCRBY', keys.meta, 'bytes', size)
  redis.call('HINCRBY', keys.meta, 'tokens', bytes_tokens(size))
end

-- Records how far a migration step went; once the legacy range is moved whole, the thread is
-- in layout 2 (not the current layout: its next write makes it layout 3, and its window, if any,
-- then drains step by step, includes/layout3_migration.lua).
local function end_migration_step(keys, migrated, legacy_last)
  redis.call('HSET', keys.meta, 'migrated', fmt(migrated))
  if migrated >= legacy_last then
    -- Every sequence of the range was moved and HDEL'd; a field left is not a sequence (counted
    -- in `stored` by begin_migration, and not stored as a message): it stays, uncounted.
    local left = redis.call('HLEN', keys.legacy)
    if left > 0 then redis.call('HINCRBY', keys.meta, 'stored', 0 - left) end
    redis.call('HSET', keys.meta, 'layout', '2')
    redis.call('HDEL', keys.meta, 'migrated', 'legacy_last', 'legacy_turn', 'legacy_turn_seq')
  end
  redis.call('HINCRBY', keys.meta, 'gen', 1)
end

-- Moves the oldest legacy messages into chunks (or, while the legacy range is unknown, scans for
-- it); returns the number of chunks written.
local function migrate_step(keys, limits)
  if not is_layout_1(keys) then return 0 end
  local meta = redis.call('HMGET', keys.meta, 'migrated', 'legacy_last', 'legacy_turn', 'legacy_turn_seq')
  if not meta[2] then
    if scan_step(keys, limits) then redis.call('HINCRBY', keys.meta, 'gen', 1) end
    return 0
  end
  local migrated, legacy_last = tonumber(meta[1]), tonumber(meta[2])
  ensure_tokens(keys)
  local turn_id, turn_from = meta[3], tonumber(meta[4] or '')

  local chunks, moved_bytes = 0, 0
  while chunks < limits.max_move_chunks and migrated < legacy_last do
    local sequences = {}
    for s = migrated + 1, math.min(migrated + limits.chunk_size, legacy_last) do sequences[#sequences + 1] = s end
    local records = redis.call('HMGET', keys.legacy, unpack(sequences))
    local moved, data, manifest, take, bytes, tokens, last = {}, {}, {}, 0, 0, 0, migrated
    local first = nil
    for i, record in ipairs(records) do
      local sequence = sequences[i]
      if record then
        local size = #record
        if size > limits.chunk_max_bytes then
          if take > 0 then break end
          migrate_oversized(keys, record, sequence, turn_from, turn_id)
          last = sequence
          moved_bytes = moved_bytes + size
          take = -1
          break
        end
        if take > 0 and bytes + size > limits.chunk_max_bytes then break end
        first = first or sequence
        take = take + 1
        bytes = bytes + size
        tokens = tokens + bytes_tokens(size)
        moved[take] = sequence
        data[take] = record
        manifest[#manifest + 1] = manifest_line(sequence, legacy_side(record, sequence, turn_from, turn_id or ''))
      end
      last = sequence
    end
    if take > 0 then
      if chunks > 0 and moved_bytes + bytes > limits.max_move_bytes then break end
      write_chunk(keys, first, table.concat(manifest), table.concat(data))
      redis.call('ZADD', keys.chunk_index, first, chunk_index_member(first, moved[#moved], take, bytes, 0, tokens))
      redis.call('HDEL', keys.legacy, unpack(moved))
      redis.call('HINCRBY', keys.meta, 'bytes', bytes)
      redis.call('HINCRBY', keys.meta, 'tokens', tokens)
      last = moved[#moved]
      moved_bytes = moved_bytes + bytes
    end
    migrated = last
    chunks = chunks + 1
  end
  end_migration_step(keys, migrated, legacy_last)
  return chunks
end
