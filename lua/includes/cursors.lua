-- Paging cursors: a sequence, or a message id resolved through the ids map.

-- The sequence a cursor names, or nil for none; an id no stored message has is an error reply,
-- KVS_CURSOR_EXPIRED when retention has deleted messages (it may have been one of them).
local function resolve_cursor(ids_key, kind, value, deleted_before)
  if kind == 'seq' then return tonumber(value) end
  if kind ~= 'id' then return nil end
  local sequence = redis.call('HGET', ids_key, value)
  if sequence then return tonumber(sequence) end
  if deleted_before > 0 then
    return nil, redis.error_reply(string.format(
      'KVS_CURSOR_EXPIRED %.0f no stored message has id %s; retention deleted every message before sequence %.0f: page on from a sequence (page.next_cursor) instead',
      deleted_before, value, deleted_before))
  end
  return nil, redis.error_reply('KVS_CURSOR_NOT_FOUND no stored message has id ' .. value)
end
