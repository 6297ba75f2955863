-- release.lua: give back a holder's permits (the pair of acquire.lua).
--
--   KEYS[1]  holders ZSET (holder id -> expiry in ms), as in acquire.lua
--   KEYS[2]  weights HASH (holder id -> weight, "__held__" -> sum of weights)
--   ARGV[1]  holder id
--
-- Returns {1, held} when the holder held permits and released them, {0, held} when it held
-- nothing (already released, or expired and pruned): a no-op. `held` is the sum of the
-- weights held after the call. An expired holder that no acquire has pruned yet is removed
-- here all the same: its weight is given back exactly once, by whichever call removes it.
-- Call with: EVALSHA <sha> 2 <holders-key> <weights-key> <id>

local holders, weights = KEYS[1], KEYS[2]
local id = ARGV[1]

if id == nil or id == '' or id == '__held__' then
  return redis.error_reply('INVALIDARG invalid holder id')
end

local held = tonumber(redis.call('HGET', weights, '__held__') or '0')
if redis.call('ZREM', holders, id) == 0 then
  return {0, held}
end
local w = tonumber(redis.call('HGET', weights, id) or '0')
held = held - w
if held < 0 then held = 0 end
redis.call('HDEL', weights, id)
redis.call('HSET', weights, '__held__', held)
return {1, held}
