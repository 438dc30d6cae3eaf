-- What the prologue that names a script's arguments needs (kvstore/_engine/script_args.py writes
-- that prologue from the script's header: `local args = {...}`).

-- The store's limits, in the order a script takes them, then their key: the values as sent,
-- joined by ':' (kvstore/_engine/script_args.py: LIMIT_NAMES, the same list).
-- window_size, chunk_size, chunk_max_bytes, max_move_chunks, max_move_bytes, max_message_bytes,
-- max_media, retained_limit (-1 keeps all), ttl_ms (0: none), events_len (0: no events),
-- events_age_ms, strict_history (1: strict history checks, 0: off; includes/history.lua).
local LIMIT_NAMES = {
  'window_size', 'chunk_size', 'chunk_max_bytes', 'max_move_chunks', 'max_move_bytes',
  'max_message_bytes', 'max_media', 'retained_limit', 'ttl_ms', 'events_len', 'events_age_ms',
  'strict_history',
}
local LIMIT_COUNT = #LIMIT_NAMES

-- A store sends the same limits on every call, and parsing a dozen numbers is a good part of a
-- small call's Lua time. A library's functions keep this table between calls (a script's is new
-- on every call), so a store's limits are parsed once: a key is remembered only when it names
-- exactly the values sent with it, and the tables handed out are never written to.
local LIMITS_BY_KEY, LIMITS_KEPT, LIMITS_KEEP_AT_MOST = {}, 0, 64

-- The limits that start at ARGV[at] (their key at ARGV[at + LIMIT_COUNT]), as a table by name.
local function read_limits(ARGV, at)
  local key = ARGV[at + LIMIT_COUNT]
  local limits = LIMITS_BY_KEY[key]
  if limits then return limits end
  limits = {}
  local sent = {}
  for i = 1, LIMIT_COUNT do
    sent[i] = ARGV[at + i - 1]
    limits[LIMIT_NAMES[i]] = tonumber(sent[i])
  end
  limits.strict_history = limits.strict_history == 1
  if key == table.concat(sent, ':') then
    if LIMITS_KEPT >= LIMITS_KEEP_AT_MOST then LIMITS_BY_KEY, LIMITS_KEPT = {}, 0 end
    LIMITS_BY_KEY[key] = limits
    LIMITS_KEPT = LIMITS_KEPT + 1
  end
  return limits
end
