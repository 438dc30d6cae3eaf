--- @include "includes/numbers"
-- The thread's event stream (docs/LAYOUT.md, "Events"): one entry per change, added by the
-- writing script in the same atomic step as the change, read by thread.watch().
--
-- Entry id "<n>-<s>": n counts the thread's events (meta `events`: 1, 2, 3, ... with no gap;
-- append counts it in its own write of meta, count_event, the other calls by HINCRBY),
-- s is the thread's last sequence once the change is made. An id names one event for as long as
-- the thread lives; a reader that saw event n knows the next is n + 1, so a missing one (the
-- stream trimmed past it, or expired) is seen, and s says where to page the stored messages from.
-- When meta lost the count while the stream stayed (an interrupted delete tombstones meta first)
-- the count goes on from the stream's last id, since a stream only takes increasing ids.
--
-- Fields: k kind, a / b a sequence range, t turn id (these four on every event, in this order,
-- '' where the kind has none), then the kind's own: o outcome, n a count, r a count left, l a
-- lease, d a delta (bytes, as the client sent it), i a message id (replaced); each left out when
-- 0 or '' (a reader takes a missing field for that), last g the thread's incarnation (meta
-- `born`; absent on a thread made before incarnations were kept). An added event names its
-- messages by their sequences only (a watcher reads their ids with them). One field list for
-- the common events (added, turn_started without a lease, compacted) lets the stream store
-- them as values only, its entries sharing the field names of their node's first entry
-- (written before this version: i message ids on added and compacted; fields in other orders).
--
-- A thread's incarnation names it among the threads that had its id: deleted (or expired) and
-- written again, the id holds a new thread whose event count starts again, so a count alone
-- cannot tell a watcher which thread an event is of. It is the server's time in microseconds
-- when the thread was made (two threads of one id are made at least a delete apart), set by the
-- thread's first event, or by the restore that fills it (restore, restore_state).
--
-- The stream holds about the newest limits.events_len entries (XADD MAXLEN ~, trimmed in whole
-- nodes), and none older than the oldest message the thread keeps: retention (includes/
-- layout2_retention.lua) drops the events made before it (trim_events). A thread with a ttl gives it its own deadline (includes/expiry.lua: apply_expiry, which
-- every writing script runs after this), so it expires with the thread; without one, it expires
-- 1 to 1.5 limits.events_age_ms after its last event. events_len 0: no events.

-- Gives a new thread its incarnation (a thread that has one keeps it).
local function begin_incarnation(keys)
  local now = redis.call('TIME')
  redis.call('HSETNX', keys.meta, 'born', now[1] .. string.rep('0', 6 - #now[2]) .. now[2])
end

-- How many events the stream keeps at least: events_len, and with retention no more than the
-- messages it keeps (retained_limit; at least 1, so that the newest event stays). A call whose
-- limits name no retention (delete's) keeps events_len.
local function events_cap(limits)
  local retained = limits.retained_limit or -1
  if retained >= 0 and retained < limits.events_len then return math.max(retained, 1) end
  return limits.events_len
end

-- An event's fields: the four every event has, then the kind's own name, value pairs, each
-- left out when its value is 0 or ''.
local function event_fields(kind, a, b, turn_id, ...)
  local fields = {'k', kind, 'a', a, 'b', b, 't', turn_id}
  local extra = {...}
  for i = 1, #extra, 2 do
    local value = extra[i + 1]
    if value ~= 0 and value ~= '' then
      fields[#fields + 1] = extra[i]
      fields[#fields + 1] = value
    end
  end
  return fields
end

-- Counts the event a call will make in the call's own write of meta: meta.events (as read)
-- becomes the event's number, which the caller writes with its other meta fields (meta.
-- events_counted says so) and hands to emit_event. Nil for a thread that counted no event yet
-- (or with events off): emit_event counts it then.
local function count_event(meta, limits)
  if limits.events_len <= 0 or (meta.events or 0) <= 0 then return nil end
  meta.events, meta.events_counted = meta.events + 1, true
  return meta.events
end

-- Returns the event's id (false when events are off). `born`: the incarnation when the caller
-- read meta already (false for none), else nil and it is read here. `counted`: the event's
-- number when the caller wrote it to meta already (count_event), else nil and it is counted
-- here. `own_deadline`: the caller sets no deadline after the event (the direct append on a
-- thread with a ttl), so a stream the event makes gets meta's here.
local function emit_event(keys, limits, last_seq, fields, born, counted, own_deadline)
  if limits.events_len <= 0 then return false end
  local n = counted or redis.call('HINCRBY', keys.meta, 'events', 1)
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
  if own_deadline then
    -- The stream is there (it carries meta's deadline) but for a thread whose stream expired
    -- before it had a ttl, or whose keys a store without a ttl wrote in between.
    local added = redis.pcall('XADD', keys.events, 'NOMKSTREAM', 'MAXLEN', '~', events_cap(limits), id, unpack(fields))
    if added == false then
      redis.pcall('XADD', keys.events, 'MAXLEN', '~', events_cap(limits), id, unpack(fields))
      redis.call('PEXPIREAT', keys.events, redis.call('PEXPIRETIME', keys.meta))
    end
  else
    redis.pcall('XADD', keys.events, 'MAXLEN', '~', events_cap(limits), id, unpack(fields))
  end
  if limits.ttl_ms <= 0 then
    -- As for a thread's ttl (includes/expiry.lua): a PTTL on most calls, a PEXPIRE of 1.5 age
    -- only when less than the age is left, so it expires 1 to 1.5 age after the last event.
    local age = limits.events_age_ms
    if keys.deadline and keys.deadline > 0 then
      -- A thread with a deadline another store's ttl set keeps its stream to it (begin_expiry).
      redis.pcall('PEXPIREAT', keys.events, keys.deadline)
    elseif redis.call('PTTL', keys.events) < age then
      redis.pcall('PEXPIRE', keys.events, age + math.floor(age / 2))
    end
  end
  return id
end

-- The first event, at or after event `from`, as (n, s); nil when there is none.
local function event_at(keys, from)
  local entry = redis.call('XRANGE', keys.events, fmt(from), '+', 'COUNT', 1)[1]
  if not entry then return nil end
  local n, s = string.match(entry[1], '^(%d+)-(%d+)$')
  return tonumber(n), tonumber(s)
end

-- Drops the events made before sequence `before` was stored (their last sequence s is below
-- it): retention deleted every message they name, so a watcher that had not read them pages
-- what the thread still keeps. An event's s grows with its n, so they are the stream's oldest:
-- a binary search by n (XRANGE COUNT 1, about log2 of the stream's length) finds the first one
-- kept, and XTRIM MINID drops the others. A key of another type in the stream's place is left
-- alone (emit_event skips it too).
local function trim_events(keys, before)
  if redis.call('TYPE', keys.events).ok ~= 'stream' then return end
  local low, low_s = event_at(keys, 0)
  if not low or low_s >= before then return end
  local newest = redis.call('XREVRANGE', keys.events, '+', '-', 'COUNT', 1)[1]
  local high = tonumber(string.match(newest[1], '^(%d+)'))
  if tonumber(string.match(newest[1], '-(%d+)$')) < before then
    high = high + 1  -- every event goes
  else
    -- The first event at or after `high` is kept, the first at or after `low` is not.
    while high - low > 1 do
      local middle = math.floor((low + high) / 2)
      local _, s = event_at(keys, middle)
      if s >= before then high = middle else low = middle end
    end
  end
  redis.call('XTRIM', keys.events, 'MINID', fmt(high))
end
