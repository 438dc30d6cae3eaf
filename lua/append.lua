#!lua
--- Appends a batch of messages to a thread in one atomic step.
---
--- KEYS[1..14]  the thread's keys (includes/layout.lua: thread_keys; docs/LAYOUT.md)
--- ARGV limits (limits): the store's limits (includes/args.lua: read_limits)
--- ARGV turn_id (str): '' for none
--- ARGV lease (int): the caller's lease of the turn (start_turn 'hold'), 0 for none: renewed by
---      the call; refused once another holds the turn or once the lease ended (the turn is then
---      finished as 'abandoned')
--- ARGV pairs (str): what each message opens and answers, with strict history checks
---      (includes/history.lua: read_batch_pairs); '' when none does, and without them
--- ARGV messages[] id (str), otid (str): '' for none, media (int): the message's inline
---      media bytes, tokens (int): its token count, record (bytes)
---
--- A new message of a finished turn is refused (KVS_TURN_FINISHED); a replay is not.
---
--- Reply: {1, first_sequence}          the batch was stored at first..first+count-1
---        {0, seq_1, id_1, ..., seq_count, id_count}   every message was already stored (a
---                                     replay); an id is '' where no side info names it
--- Errors: KVS_WRONGTYPE, KVS_LAYOUT, KVS_DELETING, KVS_RESTORING, KVS_MIGRATING, KVS_TOO_LARGE, KVS_MEDIA_OVER,
---         KVS_OTID_CONFLICT, KVS_OTID_REPEATED, KVS_DUPLICATE_ID, KVS_ID_REPEATED,
---         KVS_TURN_FINISHED, KVS_TURN_FENCED, KVS_HISTORY,
---         KVS_QUOTA, KVS_QUOTA_BYTES, KVS_OWNER_ERASING (an owned thread: includes/owner.lua)
--- @include "includes/layout"
--- @include "includes/thread"
--- @include "includes/events"
--- @include "includes/turns"
--- @include "includes/expiry"
--- @include "includes/history"
--- @include "includes/layout3_store"
--- @include "includes/layout1_migration"
--- @include "includes/layout2_retention"
--- @include "includes/turn_finish"
--- @include "includes/append_direct"
--- @first append_direct

-- The common case went straight through before the prologue (`@first`: append_direct, which
-- writes nothing when the batch needs this general path).
local keys = thread_keys(KEYS)
local limits = args.limits

local batch = read_batch(args.messages, args.turn_id, args.lease)
read_batch_pairs(args.pairs, batch, limits)

local meta, failure = load_meta(keys)
local plan
if not failure then plan, failure = check_store_keys(keys, batch, limits, meta) end
failure = failure or check_batch(keys, batch, limits, meta)
if type(failure) == 'table' and failure[1] == 0 and batch.lease then
  -- A replay under a lease keeps it as any append under it does (a take-over catching up
  -- re-sends what the turn stored): renewed while it is the open turn's, live lease.
  renew_on_replay(keys, batch, limits)
end
failure = failure or check_turn(keys, batch, meta, limits) or check_history(keys, batch, limits, meta)
if not failure and meta.layout ~= CURRENT_LAYOUT then failure = check_migration(keys) end
if failure then
  if batch.lease_ended then
    -- The lease ended before this call: the turn is finished as abandoned, and the call refused.
    begin_expiry(keys, limits.ttl_ms)
    finish_open_turn(keys, limits, batch.turn_id, nil, 'abandoned')
    apply_expiry(keys)
  end
  return failure
end

begin_expiry(keys, limits.ttl_ms)
meta = migrate_first(keys, limits, meta)
local counted = count_event(meta, limits)
local first, closed, refused = store_batch(keys, batch, limits, meta, plan)
if refused then return refused end
apply_history(keys, batch, first)
if closed > 0 then
  -- A new chunk may make the oldest one deletable: retention keeps the thread bounded.
  retain(keys, limits.retained_limit, limits.max_move_chunks)
end
emit_event(keys, limits, first + #batch.ids - 1, event_fields('added', first, first + #batch.ids - 1, batch.turn_id), meta.born, counted)
apply_expiry(keys)
return {1, first}
