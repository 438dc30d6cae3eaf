-- Layout 1's remains, as the scripts read them: whether a thread holds layout-1 data (the legacy
-- hash, KEYS[9]) and the part of it not yet migrated. Its migration into layout 2 is
-- includes/layout1_migration.lua's.


-- Whether a thread whose meta `layout` reads `layout` (false or nil: none) holds layout-1 data:
-- a thread from before meta named its layout has only the legacy hash.
local function holds_legacy(keys, layout)
  if layout == '1' then return true end
  return not layout and redis.call('EXISTS', keys.legacy) == 1
end

-- The part of a layout-1 thread's legacy hash not yet migrated: its first and last sequences
-- (0, 0 for none), and the thread's last sequence raised to the range's end. `migrated` and
-- `legacy_last` are meta's fields as read. Until the scan (includes/layout1_migration.lua) has found the
-- legacy range, meta's last_seq may lag the hash: the range then reaches at least the hash's
-- field count (`field_count` when the caller read it, else read here; a hole reads as nothing).
local function legacy_range(keys, migrated, legacy_last, last_seq, field_count)
  local first = tonumber(migrated or '0') + 1
  local last = tonumber(legacy_last or '') or math.max(last_seq, field_count or redis.call('HLEN', keys.legacy))
  local legacy_first, legacy_end = 0, 0
  if last >= first then legacy_first, legacy_end = first, last end
  return legacy_first, legacy_end, math.max(last, last_seq)
end

-- Whether the thread is stored in layout 1 (wholly or in part).
local function is_layout_1(keys)
  return holds_legacy(keys, redis.call('HGET', keys.meta, 'layout'))
end

-- Whether the legacy hash exists, whatever meta says.
local function legacy_exists(keys)
  return redis.call('EXISTS', keys.legacy) == 1
end

-- How many fields the legacy hash has (messages not yet migrated, and any other field).
local function legacy_fields(keys)
  return redis.call('HLEN', keys.legacy)
end
