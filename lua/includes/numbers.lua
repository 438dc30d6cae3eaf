-- Numbers as the scripts write and bound them, in every layout: a number's text, the bounds a
-- thread's sums keep, and the token count of what was stored without one.

-- A number as the decimal integer it holds, for every number written as text into a key, a
-- field, a member or a reply. Lua 5.1 numbers are doubles: tostring and '..' write %.14g
-- (10^14 and up as 1e+14), and string.format('%d') goes through the platform's C long. '%.0f'
-- writes every integer a double holds exactly (to 2^53) as its digits, everywhere; the client
-- keeps every number the scripts take below that (kvstore/_engine/bounds.py). Numbers passed
-- to redis.call as they are, the server writes itself, as digits to 2^53 too. The negation of 0
-- is -0, which both write as "-0", and Redis takes no "-0" for an integer (Valkey does): a count
-- taken away is written `0 - n`, never `-n` (tests/offline/test_lua_source.py).
local function fmt(n)
  return string.format('%.0f', n)
end

-- Bounds the scripts keep themselves, since a thread's sums grow write by write: a write past
-- them is refused before anything is written (kvstore/_engine/bounds.py: MAX_SEQUENCE,
-- MAX_THREAD_TOKENS).
local MAX_SEQUENCE = 2 ^ 50
local MAX_THREAD_TOKENS = 2 ^ 52

-- The documented count of what was stored without one: a token per 4 record bytes, rounded up.
local function bytes_tokens(bytes)
  return math.ceil(bytes / 4)
end

