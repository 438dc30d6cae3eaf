-- Preconditions shared by the writing scripts. They run before the first write, because a Lua
-- error after a write does not roll the write back.

-- Fails unless every key is missing or of the expected type.
-- `expected` is a list of {key, type} pairs; type 'none' means the key must not exist.
local function check_key_types(expected)
  for _, pair in ipairs(expected) do
    local actual = redis.call('TYPE', pair[1])['ok']
    if actual ~= 'none' and actual ~= pair[2] then
      if pair[2] == 'none' then
        return redis.error_reply('KVS_WRONGTYPE ' .. pair[1] .. ' holds a ' .. actual .. ' where kvstore must create a new key')
      end
      return redis.error_reply('KVS_WRONGTYPE ' .. pair[1] .. ' holds a ' .. actual .. ', expected a ' .. pair[2])
    end
  end
  return nil
end

-- The refusal of a write to a thread an interrupted delete() left tombstoned (lua/delete.lua):
-- the client finishes the deletion, then sends the write again.
local function deleting_error()
  return redis.error_reply('KVS_DELETING the thread is being deleted: finish the deletion, then write again')
end

-- The refusal of a write to a thread whose restore (an import, a fork) has not run its last step
-- (lua/restore_state.lua): running the restore again finishes it.
local function restoring_error()
  return redis.error_reply('KVS_RESTORING the thread\'s restore (import or fork) is not finished: run it again to finish it')
end
