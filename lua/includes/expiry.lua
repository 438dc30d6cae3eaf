--- @include "includes/layout"
-- Idle expiry (thread_ttl), on the server's clock: scripts never see a time. Every key of a
-- thread carries one absolute deadline, meta's. A write that finds less than `ttl` left on meta
-- (PTTL) sets 1.5 ttl on meta (PEXPIRE) and meta's new deadline (PEXPIRETIME) on every other
-- key, chunks of both kinds and the kept prompt included: one pass over the chunks per half ttl, not per write. Each
-- write also sets the deadline on the fixed keys (the open chunk's among them), since a write may
-- have created one, and on the chunks it wrote; a chunk closed by COPY carries the open chunk's. One absolute deadline, rather than a PEXPIRE per key, makes every key expire at the
-- same instant: Redis 7.0 does not freeze time inside a script, so relative expiries set along a
-- pass over many chunks would spread.

-- Starts a writing call's expiry: sets keys.deadline, the deadline this call's writes must carry
-- (0 when the thread has no ttl, or when it moves), and keys.ttl_moved, when the deadline moves,
-- the time to live apply_expiry sets (false otherwise). A store without a ttl neither sets nor
-- moves a deadline, but keeps the one a thread has: the keys it makes carry it too, or they
-- would outlive the thread's meta and stand in the way of its id's next thread.
local function begin_expiry(keys, ttl_ms)
  keys.deadline, keys.ttl_moved = 0, false
  if ttl_ms <= 0 then
    keys.deadline = math.max(redis.call('PEXPIRETIME', keys.meta), 0)
    return
  end
  if redis.call('PTTL', keys.meta) >= ttl_ms then
    keys.deadline = redis.call('PEXPIRETIME', keys.meta)
  else
    keys.ttl_moved = ttl_ms + math.floor(ttl_ms / 2)
  end
end

local function apply_expiry(keys)
  local deadline, moved = keys.deadline, keys.ttl_moved
  if moved then
    redis.call('PEXPIRE', keys.meta, moved)
    deadline = redis.call('PEXPIRETIME', keys.meta)
    -- Meta says it has a deadline (no store clears one): the direct append of a store without
    -- a ttl reads it with meta's other fields and gives the keys it makes the deadline only then
    -- ('0' says none; absent, that append asks the server once and writes the answer).
    redis.call('HSET', keys.meta, 'expires', '1')
  end
  if deadline <= 0 then return end
  for _, key in ipairs(fixed_keys(keys)) do
    redis.call('PEXPIREAT', key, deadline)
  end
  if moved then
    redis.call('PEXPIREAT', keys.prompt_manifest, deadline)
    redis.call('PEXPIREAT', keys.prompt_data, deadline)
    for _, index in ipairs(chunk_indexes(keys)) do
      local firsts = redis.call('ZRANGE', index, 0, -1, 'WITHSCORES')
      for i = 2, #firsts, 2 do
        -- A chunk is two layout-3 strings, or else one layout-2 hash.
        local chunk = chunk_key(keys, tonumber(firsts[i]))
        if redis.call('PEXPIREAT', chunk .. ':d', deadline) == 1 then
          redis.call('PEXPIREAT', chunk .. ':m', deadline)
        else
          redis.call('PEXPIREAT', chunk, deadline)
        end
      end
    end
  end
end

-- A chunk written by this call gets the thread's deadline at once (when the deadline moves, the
-- pass of apply_expiry sets it).
local function expire_new_chunk(keys, chunk)
  if keys.deadline and keys.deadline > 0 then
    redis.call('PEXPIREAT', chunk, keys.deadline)
  end
end
