#!lua
--- A page of an owner's threads, newest activity (or newest made) first: the sidebar's read
--- (docs/OWNERS.md). Its cost is the page's, whatever the number of threads: a range of the
--- owner's index from the cursor, and the listed threads' info and counts by one HMGET each.
--- A listed thread whose keys expired (its recorded deadline passed and its meta is gone) leaves
--- the directory here, with its counts: that is the one write this script makes.
---
--- KEYS[1..4]  the owner's keys: recent, created, info, usage (includes/owner.lua)
--- ARGV order (str: 'recent' | 'created')
--- ARGV after_score (str): the cursor's score, '' for the first page
--- ARGV after_id (str): the cursor's thread id ('' for the first page)
--- ARGV limit (int): the most threads in the page
--- ARGV where_key (str): a metadata key the threads must have with where_value, '' for none
--- ARGV where_value (str)
--- ARGV max_examined (int): the most threads one call looks at (a filtered page may come
---      back short, with a cursor to go on from)
---
--- Reply: {next_score, next_id, id_1, activity_1, created_1, info_1, record_1, ...}: next_score
---        '' when the listing is done; info '' for none; record the thread's
---        "messages:bytes:tokens:deadline"
--- Errors: KVS_WRONGTYPE (one of the owner's keys holds another type)
--- @include "includes/owner"

local dir = owner.keys(KEYS, 1)
local wrong = owner.wrong_type(dir, {'recent', 'created', 'info', 'usage'})
if wrong then return wrong end
local index, other = dir.recent, dir.created
if args.order == 'created' then index, other = dir.created, dir.recent end
local limit, cap = args.limit, args.max_examined
local now = owner.now_ms()

-- a < b in byte order, as a sorted set orders its members (Lua's '<' follows the locale).
local function bytes_before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

local page, ghosts = {}, {}
local examined, done = 0, false
local last_score, last_id = nil, nil

-- Looks at one batch of (id, score) pairs, in order; true once the page is full or the cap hit.
local function take(batch)
  local ids = {}
  for i = 1, #batch, 2 do ids[#ids + 1] = batch[i] end
  if #ids == 0 then return false end
  local infos = redis.call('HMGET', dir.info, unpack(ids))
  local fields = {}
  for i, id in ipairs(ids) do fields[i] = 't:' .. id end
  local records = redis.call('HMGET', dir.usage, unpack(fields))
  for i, id in ipairs(ids) do
    local score = batch[2 * i]
    examined, last_score, last_id = examined + 1, score, id
    local gone = not records[i] or owner.expired(dir, id, records[i], now)
    if gone then
      ghosts[#ghosts + 1] = id
    else
      local wanted = true
      if args.where_key ~= '' then
        local ok, info = pcall(cjson.decode, infos[i] or '{}')
        local metadata = ok and type(info) == 'table' and info.metadata
        wanted = type(metadata) == 'table' and metadata[args.where_key] == args.where_value
      end
      if wanted then
        page[#page + 1] = {id, score, infos[i] or '', records[i]}
        if #page >= limit then return true, i < #ids end
      end
    end
    if examined >= cap then return true, true end
  end
  return false
end

-- Whether the index holds a member from score `high` down to `low` past the first `offset`.
local function follows(high, low, offset)
  return #redis.call('ZRANGE', index, high, low, 'BYSCORE', 'REV', 'LIMIT', offset, 1) > 0
end

local BATCH = math.max(limit, 16)
local full = false
if args.after_score ~= '' then
  -- The rest of the cursor's score: its members after the cursor's id (byte order, descending).
  local offset = 0
  while not full do
    local batch = redis.call('ZRANGE', index, args.after_score, args.after_score, 'BYSCORE', 'REV',
                             'LIMIT', offset, BATCH, 'WITHSCORES')
    offset = offset + #batch / 2
    local kept = {}
    for i = 1, #batch, 2 do
      if bytes_before(batch[i], args.after_id) then
        kept[#kept + 1] = batch[i]
        kept[#kept + 1] = batch[i + 1]
      end
    end
    local more
    full, more = take(kept)
    -- A page filled in the cursor's own score ends the listing when nothing follows it, there
    -- (past a whole batch) or below (as the loop below decides for the scores after it).
    if full and not more
      and (#batch < 2 * BATCH or not follows(args.after_score, args.after_score, offset))
      and not follows('(' .. args.after_score, '-inf', 0) then
      done = true
    end
    if #batch < 2 * BATCH then break end
  end
end
local max = args.after_score ~= '' and '(' .. args.after_score or '+inf'
local offset = 0
while not full and not done do
  local batch = redis.call('ZRANGE', index, max, '-inf', 'BYSCORE', 'REV', 'LIMIT', offset, BATCH,
                           'WITHSCORES')
  offset = offset + #batch / 2
  local more
  full, more = take(batch)
  -- A page that ends with the index ends the listing: no cursor to an empty page. A batch
  -- shorter than asked for is the index's end; a whole one filling the page with its last
  -- thread is when nothing follows it.
  if not more and (#batch < 2 * BATCH or (full and not follows(max, '-inf', offset))) then
    done = true
  end
end

-- Expired threads leave the directory, with their counts.
for _, id in ipairs(ghosts) do owner.forget(dir, id) end

local reply = {'', ''}
if not done and last_score then
  -- Go on after the last thread listed, or the last one looked at when the page is short.
  local cursor = page[#page]
  if #page < limit or not cursor then cursor = {last_id, last_score} end
  reply = {cursor[2], cursor[1]}
end
if #page > 0 then
  local ids = {}
  for i, item in ipairs(page) do ids[i] = item[1] end
  local others = redis.call('ZMSCORE', other, unpack(ids))
  for i, item in ipairs(page) do
    local activity, created = item[2], others[i] or ''
    if index == dir.created then activity, created = created, item[2] end
    local n = #reply
    reply[n + 1], reply[n + 2], reply[n + 3] = item[1], activity, created
    reply[n + 4], reply[n + 5] = item[3], item[4]
  end
end
return reply
