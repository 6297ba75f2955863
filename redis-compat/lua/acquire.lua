-- acquire.lua: try to take `weight` permits of a weighted semaphore, held under a TTL.
--
-- The lease-style semaphore people run on Redis today, written as one atomic script:
--   KEYS[1]  holders ZSET: member = holder id, score = expiry (Redis TIME, in milliseconds)
--   KEYS[2]  weights HASH: holder id -> weight, plus the reserved field "__held__" = sum of
--            the weights of every holder in the ZSET (kept in step, so no scan per call)
--   ARGV[1]  holder id (any non-empty string except "__held__")
--   ARGV[2]  weight  (integer > 0)
--   ARGV[3]  permits (integer > 0): the size of the semaphore
--   ARGV[4]  ttl in milliseconds (integer > 0): the hold expires ttl ms after this call
--
-- Non-blocking: this is acquire(weight, timeout 0). Nothing in Redis can park a script, so a
-- caller that wants to wait must poll (retry with back-off).
--
-- Re-acquiring by a holder that already holds replaces its weight and extends its expiry
-- (all-or-none: the new weight must fit next to the other holders, else nothing changes).
--
-- Returns {1, held} when acquired, {0, held} when unavailable; `held` is the sum of the
-- weights held after the call. Errors: INVALIDARG for bad arguments, as permitd answers.
-- Call with: EVALSHA <sha> 2 <holders-key> <weights-key> <id> <weight> <permits> <ttl-ms>

local holders, weights = KEYS[1], KEYS[2]
local id = ARGV[1]
local weight = tonumber(ARGV[2])
local permits = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])

if id == nil or id == '' or id == '__held__' then
  return redis.error_reply('INVALIDARG invalid holder id')
end
if weight == nil or weight <= 0 or weight % 1 ~= 0 then
  return redis.error_reply('INVALIDARG weight must be a positive integer')
end
if permits == nil or permits <= 0 or permits % 1 ~= 0 then
  return redis.error_reply('INVALIDARG permits must be a positive integer')
end
if ttl == nil or ttl <= 0 or ttl % 1 ~= 0 then
  return redis.error_reply('INVALIDARG ttl must be a positive integer of milliseconds')
end
if weight > permits then
  return redis.error_reply('INVALIDARG weight exceeds semaphore permits')
end

-- The server's clock, not the caller's: every client sees the same expiry line.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Prune the holders whose expiry has passed, and give their weight back.
local held = tonumber(redis.call('HGET', weights, '__held__') or '0')
local expired = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
  -- HMGET/HDEL in chunks: unpack() of a huge list would overflow Lua's stack.
  for i = 1, #expired, 1000 do
    local chunk = {}
    for j = i, math.min(i + 999, #expired) do
      chunk[#chunk + 1] = expired[j]
    end
    local ws = redis.call('HMGET', weights, unpack(chunk))
    for j = 1, #ws do
      held = held - tonumber(ws[j] or '0')
    end
    redis.call('HDEL', weights, unpack(chunk))
  end
  if held < 0 then held = 0 end
end

-- A re-acquire replaces the holder's own weight: count the others only.
local mine = tonumber(redis.call('HGET', weights, id) or '0')
local others = held - mine
if others + weight > permits then
  if #expired > 0 then
    redis.call('HSET', weights, '__held__', held)
  end
  return {0, held}
end

redis.call('ZADD', holders, now + ttl, id)
redis.call('HSET', weights, id, weight, '__held__', others + weight)
return {1, others + weight}
