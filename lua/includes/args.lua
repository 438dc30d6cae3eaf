-- What the prologue that names a script's arguments needs (kvstore/_engine/script_args.py writes
-- that prologue from the script's header: `local args = {...}`).

-- The store's limits, in this order, as one argument: their values joined by ':' (the limits'
-- key; kvstore/_engine/script_args.py: LIMIT_NAMES, the same list).
-- window_size, chunk_size, chunk_max_bytes, max_move_chunks, max_move_bytes, max_message_bytes,
-- max_media, retained_limit (-1 keeps all), ttl_ms (0: none), events_len (0: no events),
-- events_age_ms, strict_history (1: strict history checks, 0: off; includes/history.lua),
-- turn_lease_ms (how long a held turn's lease lasts unrenewed; includes/turns.lua).
local LIMIT_NAMES = {
  'window_size', 'chunk_size', 'chunk_max_bytes', 'max_move_chunks', 'max_move_bytes',
  'max_message_bytes', 'max_media', 'retained_limit', 'ttl_ms', 'events_len', 'events_age_ms',
  'strict_history', 'turn_lease_ms',
}
local LIMIT_COUNT = #LIMIT_NAMES

-- A store sends the same limits on every call, and parsing a dozen numbers is a good part of a
-- small call's Lua time. A library's functions keep this table between calls (a script's is new
-- on every call), so a store's limits are parsed once; the tables handed out are never written
-- to. One argument instead of the thirteen values and their key: every argument costs the client
-- its packing and the server a Lua string.
local LIMITS_BY_KEY, LIMITS_KEPT, LIMITS_KEEP_AT_MOST = {}, 0, 64

-- The limits named by the key at ARGV[at], as a table by name. A key that is not thirteen numbers
-- is refused before anything is read (no kvstore client sends one).
local function read_limits(ARGV, at)
  local key = ARGV[at]
  local limits = LIMITS_BY_KEY[key]
  if limits then return limits end
  limits = {}
  local count = 0
  for value in string.gmatch(key, '[^:]+') do
    count = count + 1
    limits[LIMIT_NAMES[count] or count] = tonumber(value)
  end
  for i = 1, LIMIT_COUNT do
    if count ~= LIMIT_COUNT or not limits[LIMIT_NAMES[i]] then
      error('the limits argument must be ' .. LIMIT_COUNT .. " numbers joined by ':'")
    end
  end
  limits.strict_history = limits.strict_history == 1
  if LIMITS_KEPT >= LIMITS_KEEP_AT_MOST then LIMITS_BY_KEY, LIMITS_KEPT = {}, 0 end
  LIMITS_BY_KEY[key] = limits
  LIMITS_KEPT = LIMITS_KEPT + 1
  return limits
end
