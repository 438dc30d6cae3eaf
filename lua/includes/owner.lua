-- An owned thread's writes keep its owner's directory right in the same atomic step
-- (docs/OWNERS.md). A thread of an owner has the owner's four keys after its own fourteen:
-- KEYS[15..18] = recent, created, info, usage (kvstore/_engine/layout/keys.py: OwnerKeys), all
-- in the owner's hash tag. A thread without an owner has fourteen keys and pays one table index.
--
-- The owner's `usage` hash holds the totals (`threads`, `messages`, `bytes`, `tokens`), the
-- quotas (`max_threads`, `max_bytes`, `max_per_minute`), the append rate's window (`minute`,
-- `minute_count`), an erasure's state (`erasing`, `erased_threads`, `erased_messages`), and per
-- thread `t:<thread id>` -> "messages:bytes:tokens:deadline:fingerprint": the thread's counts as
-- its last write left them, when its keys expire (0: never), and meta's other SNAPSHOT fields
-- then (comma-joined; empty for a thread listed before its first write). A thread is in the
-- directory exactly while it has that field.
--
-- Everything is in one table: the library's main function holds at most 200 locals.
local owner = {}

-- meta's counts, then the fields whose change is the thread's activity (any write that stores,
-- moves, removes or turns): the thread's record keeps them as its fingerprint, so a call reads
-- meta once, after its body.
owner.SNAPSHOT = {'stored', 'bytes', 'tokens', 'last_seq', 'gen', 'events', 'turn_id',
                  'turn_outcome', 'summary_seq', 'deleting', 'restoring', 'fork_of'}
-- The writing scripts that can make a thread: the thread quota is checked before them.
owner.CREATES = {append = true, restore = true, restore_state = true, start_turn = true,
                 publish = true, compact = true, info = true}
owner.TOTALS = {'threads', 'messages', 'bytes', 'tokens', 'max_threads', 'max_bytes',
                'max_per_minute', 'minute', 'minute_count', 'erasing', 'erased_threads',
                'erased_messages'}

function owner.now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The owner's keys from KEYS[first..first+3]; `prefix` names its threads' keys.
function owner.keys(KEYS, first)
  local usage = KEYS[first + 3]
  return {recent = KEYS[first], created = KEYS[first + 1], info = KEYS[first + 2], usage = usage,
          prefix = string.sub(usage, 1, #usage - #'usage')}
end

-- A thread's meta key, named like kvstore/_engine/layout/keys.py names it.
function owner.meta_key(dir, thread_id)
  return dir.prefix .. thread_id .. '|meta'
end

-- A thread's record as four numbers and its fingerprint (zeros and '' for a thread not in the
-- directory).
function owner.parse_record(record)
  if not record then return 0, 0, 0, 0, '' end
  local m, b, t, d, f = string.match(record, '^(%-?%d+):(%-?%d+):(%-?%d+):(%-?%d+):?(.*)$')
  return tonumber(m) or 0, tonumber(b) or 0, tonumber(t) or 0, tonumber(d) or 0, f or ''
end

-- The usage hash's totals as a table of numbers (absent: 0).
function owner.totals(dir, thread_id)
  local fields = {unpack(owner.TOTALS)}
  if thread_id then fields[#fields + 1] = 't:' .. thread_id end
  local values = redis.call('HMGET', dir.usage, unpack(fields))
  local totals = {}
  for i, name in ipairs(owner.TOTALS) do totals[name] = tonumber(values[i]) or 0 end
  totals.record = thread_id and values[#fields] or nil
  return totals
end

-- The type kvstore keeps at each of the owner's keys.
owner.TYPES = {recent = 'zset', created = 'zset', info = 'hash', usage = 'hash'}

-- The refusal of a call when one of the owner's keys `names` holds another type than kvstore
-- keeps there (something else wrote it); nil when each is missing or of its type. Checked
-- before a call's first write: a Lua error after a write does not roll the write back.
function owner.wrong_type(dir, names)
  for _, name in ipairs(names) do
    local actual = redis.call('TYPE', dir[name])['ok']
    if actual ~= 'none' and actual ~= owner.TYPES[name] then
      return redis.error_reply('KVS_WRONGTYPE ' .. dir[name] .. ' holds a ' .. actual
        .. ', expected a ' .. owner.TYPES[name])
    end
  end
  return nil
end

-- The owner's totals (owner.totals), or the refusal of a usage hash of another type.
function owner.read_totals(dir, thread_id)
  local ok, totals = pcall(owner.totals, dir, thread_id)
  if ok then return totals, nil end
  return nil, owner.wrong_type(dir, {'usage'}) or error(totals)
end

-- The bytes and count of the records a call brings: its ARGV from `first`, every `stride`
-- (0: one record).
function owner.incoming(ARGV, first, stride)
  if first == 0 then return 0, 0 end
  local bytes, count = 0, 0
  local i = first
  while ARGV[i] do
    bytes, count = bytes + #ARGV[i], count + 1
    if stride == 0 then break end
    i = i + stride
  end
  return bytes, count
end

-- Whether a listed thread went with its keys' expiry (thread_ttl): its record's deadline passed
-- and its meta is gone (a thread listed by set_info alone has no meta: its deadline decides).
function owner.expired(dir, thread_id, record, now)
  -- The deadline alone, in one capture: a listing asks this of every thread of its page.
  local deadline = tonumber(string.match(record, '^[^:]*:[^:]*:[^:]*:(%d+)') or 0) or 0
  return deadline > 0 and deadline <= now
    and redis.call('EXISTS', owner.meta_key(dir, thread_id)) == 0
end

-- The fields and values of `updates` into the owner's usage hash.
function owner.save(dir, updates)
  local flat = {}
  for field, value in pairs(updates) do
    flat[#flat + 1] = field
    flat[#flat + 1] = value
  end
  if #flat > 0 then redis.call('HSET', dir.usage, unpack(flat)) end
end

-- A thread out of the directory now, with its counts (an expired thread, or an index entry
-- without a record).
function owner.forget(dir, thread_id)
  local totals = owner.totals(dir, thread_id)
  if totals.record then
    local updates = {}
    owner.unregister(dir, totals, thread_id, updates)
    owner.save(dir, updates)
  else
    redis.call('ZREM', dir.recent, thread_id)
    redis.call('ZREM', dir.created, thread_id)
    redis.call('HDEL', dir.info, thread_id)
  end
end

-- The expired threads among the owner's least recently active (the first to expire) leave the
-- directory, with their counts; how many left. It looks at the SWEEP least recently active, and
-- on while the ones it finds are expired (a mass expiry), at most SWEEP_MOST threads a call.
function owner.sweep(dir, now)
  local left, examined, offset = 0, 0, 0
  while true do
    local ids = redis.call('ZRANGE', dir.recent, offset, offset + owner.SWEEP - 1)
    if #ids == 0 then return left end
    for _, id in ipairs(ids) do
      examined = examined + 1
      local record = redis.call('HGET', dir.usage, 't:' .. id)
      if not record or owner.expired(dir, id, record, now) then
        owner.forget(dir, id)
        left = left + 1
      else
        offset = offset + 1  -- it stays: the next range starts after it
        if examined >= owner.SWEEP then return left end
      end
      if examined >= owner.SWEEP_MOST then return left end
    end
  end
end

-- The owner's `totals` for a write of `thread_id`, with the thread's record forgotten first when
-- the thread expired (a write to it makes a new thread: its old title, counts and creation are
-- gone with it). Not while the owner is being erased: a refused call writes nothing.
function owner.current(dir, thread_id, totals, now)
  if totals.erasing == 0 and totals.record and owner.expired(dir, thread_id, totals.record, now) then
    owner.forget(dir, thread_id)
    totals = owner.totals(dir, thread_id)
  end
  return totals
end

-- The refusal of a call the owner's quotas or erasure forbid, checked before any write; nil
-- when the call may go on. `minute` is the rate window the call falls in.
function owner.refusal(kind, totals, registered, bytes, count, minute)
  if totals.erasing > 0 and kind ~= 'delete' then
    return redis.error_reply('KVS_OWNER_ERASING the owner is being erased: finish the erasure, then write again')
  end
  if not registered and owner.CREATES[kind] and totals.max_threads > 0
      and totals.threads >= totals.max_threads then
    return redis.error_reply('KVS_QUOTA threads: the owner has ' .. totals.threads
      .. ' threads, its quota is ' .. totals.max_threads)
  end
  if bytes > 0 and totals.max_bytes > 0 and totals.bytes + bytes > totals.max_bytes then
    return redis.error_reply('KVS_QUOTA_BYTES the owner stores ' .. totals.bytes .. ' bytes, '
      .. bytes .. ' more would pass its quota of ' .. totals.max_bytes)
  end
  if kind == 'append' and count > 0 and totals.max_per_minute > 0 then
    local used = totals.minute == minute and totals.minute_count or 0
    if used + count > totals.max_per_minute then
      return redis.error_reply('KVS_QUOTA rate: ' .. used .. ' messages appended this minute, '
        .. count .. ' more would pass the quota of ' .. totals.max_per_minute .. ' a minute')
    end
  end
  return nil
end

-- Whether a call's records are all stored already (a retried append): their message ids all in
-- the thread's `ids` (KEYS[6]), or their otids, every record carrying one, all in its `otids`
-- (KEYS[7]); the body then replies the stored messages and writes nothing.
function owner.replay(KEYS, ARGV, at)
  if at.ids == 0 or at.first == 0 then return false end
  local ids, otids = {}, {}
  local i = at.first
  while ARGV[i] do
    ids[#ids + 1], otids[#otids + 1] = ARGV[i + at.ids], ARGV[i + at.ids + 1]
    i = i + at.stride
  end
  local function stored(key, names)
    if #names == 0 then return false end
    for _, name in ipairs(names) do
      if name == '' then return false end
    end
    -- pcall: an index of another type is no replay (the body refuses it, KVS_WRONGTYPE).
    local values = redis.pcall('HMGET', key, unpack(names))
    if values.err then return false end
    for _, value in ipairs(values) do
      if not value then return false end
    end
    return true
  end
  return stored(KEYS[6], ids) or stored(KEYS[7], otids)
end

-- How many of the least recently active threads a usage read, or a write a quota would refuse,
-- looks at for expired ones (owner.sweep), and the most it looks at while they are expired.
owner.SWEEP = 16
owner.SWEEP_MOST = 1000

-- The refusal of a call (owner.refusal) once the expired ones among the owner's least recently
-- active threads have left, and the owner's totals then: a quota is not taken by threads whose
-- keys expired. A call no quota refuses looks at none.
function owner.checked(kind, dir, thread_id, totals, bytes, count, minute, now)
  local refused = owner.refusal(kind, totals, totals.record ~= nil, bytes, count, minute)
  if refused and totals.erasing == 0 and not owner.wrong_type(dir, {'created', 'info'})
      and owner.sweep(dir, now) > 0 then
    totals = owner.totals(dir, thread_id)
    refused = owner.refusal(kind, totals, totals.record ~= nil, bytes, count, minute)
  end
  return refused, totals
end

-- A long value in a field no thread id can name ('~'): a hash holding one is a hash table, never
-- a listpack, whose lookups are linear (a page's HMGET of 50 fields of a 500-field listpack took
-- 20 times a hash table's; a server may keep hashes of 512 fields as listpacks). Set when the
-- owner's TABLE_AT-th thread is listed: a smaller owner's hashes stay the server's compact
-- listpacks, whose lookups cost little at that size, and whose DUMP a read does not reorder (a
-- hash table that just grew is rehashed a step at each command, reads too).
owner.TABLE_MARK = '~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~'
owner.TABLE_AT = 64

-- A new thread into the directory: its creation, and the directory's hashes made hash tables
-- once the owner has TABLE_AT threads.
function owner.register(dir, thread_id, now, updates, totals)
  redis.call('ZADD', dir.created, now, thread_id)
  if totals.threads + 1 == owner.TABLE_AT then
    redis.call('HSETNX', dir.usage, '~', owner.TABLE_MARK)
    redis.call('HSETNX', dir.info, '~', owner.TABLE_MARK)
  end
  updates.threads = totals.threads + 1
end

-- Takes a thread out of the directory: its entries, and its counts out of the totals.
function owner.unregister(dir, totals, thread_id, updates)
  local m, b, t = owner.parse_record(totals.record)
  redis.call('ZREM', dir.recent, thread_id)
  redis.call('ZREM', dir.created, thread_id)
  redis.call('HDEL', dir.info, thread_id)
  redis.call('HDEL', dir.usage, 't:' .. thread_id)
  updates.threads = totals.threads - 1
  updates.messages, updates.bytes = totals.messages - m, totals.bytes - b
  updates.tokens = totals.tokens - t
  if totals.erasing > 0 then
    updates.erased_threads = totals.erased_threads + 1
    updates.erased_messages = totals.erased_messages + m
  end
end

-- The thread's counts and fingerprint after the call, into its record and the totals; registers
-- a new thread. `ttl_ms` > 0: the thread's keys expire, and the record keeps when.
function owner.account(dir, totals, thread_id, after, fingerprint, now, ttl_ms, updates)
  local m0, b0, t0, deadline = owner.parse_record(totals.record)
  local m, b, t = tonumber(after[1]) or 0, tonumber(after[2]) or 0, tonumber(after[3]) or 0
  -- A store without a ttl neither sets nor clears one: the keys keep the deadline they had (one
  -- passed while they still exist only costs a listing an EXISTS).
  if ttl_ms > 0 then deadline = math.max(redis.call('PEXPIRETIME', dir.thread_meta), 0) end
  if not totals.record then owner.register(dir, thread_id, now, updates, totals) end
  -- '%.0f': a number joined with '..' is written with 14 digits (1e14 tokens as '1e+14'), which
  -- parse_record would not read back.
  updates['t:' .. thread_id] = string.format('%.0f:%.0f:%.0f:%.0f:', m, b, t, deadline) .. fingerprint
  if m ~= m0 then updates.messages = totals.messages + m - m0 end
  if b ~= b0 then updates.bytes = totals.bytes + b - b0 end
  if t ~= t0 then updates.tokens = totals.tokens + t - t0 end
  if totals.erasing > 0 and m < m0 then
    updates.erased_messages = totals.erased_messages + m0 - m
  end
end

-- meta's SNAPSHOT after a call: whether meta exists, and the fingerprint of its fields but the
-- counts.
function owner.fingerprint_of(after)
  local exists, parts = false, {}
  for i = 1, #owner.SNAPSHOT do
    local value = after[i]
    if value then exists = true end
    if i > 3 then parts[i - 3] = value or '' end
  end
  return exists, table.concat(parts, ',')
end

-- The store's thread_ttl in ms, from a writing script's limits argument (includes/args.lua:
-- its ninth number); 0 for none, or for a call without limits (delete).
function owner.ttl_of(kind, ARGV)
  if kind == 'delete' then return 0 end
  return tonumber(string.match(ARGV[1], '^[^:]*:[^:]*:[^:]*:[^:]*:[^:]*:[^:]*:[^:]*:[^:]*:([^:]*)')) or 0
end

-- The owner's keys a thread's write may write besides `usage`: `recent` (its activity), and
-- `created` and `info` too when it makes the thread, deletes it or finds it expired.
function owner.written(kind, totals, now)
  local _, _, _, deadline = owner.parse_record(totals.record)
  if totals.record and kind ~= 'delete' and (deadline == 0 or deadline > now) then
    return {'recent'}
  end
  return {'recent', 'created', 'info'}
end

-- Runs a thread's writing script `body` for an owned thread: the owner's quotas and erasure
-- checked first, the directory brought up to date after (an error reply changes nothing of it).
-- Its own commands: the owner's totals and the time before the body; meta, the activity and
-- the owner's hash after it.
function owner.call(kind, at, body, KEYS, ARGV)
  local dir = owner.keys(KEYS, 15)
  dir.thread_meta = KEYS[1]
  local thread_id = string.sub(KEYS[1], #dir.prefix + 1, -#'|meta' - 1)
  local now = owner.now_ms()
  local totals, wrong = owner.read_totals(dir, thread_id)
  wrong = wrong or owner.wrong_type(dir, owner.written(kind, totals, now))
  if wrong then return wrong end
  totals = owner.current(dir, thread_id, totals, now)
  local minute = math.floor(now / 60000)
  local bytes, count = owner.incoming(ARGV, at.first, at.stride)
  local refused
  refused, totals = owner.checked(kind, dir, thread_id, totals, bytes, count, minute, now)
  -- A retry of a stored batch writes nothing: no quota refuses it (its reply is the stored one).
  if refused and totals.erasing == 0 and owner.replay(KEYS, ARGV, at) then refused = nil end
  if refused then return refused end

  local reply = body(KEYS, ARGV)
  if type(reply) == 'table' and reply.err then return reply end
  local after = redis.call('HMGET', KEYS[1], unpack(owner.SNAPSHOT))
  local exists, fingerprint = owner.fingerprint_of(after)
  local updates = {}
  if not exists then
    local _, _, _, _, was = owner.parse_record(totals.record)
    -- Gone: deleted (or a thread that had written before and is no more). A thread listed by
    -- set_info alone has no meta yet, and stays.
    if totals.record and (kind == 'delete' or was ~= '') then
      owner.unregister(dir, totals, thread_id, updates)
    elseif kind == 'delete' and not totals.record then
      -- Index entries without a record (something else wrote them): a delete takes them too,
      -- so an erasure that names them ends.
      owner.forget(dir, thread_id)
    end
  else
    local m0, b0, t0, _, was = owner.parse_record(totals.record)
    local m, b, t = tonumber(after[1]) or 0, tonumber(after[2]) or 0, tonumber(after[3]) or 0
    if not totals.record or was ~= fingerprint or m ~= m0 or b ~= b0 or t ~= t0 then
      owner.account(dir, totals, thread_id, after, fingerprint, now, owner.ttl_of(kind, ARGV), updates)
      redis.call('ZADD', dir.recent, now, thread_id)
    end
  end
  if kind == 'append' and type(reply) == 'table' and reply[1] == 1 and count > 0 then
    local used = totals.minute == minute and totals.minute_count or 0
    updates.minute, updates.minute_count = minute, used + count
  end
  owner.save(dir, updates)
  return reply
end

-- The callback of a thread's writing script: `body` as it is for a thread without an owner.
-- `first` and `stride` find the records the call brings in its ARGV (owner.incoming), `ids` a
-- record's message id and otid after it from its record (0: the call brings no ids).
function owner.hooked(kind, first, stride, ids, body)
  local at = {first = first, stride = stride, ids = ids}
  return function(KEYS, ARGV)
    if not KEYS[15] then return body(KEYS, ARGV) end
    return owner.call(kind, at, body, KEYS, ARGV)
  end
end
