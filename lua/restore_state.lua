#!lua
--- Ends a restore: sets the thread's state as its backup recorded it, once every message of the
--- backup is restored (lua/restore.lua).
---
--- KEYS[1..12]  the thread's keys (includes/thread.lua: thread_keys; docs/LAYOUT.md)
--- ARGV[1..9]   limits (int): includes/thread.lua, read_limits
--- ARGV[10]     limits key (str): ARGV[1..9] joined by ':', then the event limits
--- ARGV[11]     last_seq (int): the last sequence the backed-up thread had assigned
--- ARGV[12]     summary_last (int): the last sequence the context summary covers; 0 for none
--- ARGV[13]     summary_seq (int): the context summary's own sequence; 0 for none
--- ARGV[14]     deleted_before (int): every sequence below it was deleted; 0 for none
--- ARGV[15]     turn_id (str): the turn reply sequence's turn; '' for none
--- ARGV[16]     turn_seq (int): where its replies start; 0 for none
--- ARGV[17]     turn_outcome (str): open, or its outcome; '' for none
--- ARGV[18]     count (int): the turn records that follow
--- ARGV[19..]   ARGV[18] times: turn id (str), start (int), outcome (str), replies (int),
---              first (int), result count (int), result first_seq (int), result last_seq (int)
--- then         fork_of (str): the thread this one was forked from; '' (or absent) for none
---              fork_at (int): the sequence of the fork point; 0 (or absent) for none
---              last (int): 1 (or absent) for the restore's last call, 0 for one with more turn
---              records to follow
---
--- Only the last call finishes the restore: it clears the `restoring` mark (lua/restore.lua) and
--- writes fork_of/fork_at (a fork found with them is finished). An earlier call sets the mark,
--- so that a restore stopped between two calls is neither served for writes nor taken as done.
--- Each turn keeps the ranges its restored messages gave it and takes its reply start, reply
--- count and recorded result from the backup. Sent again it writes the same values. A thread
--- holding sequences past last_seq is refused (KVS_RESTORE_CONFLICT) and nothing is written. A
--- finished turn with no restored message is listed for retention (includes/turns.lua, note_idle_turn).
---
--- Every number must be a whole number from 0, every outcome a word (includes/turns.lua,
--- TURN_HEADER): anything else is refused (KVS_BAD_BACKUP) before the first write, since a turn
--- header it cannot parse would be read back as an empty turn.
---
--- Reply: the number of turn records written
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_RESTORE_CONFLICT, KVS_BAD_BACKUP
--- @include "includes/thread"
--- @include "includes/turns"
--- @include "includes/expiry"
--- @include "includes/events"

local keys = thread_keys(KEYS)
local limits = read_limits(ARGV)
local last_seq = tonumber(ARGV[11])
local summary_last = tonumber(ARGV[12])
local summary_seq = tonumber(ARGV[13])
local deleted_before = tonumber(ARGV[14])
local turn_id = ARGV[15]
local turn_seq = tonumber(ARGV[16])
local turn_outcome = ARGV[17]
local count = tonumber(ARGV[18])
local fork_of = ARGV[19 + count * 8] or ''
local fork_at = ARGV[20 + count * 8] or '0'
local last = (ARGV[21 + count * 8] or '1') ~= '0'

local function bad_backup(what, value)
  return redis.error_reply('KVS_BAD_BACKUP ' .. what .. ' ' .. tostring(value) .. ' is not one a backup holds')
end
for at = 11, 18 do
  if at ~= 15 and at ~= 17 and not string.match(ARGV[at], '^%d+$') then return bad_backup('number', ARGV[at]) end
end
if turn_id ~= '' and not string.match(turn_outcome, '^%a+$') then return bad_backup('turn_outcome', turn_outcome) end
if not string.match(fork_at, '^%d+$') then return bad_backup('fork_at', fork_at) end
for i = 1, count do
  local base = 18 + (i - 1) * 8
  if ARGV[base + 1] == nil or ARGV[base + 1] == '' then return bad_backup('turn id', ARGV[base + 1]) end
  if not string.match(ARGV[base + 3], '^%a+$') then return bad_backup('outcome', ARGV[base + 3]) end
  for _, at in ipairs({2, 4, 5, 6, 7, 8}) do
    if not string.match(ARGV[base + at], '^%d+$') then return bad_backup('number', ARGV[base + at]) end
  end
end

local err = check_thread(keys, true)
if err then return err end
local current = redis.call('HMGET', keys.meta, 'layout', 'last_seq')
if current[1] == '1' or redis.call('EXISTS', keys.legacy) == 1 then
  return redis.error_reply('KVS_LAYOUT thread is stored in layout 1, a restore writes into layout 2 only')
end
if tonumber(current[2] or '0') > last_seq then
  return redis.error_reply(string.format('KVS_RESTORE_CONFLICT the thread holds sequences up to %s, past the backup\'s %d',
    current[2], last_seq))
end

begin_expiry(keys, limits.ttl_ms)
local fields = {'layout', '2', 'last_seq', last_seq}
if summary_last > 0 then
  fields[#fields + 1] = 'summary_last'; fields[#fields + 1] = summary_last
  fields[#fields + 1] = 'summary_seq'; fields[#fields + 1] = summary_seq
end
if deleted_before > 0 then
  fields[#fields + 1] = 'deleted_before'; fields[#fields + 1] = deleted_before
end
if turn_id ~= '' then
  fields[#fields + 1] = 'turn_id'; fields[#fields + 1] = turn_id
  fields[#fields + 1] = 'turn_seq'; fields[#fields + 1] = turn_seq
  fields[#fields + 1] = 'turn_outcome'; fields[#fields + 1] = turn_outcome
end
if not last then
  fields[#fields + 1] = 'restoring'; fields[#fields + 1] = '1'
elseif fork_of ~= '' then
  fields[#fields + 1] = 'fork_of'; fields[#fields + 1] = fork_of
  fields[#fields + 1] = 'fork_at'; fields[#fields + 1] = fork_at
end
if current[1] == nil then begin_incarnation(keys) end  -- a new thread (includes/events.lua)
redis.call('HSET', keys.meta, unpack(fields))
if last then redis.call('HDEL', keys.meta, 'restoring') end
for i = 1, count do
  local base = 18 + (i - 1) * 8
  local id = ARGV[base + 1]
  local stored = read_turn(keys, id)
  local turn = stored or new_turn()
  turn.start, turn.outcome = tonumber(ARGV[base + 2]), ARGV[base + 3]
  turn.replies, turn.first = tonumber(ARGV[base + 4]), tonumber(ARGV[base + 5])
  turn.count, turn.first_seq, turn.last_seq = tonumber(ARGV[base + 6]), tonumber(ARGV[base + 7]), tonumber(ARGV[base + 8])
  write_turn(keys, id, turn)
  -- A finished turn none of whose messages was restored sits in no chunk retention deletes: it
  -- is listed for retention as finish_turn lists it (once: a call sent again finds it stored).
  if not stored and turn.kept == 0 and turn.outcome ~= 'open' and limits.retained_limit >= 0 then
    note_idle_turn(keys, id)
  end
end
apply_expiry(keys)
return count
