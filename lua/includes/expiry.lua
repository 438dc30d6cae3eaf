-- Idle expiry (thread_ttl). Every key of a thread shares one deadline, kept in meta
-- `expire_at`. A write that finds less than `ttl` left moves the deadline to now + 1.5 ttl and
-- sets it on every key (the fixed keys and every chunk): that costs one pass over the chunks per
-- half ttl, not per write. Each write also sets the deadline on the fixed keys, since a write may
-- have created one, and on the chunks it wrote.

-- Returns the deadline this call's writes must carry (0 when the thread has no ttl), and
-- whether it moved.
local function expiry_deadline(keys, ttl_ms, now_ms)
  if ttl_ms <= 0 then return 0, false end
  local deadline = tonumber(redis.call('HGET', keys.meta, 'expire_at') or '0')
  if now_ms + ttl_ms <= deadline then return deadline, false end
  return now_ms + ttl_ms + math.floor(ttl_ms / 2), true
end

local function apply_expiry(keys, deadline, moved)
  if deadline <= 0 then return end
  redis.call('HSET', keys.meta, 'expire_at', fmt(deadline))
  for _, key in ipairs({keys.meta, keys.window, keys.window_side, keys.chunk_index, keys.large_index,
                        keys.ids, keys.otids, keys.turns, keys.legacy}) do
    redis.call('PEXPIREAT', key, deadline)
  end
  if moved then
    for _, index in ipairs({keys.chunk_index, keys.large_index}) do
      local firsts = redis.call('ZRANGE', index, 0, -1, 'WITHSCORES')
      for i = 2, #firsts, 2 do
        redis.call('PEXPIREAT', keys.chunk_prefix .. firsts[i], deadline)
      end
    end
  end
end

-- A chunk written by this call gets the thread's deadline at once.
local function expire_new_chunk(keys, chunk_key)
  if keys.deadline and keys.deadline > 0 then
    redis.call('PEXPIREAT', chunk_key, keys.deadline)
  end
end
