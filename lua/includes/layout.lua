--- @include "includes/checks"
--- @include "includes/numbers"
-- The stored layout, as the scripts know it: which layout a thread is in, which layouts this
-- version reads and writes; the thread's keys, their types, its fixed keys, its chunk indexes
-- and a chunk's key. Scripts and the layout-neutral includes ask these functions instead of
-- naming keys or layout numbers themselves.
--
-- Layouts (docs/LAYOUT.md): 1, the legacy hash (read as it is: includes/layout1.lua; migrated:
-- includes/layout1_migration.lua); 2, the window, the chunks and their indexes
-- (includes/layout2*.lua); 3, the open chunk appended in place and closed into chunks on the
-- server (the one written: includes/layout3_store.lua; its chunks and indexes are layout 2's
-- formats, in strings: includes/layout2_chunks.lua).

-- The layout every write leaves a thread in, and the layouts this version reads.
local CURRENT_LAYOUT = '3'
local READ_LAYOUTS = {['1'] = true, ['2'] = true, ['3'] = true}

-- The thread's keys, named once from KEYS (every script takes the same fourteen). KEYS is passed
-- in: a script's is a global, a library function's is its argument.
local function thread_keys(KEYS)
  local chunk_prefix = KEYS[10]
  return {
    meta = KEYS[1], window = KEYS[2], window_side = KEYS[3], chunk_index = KEYS[4],
    large_index = KEYS[5], ids = KEYS[6], otids = KEYS[7], turns = KEYS[8], legacy = KEYS[9],
    chunk_prefix = chunk_prefix, events = KEYS[11], pairs = KEYS[12],
    open_data = KEYS[13], open_manifest = KEYS[14],
    -- The kept system prompt (includes/prompt.lua): a chunk's two strings at no sequence.
    prompt_manifest = chunk_prefix .. 'prompt:m', prompt_data = chunk_prefix .. 'prompt:d',
  }
end

-- The thread's keys but its chunks, meta first (every key the thread's expiry covers).
local function fixed_keys(keys)
  return {keys.meta, keys.window, keys.window_side, keys.chunk_index, keys.large_index,
          keys.ids, keys.otids, keys.turns, keys.legacy, keys.events, keys.pairs,
          keys.open_data, keys.open_manifest}
end

-- The indexes that name the thread's chunks, normal then oversized: a member's score is its
-- chunk's first sequence (chunk_key).
local function chunk_indexes(keys)
  return {keys.chunk_index, keys.large_index}
end

-- The keys delete removes at its tombstone: the thread's keys but meta, the event stream, the
-- chunk indexes and the chunks (those go step by step after it, lua/delete.lua).
local function tombstone_keys(keys)
  return {keys.window, keys.window_side, keys.ids, keys.otids, keys.turns, keys.legacy, keys.pairs,
          keys.open_data, keys.open_manifest, keys.prompt_manifest, keys.prompt_data}
end

-- The chunk indexes with their type, for check_key_types.
local function chunk_index_types(keys)
  return {{keys.chunk_index, 'zset'}, {keys.large_index, 'zset'}}
end

-- A chunk's key: the prefix KEYS[10] and the chunk's first sequence (a number, or the text of
-- one as a score reads).
local function chunk_key(keys, first)
  if type(first) == 'string' then return keys.chunk_prefix .. first end
  return keys.chunk_prefix .. fmt(first)
end

-- The refusal of a thread whose meta `layout` reads `layout` when this version does not read
-- that layout; nil for one it reads, or for a new thread (no layout).
local function unreadable_layout(layout)
  if layout and not READ_LAYOUTS[layout] then
    return redis.error_reply('KVS_LAYOUT thread is stored in layout ' .. layout .. ', this version reads layouts 1, 2 and 3')
  end
  return nil
end

-- Fails unless the thread is missing or in a layout this version reads (layout 1 it migrates),
-- and is not being deleted, nor restored (unless `restoring_ok`: the restore's own calls).
local function check_layout(meta_key, restoring_ok)
  local meta = redis.call('HMGET', meta_key, 'layout', 'deleting', 'restoring')
  if meta[2] then return deleting_error() end
  if meta[3] and not restoring_ok then return restoring_error() end
  return unreadable_layout(meta[1])
end

-- Fails unless every key is missing or of its type, the open chunk's two strings hold what meta
-- accounts for (a foreign value of the right type at their names is refused too), and the
-- thread's layout is one this version reads (and the thread writable: check_layout).
local function check_thread(keys, restoring_ok)
  local err = check_key_types({
    {keys.meta, 'hash'}, {keys.window, 'zset'}, {keys.window_side, 'hash'},
    {keys.chunk_index, 'zset'}, {keys.large_index, 'zset'}, {keys.ids, 'hash'},
    {keys.otids, 'hash'}, {keys.turns, 'hash'}, {keys.legacy, 'hash'}, {keys.pairs, 'zset'},
    {keys.open_data, 'string'}, {keys.open_manifest, 'string'},
  })
  if err then return err end
  local accounted = redis.call('HMGET', keys.meta, 'open_bytes', 'open_manifest_bytes')
  for i, key in ipairs({keys.open_data, keys.open_manifest}) do
    local length, expected = redis.call('STRLEN', key), tonumber(accounted[i] or '0')
    if length ~= expected then
      return redis.error_reply(string.format('KVS_WRONGTYPE %s holds %d bytes where the thread accounts for %d',
        key, length, expected))
    end
  end
  return check_layout(keys.meta, restoring_ok)
end
