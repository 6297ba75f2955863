-- fair_release.lua: give back a holder's permits and/or withdraw its ticket (the pair of
-- fair_acquire.lua; see FAIR.md beside this file).
--
--   KEYS[1]  holders ZSET (holder id -> hold expiry, ms)   } the same keys as fair_acquire.lua
--   KEYS[2]  weights HASH (holder id -> weight, "__held__") } (KEYS[1..2] also as acquire.lua)
--   KEYS[3]  queue ZSET   (holder id -> ticket)
--   KEYS[4]  tickets ZSET (holder id -> ticket stale deadline, ms)
--   ARGV[1]  holder id
--
-- Releasing wakes nobody: Redis cannot push to a script's caller, so the head of the queue
-- sees the freed permits on its next poll. A waiter that gives up calls this too, so the
-- waiters behind it do not wait for its ticket to go stale.
--
-- Returns {released, held, withdrawn}: released 1 when the id held permits (0: it held
-- nothing, or its hold had expired: its weight is given back exactly once, by whichever call
-- removes it), held = sum of the weights held after the call, withdrawn 1 when a ticket of
-- the id left the queue.
-- Call with: EVALSHA <sha> 4 <holders> <weights> <queue> <tickets> <id>

local holders, weights, queue, tickets = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[1]

if id == nil or id == '' or id == '__held__' then
  return redis.error_reply('INVALIDARG invalid holder id')
end

local withdrawn = redis.call('ZREM', queue, id)
redis.call('ZREM', tickets, id)

local held = tonumber(redis.call('HGET', weights, '__held__') or '0')
if redis.call('ZREM', holders, id) == 0 then
  return {0, held, withdrawn}
end
local w = tonumber(redis.call('HGET', weights, id) or '0')
held = held - w
if held < 0 then held = 0 end
redis.call('HDEL', weights, id)
redis.call('HSET', weights, '__held__', held)
return {1, held, withdrawn}
