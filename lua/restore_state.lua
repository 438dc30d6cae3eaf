#!lua
--- Ends a restore: sets the thread's state as its backup recorded it, once every message of the
--- backup is restored (lua/restore.lua).
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV limits (limits): the store's limits (includes/args.lua: read_limits)
--- ARGV last_seq (int): the last sequence the backed-up thread had assigned
--- ARGV summary_last (int): the last sequence the context summary covers; 0 for none
--- ARGV summary_seq (int): the context summary's own sequence; 0 for none
--- ARGV deleted_before (int): every sequence below it was deleted; 0 for none
--- ARGV turn_id (str): the turn reply sequence's turn; '' for none
--- ARGV turn_seq (int): where its replies start; 0 for none
--- ARGV turn_outcome (str): open, or its outcome; '' for none
--- ARGV fork_of (str): the thread this one was forked from; '' for none
--- ARGV fork_at (int): the sequence of the fork point; 0 for none
--- ARGV last (int): 1 for the restore's last call, 0 for one with more turn records to follow
--- ARGV born (str): '' for none; the incarnation (meta `born`) the restore wrote: a fork's copy,
---      or an import's
--- ARGV prompt_state (str): the kept system prompt's run (meta `prompt`: 'open' | 'closed'), ''
---      for none; sent with the last call only
--- ARGV prompt_index (str): its messages as "sequence:tokens:bytes" joined by ',', '' for none
--- ARGV prompt_records (bytes): their records, concatenated in that order
--- ARGV turns[] id (str), start (int), outcome (str), replies (int), first (int),
---      count (int): the result's, first_seq (int), last_seq (int)
---
--- An import's call into a thread that exists and is not mid-restore writes nothing and replies
--- 0: its restore was finished before (every run a replay), and the turns and state the thread
--- has moved to since stay as they are.
--- Only the last call finishes the restore: it clears the `restoring` mark and a fork's
--- `fork_source` (lua/restore.lua), and
--- writes fork_of/fork_at (a fork found with them is finished). An earlier call sets the mark,
--- so that a restore stopped between two calls is neither served for writes nor taken as done.
--- Each turn keeps the ranges its restored messages gave it and takes its reply start, reply
--- count and recorded result from the backup. Sent again it writes the same values. A thread
--- holding sequences past last_seq is refused (KVS_RESTORE_CONFLICT) and nothing is written, and
--- so is a thread that is not the incarnation `born` (for a fork: mid-restore, or finished as
--- this fork): an import or a fork whose thread was deleted or erased under it is never marked
--- finished. A
--- finished turn with no restored message is listed for retention (includes/turns.lua, note_idle_turn).
---
--- Every number must be a whole number from 0, every outcome a word (includes/turns.lua,
--- TURN_HEADER): anything else is refused (KVS_BAD_BACKUP) before the first write, since a turn
--- header it cannot parse would be read back as an empty turn. The same for a kept prompt
--- (includes/prompt.lua) that is not at most PROMPT_LIMIT messages below deleted_before, in
--- order, whose bytes frame its records exactly.
---
--- Reply: the number of turn records written
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_RESTORE_CONFLICT, KVS_BAD_BACKUP,
---         KVS_QUOTA, KVS_QUOTA_BYTES, KVS_OWNER_ERASING (an owned thread: includes/owner.lua)
--- @include "includes/layout"
--- @include "includes/turns"
--- @include "includes/expiry"
--- @include "includes/events"
--- @include "includes/layout1"
--- @include "includes/prompt"
--- @include "includes/layout2_format"

local keys = thread_keys(KEYS)
local limits = args.limits
local last_seq, summary_last, summary_seq = args.last_seq, args.summary_last, args.summary_seq
local deleted_before = args.deleted_before
local turn_id, turn_seq, turn_outcome = args.turn_id, args.turn_seq, args.turn_outcome
local fork_of, fork_at, last = args.fork_of, args.fork_at, args.last ~= 0
local turns = args.turns

local function bad_backup(what, value)
  return redis.error_reply('KVS_BAD_BACKUP ' .. what .. ' ' .. tostring(value) .. ' is not one a backup holds')
end
-- A whole number from 0 (an int argument is a number, or nil when what was sent is none).
local function whole(value)
  return value ~= nil and value >= 0 and value == math.floor(value)
end
for _, number in ipairs({'last_seq', 'summary_last', 'summary_seq', 'deleted_before', 'turn_seq', 'fork_at'}) do
  if not whole(args[number]) then return bad_backup('number', args[number]) end
end
if turn_id ~= '' and not string.match(turn_outcome, '^%a+$') then return bad_backup('turn_outcome', turn_outcome) end
for i = 1, turns.n do
  if turns.id[i] == '' then return bad_backup('turn id', turns.id[i]) end
  if not string.match(turns.outcome[i], '^%a+$') then return bad_backup('outcome', turns.outcome[i]) end
  for _, number in ipairs({'start', 'replies', 'first', 'count', 'first_seq', 'last_seq'}) do
    if not whole(turns[number][i]) then return bad_backup('number', turns[number][i]) end
  end
end

-- The kept prompt as its manifest lines (the side infos carry what a reader takes: the record's
-- bytes and its tokens).
local prompt_lines = {}
if args.prompt_state ~= '' then
  if args.prompt_state ~= 'open' and args.prompt_state ~= 'closed' then
    return bad_backup('prompt state', args.prompt_state)
  end
  local at, previous = 0, 0
  for entry in string.gmatch(args.prompt_index, '[^,]+') do
    local sequence, tokens, bytes = string.match(entry, '^(%d+):(%d+):(%d+)$')
    sequence = tonumber(sequence)
    if not sequence or sequence <= previous or sequence >= deleted_before or #prompt_lines >= prompt.LIMIT then
      return bad_backup('prompt entry', entry)
    end
    prompt_lines[#prompt_lines + 1] = manifest_line(sequence, side_info('', '', 0, tonumber(bytes), '', tonumber(tokens)))
    at, previous = at + tonumber(bytes), sequence
  end
  if at ~= #args.prompt_records then return bad_backup('prompt records of bytes', #args.prompt_records) end
end

local err = check_thread(keys, true)
if err then return err end
local current = redis.call('HMGET', keys.meta, 'layout', 'last_seq', 'born', 'restoring', 'fork_of', 'fork_at')
-- A call sent again after the last one finished the fork finds it finished as this fork.
local this_fork = current[5] == fork_of and tonumber(current[6]) == fork_at
local import = fork_of == ''
if args.born ~= '' and (current[3] ~= args.born or not (current[4] or this_fork or import)) then
  return redis.error_reply('KVS_RESTORE_CONFLICT the thread is not the import or fork in progress this call started: deleted, its owner erased or made again since its first step (run it again to start over)')
end
if current[1] == '1' or legacy_exists(keys) then
  return redis.error_reply('KVS_LAYOUT thread is stored in layout 1, a restore writes into layout 3 only')
end
if tonumber(current[2] or '0') > last_seq then
  return redis.error_reply(string.format('KVS_RESTORE_CONFLICT the thread holds sequences up to %s, past the backup\'s %d',
    current[2], last_seq))
end
if (args.born == '' or import) and current[2] and not current[4] then
  -- An import whose runs stored nothing into a thread not mid-restore: the restore was finished
  -- before (or the thread is the backup's own source); what the thread did since stays.
  return 0
end

begin_expiry(keys, limits.ttl_ms)
local fields = {'layout', CURRENT_LAYOUT, 'last_seq', last_seq}
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
if last then redis.call('HDEL', keys.meta, 'restoring', 'fork_source') end
if #prompt_lines > 0 then
  local manifest_key, data_key = keys.prompt_manifest, keys.prompt_data
  redis.call('SET', manifest_key, table.concat(prompt_lines))
  redis.call('SET', data_key, args.prompt_records)
  expire_new_chunk(keys, manifest_key)
  expire_new_chunk(keys, data_key)
end
if args.prompt_state ~= '' then redis.call('HSET', keys.meta, 'prompt', args.prompt_state) end
for i = 1, turns.n do
  local id = turns.id[i]
  local stored = read_turn(keys, id)
  local turn = stored or new_turn()
  turn.start, turn.outcome, turn.replies, turn.first = turns.start[i], turns.outcome[i], turns.replies[i], turns.first[i]
  turn.count, turn.first_seq, turn.last_seq = turns.count[i], turns.first_seq[i], turns.last_seq[i]
  write_turn(keys, id, turn)
  -- A finished turn none of whose messages was restored sits in no chunk retention deletes: it
  -- is listed for retention as finish_turn lists it (once: a call sent again finds it stored).
  if not stored and turn.kept == 0 and turn.outcome ~= 'open' and limits.retained_limit >= 0 then
    note_idle_turn(keys, id)
  end
end
apply_expiry(keys)
return turns.n
