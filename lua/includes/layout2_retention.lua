--- @include "includes/turns"
--- @include "includes/history"
--- @include "includes/layout2_chunks"
--- @include "includes/layout2_index"
--- @include "includes/numbers"
--- @include "includes/layout2_format"
--- @include "includes/events"
--- @include "includes/prompt"
-- Retention: after a compaction, the oldest chunk (of either kind: includes/layout2_chunks.lua,
-- delete_chunk) is deleted while its last sequence is at or before the summary's last sequence
-- AND at least `retained_limit` messages are stored after it, and no window or open-chunk
-- message is older than it. At most `max_chunks` chunks go per call. Deleting a chunk trims the id and otid maps and
-- the turn records of its messages (from its manifest) and of finished turns left without
-- messages before it (includes/turns.lua, drop_idle_turns), gives its bytes, media and tokens back
-- (the tokens its index member sums), and
-- moves `deleted_before` past it. Returns the number of chunks deleted.

-- Drops a turn's sequences before `from` (its oldest ranges). A started turn still open keeps
-- its record even when nothing of it is left; any other turn left empty loses it.
local function trim_turn(keys, turn_id, from)
  local turn = read_turn(keys, turn_id)
  if not turn then return end
  drop_turn_through(keys, turn_id, turn, from - 1)
  if turn.kept == 0 and not (turn.start > 0 and turn.outcome == 'open') then
    delete_turn(keys, turn_id, turn)
  else
    write_turn(keys, turn_id, turn)
  end
end

-- What deleting a chunk takes from its manifest: {ids, otids, turns, media}. Nil when the
-- manifest does not hold one well-formed line per message the index counts (a migration before
-- side infos were escaped could write raw tabs and newlines into it): retention stops before
-- such a chunk rather than fail after its first write.
local function chunk_contents(keys, first, index_key, member)
  local manifest = chunk_manifest(keys, first)
  local count = 1
  if index_key == keys.chunk_index then count = select(3, parse_chunk_member(member)) end
  if string.sub(manifest, -1) ~= '\n' then return nil end
  local contents, lines = {ids = {}, otids = {}, turns = {}, media = 0}, 0
  local walked = 0
  for sequence, side, _, stop in manifest_lines(manifest) do
    local id, otid, media, _, turn = parse_side(side)
    if not id or not string.find(sequence, '^%d+$') then return nil end
    walked = stop
    contents.ids[#contents.ids + 1] = id
    if otid ~= '' then contents.otids[#contents.otids + 1] = otid end
    if turn ~= '' then contents.turns[turn] = true end
    contents.media = contents.media + media
    lines = lines + 1
  end
  if lines ~= count or walked ~= #manifest then return nil end
  return contents
end

-- Deletes one chunk (normal or oversized) and everything that points into it.
local function drop_chunk(keys, first, index_key, member, bytes, tokens, contents, touched_turns)
  local ids, otids = contents.ids, contents.otids
  for turn in pairs(contents.turns) do touched_turns[turn] = true end
  if #ids > 0 then redis.call('HDEL', keys.ids, unpack(ids)) end
  if #otids > 0 then redis.call('HDEL', keys.otids, unpack(otids)) end
  delete_chunk(keys, first)
  redis.call('ZREM', index_key, member)
  redis.call('HINCRBY', keys.meta, 'stored', 0 - #ids)
  redis.call('HINCRBY', keys.meta, 'bytes', 0 - bytes)
  redis.call('HINCRBY', keys.meta, 'tokens', 0 - tokens)
  if contents.media > 0 then redis.call('HINCRBY', keys.meta, 'media', 0 - contents.media) end
end

-- Whether a unit from `first` to `last` is older than every message of the window (a layout-2
-- leftover; keys.has_window, set by retain: a key of another type there is not a window, and
-- layout 3 leaves it alone) and of the open chunk: only such a unit may go.
local function older_than_window_and_open(keys, first, last)
  if keys.has_window and redis.call('ZCOUNT', keys.window, '-inf', '(' .. fmt(first)) > 0 then return false end
  local open_first = tonumber(redis.call('HGET', keys.meta, 'open_first') or '0')
  return open_first == 0 or last < open_first
end

-- The oldest unit retention may delete: the oldest chunk of either index, and with a normal
-- chunk every oversized chunk inside its range (they were stored beside it, out of the window
-- or the open chunk), so that everything below `deleted_before` is really gone; never a unit
-- newer than a window or open-chunk message. Returns last, count and the chunks as {first,
-- index key, member, bytes, tokens}; nil when there is no such unit.
local function oldest_unit(keys)
  local normal = redis.call('ZRANGE', keys.chunk_index, 0, 0)[1]
  local large = redis.call('ZRANGE', keys.large_index, 0, 0)[1]
  if large then
    local sequence, bytes, _, tokens = parse_large_member(large)
    if not normal or sequence < parse_chunk_member(normal) then
      if not older_than_window_and_open(keys, sequence, sequence) then return nil end
      return sequence, 1, {{sequence, keys.large_index, large, bytes, tokens}}
    end
  end
  if not normal then return nil end
  local first, last, count, bytes, _, tokens = parse_chunk_member(normal)
  if not older_than_window_and_open(keys, first, last) then return nil end
  local unit = {{first, keys.chunk_index, normal, bytes, tokens}}
  for _, member in ipairs(redis.call('ZRANGE', keys.large_index, first, last, 'BYSCORE')) do
    local sequence, large_bytes, _, large_tokens = parse_large_member(member)
    unit[#unit + 1] = {sequence, keys.large_index, member, large_bytes, large_tokens}
    count = count + 1
  end
  return last, count, unit
end

local function retain(keys, retained_limit, max_chunks)
  if retained_limit < 0 then return 0 end
  local state = redis.call('HMGET', keys.meta, 'summary_last', 'migrated')
  local summary_last = tonumber(state[1] or '0')
  if summary_last <= 0 then return 0 end
  -- While a layout-1 thread migrates, chunks past the part moved are newer than the legacy
  -- messages still waiting: nothing past the moved part goes.
  local until_sequence = math.min(summary_last, tonumber(state[2] or summary_last))
  -- While a layout-3 thread's window drains (includes/layout3_migration.lua), chunks closed
  -- since are newer than the window's messages: nothing past the window's oldest goes. (In
  -- layout 2 every chunk is older than the window: no limit.)
  keys.has_window = redis.call('TYPE', keys.window)['ok'] == 'zset'
  local oldest = keys.has_window and redis.call('ZRANGE', keys.window, 0, 0, 'WITHSCORES')[2]
  if oldest then until_sequence = math.min(until_sequence, tonumber(oldest) - 1) end
  local deleted, deleted_before, touched_turns, run = 0, nil, {}, nil
  while deleted < max_chunks do
    local last, count, unit = oldest_unit(keys)
    if not last or last > until_sequence then break end
    local stored = tonumber(redis.call('HGET', keys.meta, 'stored') or '0')
    if stored - count < retained_limit then break end
    local contents = {}
    for i, chunk in ipairs(unit) do
      contents[i] = chunk_contents(keys, chunk[1], chunk[2], chunk[3])
      if not contents[i] then break end
    end
    if #contents < #unit then break end
    if deleted == 0 then ensure_tokens(keys) end
    run = run or prompt.state(keys)  -- the system prompt's run (includes/prompt.lua)
    if run == 'open' then run = prompt.keep(keys, unit, last, run) end
    for i, chunk in ipairs(unit) do
      drop_chunk(keys, chunk[1], chunk[2], chunk[3], chunk[4], chunk[5], contents[i], touched_turns)
    end
    deleted = deleted + 1
    deleted_before = last + 1
  end
  if deleted > 0 then
    redis.call('HSET', keys.meta, 'deleted_before', fmt(deleted_before))
    trim_events(keys, deleted_before)
    trim_history(keys, deleted_before)
    for turn in pairs(touched_turns) do trim_turn(keys, turn, deleted_before) end
    drop_idle_turns(keys, deleted_before)
    redis.call('HINCRBY', keys.meta, 'gen', 1)
  end
  return deleted
end
