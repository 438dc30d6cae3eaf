--- @include "includes/numbers"
-- The thread's event stream (docs/LAYOUT.md, "Events"): one entry per change, added by the
-- writing script in the same atomic step as the change, read by thread.watch().
--
-- Entry id "<n>-<s>": n counts the thread's events (meta `events`: 1, 2, 3, ... with no gap),
-- s is the thread's last sequence once the change is made. An id names one event for as long as
-- the thread lives; a reader that saw event n knows the next is n + 1, so a missing one (the
-- stream trimmed past it, or expired) is seen, and s says where to page the stored messages from.
-- When meta lost the count while the stream stayed (an interrupted delete tombstones meta first)
-- the count goes on from the stream's last id, since a stream only takes increasing ids.
--
-- Fields (each optional but k): k kind, a / b a sequence range, t turn id, i message ids joined
-- by ' ', o outcome, n a count, l a lease, d a delta (bytes, as the client sent it), g the
-- thread's incarnation (meta `born`; absent on a thread made before incarnations were kept).
--
-- A thread's incarnation names it among the threads that had its id: deleted (or expired) and
-- written again, the id holds a new thread whose event count starts again, so a count alone
-- cannot tell a watcher which thread an event is of. It is the server's time in microseconds
-- when the thread was made (two threads of one id are made at least a delete apart), set by the
-- thread's first event, or by the restore that fills it (restore, restore_state).
--
-- The stream holds about the newest limits.events_len entries (XADD MAXLEN ~, trimmed in whole
-- nodes). A thread with a ttl gives it its own deadline (includes/expiry.lua: apply_expiry, which
-- every writing script runs after this), so it expires with the thread; without one, it expires
-- 1 to 1.5 limits.events_age_ms after its last event. events_len 0: no events.

-- Gives a new thread its incarnation (a thread that has one keeps it).
local function begin_incarnation(keys)
  local now = redis.call('TIME')
  redis.call('HSETNX', keys.meta, 'born', now[1] .. string.rep('0', 6 - #now[2]) .. now[2])
end

-- Returns the event's id (false when events are off). `born`: the incarnation when the caller
-- read meta already (false for none), else nil and it is read here.
local function emit_event(keys, limits, last_seq, fields, born)
  if limits.events_len <= 0 then return false end
  local n = redis.call('HINCRBY', keys.meta, 'events', 1)
  if n == 1 then
    begin_incarnation(keys)
    born = nil
    local newest = redis.call('XREVRANGE', keys.events, '+', '-', 'COUNT', 1)[1]
    if newest then
      n = tonumber(string.match(newest[1], '^(%d+)')) + 1
      redis.call('HSET', keys.meta, 'events', n)
    end
  end
  last_seq = last_seq or tonumber(redis.call('HGET', keys.meta, 'last_seq') or '0')
  -- pcall: a key of another type in the stream's place must not fail a call that has written
  -- (the change stands; its watchers see the gap and page).
  local id = fmt(n) .. '-' .. fmt(last_seq)
  if born == nil then born = redis.call('HGET', keys.meta, 'born') end
  if born then
    fields[#fields + 1] = 'g'
    fields[#fields + 1] = born
  end
  redis.pcall('XADD', keys.events, 'MAXLEN', '~', limits.events_len, id, unpack(fields))
  if limits.ttl_ms <= 0 then
    -- As for a thread's ttl (includes/expiry.lua): a PTTL on most calls, a PEXPIRE of 1.5 age
    -- only when less than the age is left, so it expires 1 to 1.5 age after the last event.
    local age = limits.events_age_ms
    if redis.call('PTTL', keys.events) < age then
      redis.pcall('PEXPIRE', keys.events, age + math.floor(age / 2))
    end
  end
  return id
end
