-- fair_acquire.lua: a fair (FIFO) weighted semaphore on Redis, held under a TTL, with a ticket
-- queue. The companion of fair_release.lua; see FAIR.md beside this file.
--
-- Holders live in the same two keys as acquire.lua / release.lua, so the three scripts agree
-- on who holds what:
--   KEYS[1]  holders ZSET: member = holder id, score = hold expiry (Redis TIME, ms)
--   KEYS[2]  weights HASH: holder id -> weight, plus "__held__" = sum of the holders' weights
-- and the queue of waiters:
--   KEYS[3]  queue ZSET:   member = holder id, score = its ticket (a sequence number): FIFO order
--   KEYS[4]  tickets ZSET: member = holder id, score = when the ticket goes stale (ms)
--   KEYS[5]  sequence STRING: the last ticket handed out (INCR)
-- Give all five keys one hash tag ({sem}:holders, {sem}:weights, ...) for Redis Cluster.
--
--   ARGV[1]  holder id (non-empty, not "__held__")
--   ARGV[2]  weight (integer > 0, <= permits)
--   ARGV[3]  permits (integer > 0): the size of the semaphore
--   ARGV[4]  hold ttl in ms (integer > 0): a granted hold expires ttl ms after the grant
--   ARGV[5]  ticket ttl in ms (integer > 0): a ticket not polled for this long goes stale and
--            leaves the queue (a waiter that died stops blocking the ones behind it)
--   ARGV[6]  the caller's ticket from its previous call, or "" / "0" on the first call
--   ARGV[7]  optional "NOWAIT": never take a ticket; answer at once (acquire with timeout 0)
--
-- Rules:
--   * Only the head of the queue may take permits, and only when its whole weight fits
--     (all-or-none). A head that does not fit yet blocks every ticket behind it, so a heavy
--     request is never starved by light ones.
--   * A caller without a ticket is granted at once only if the queue is empty and its weight
--     fits; otherwise it gets a ticket at the tail (or, with NOWAIT, a plain "no").
--   * A caller polls by calling again with its ticket, about every retry interval. Each poll
--     pushes its ticket's stale deadline to now + ticket ttl.
--   * A ticket the queue no longer has (it went stale) is replaced by a new one at the tail:
--     the caller lost its place, and the reply says so with its new ticket.
--   * A holder re-acquiring with a weight <= its current one is granted at once (weight and
--     expiry replaced); a larger weight queues like any acquire, keeping its hold meanwhile.
--     With the same weight, this is how a holder refreshes its hold's expiry.
--
-- Returns {1, held, 0, 0}              acquired (the ticket, if any, is consumed)
--         {0, held, ticket, position}  waiting: poll again with `ticket`; position 1 = head
--         {0, held, 0, 0}              NOWAIT and not granted
-- where `held` is the sum of the weights held after the call. The server's clock (TIME) is
-- the only clock: no client clock skew can expire anyone early.
-- Call with: EVALSHA <sha> 5 <holders> <weights> <queue> <tickets> <seq> <id> <weight>
--            <permits> <hold-ttl-ms> <ticket-ttl-ms> <ticket|""> [NOWAIT]

local holders, weights, queue, tickets, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id = ARGV[1]
local weight = tonumber(ARGV[2])
local permits = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local ticket_ttl = tonumber(ARGV[5])
local ticket = tonumber(ARGV[6] or '0') or 0
local nowait = ARGV[7] ~= nil and string.upper(ARGV[7]) == 'NOWAIT'

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
if ticket_ttl == nil or ticket_ttl <= 0 or ticket_ttl % 1 ~= 0 then
  return redis.error_reply('INVALIDARG ticket ttl must be a positive integer of milliseconds')
end
if ARGV[7] ~= nil and not nowait then
  return redis.error_reply('ERR syntax error')
end
if weight > permits then
  return redis.error_reply('INVALIDARG weight exceeds semaphore permits')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Removes `list` from the holders (ZSET already pruned by the caller) and returns the weight
-- they held. HMGET/HDEL in chunks: unpack() of a huge list would overflow Lua's stack.
local function drop_weights(list)
  local gone = 0
  for i = 1, #list, 1000 do
    local chunk = {}
    for j = i, math.min(i + 999, #list) do
      chunk[#chunk + 1] = list[j]
    end
    local ws = redis.call('HMGET', weights, unpack(chunk))
    for j = 1, #ws do
      gone = gone + tonumber(ws[j] or '0')
    end
    redis.call('HDEL', weights, unpack(chunk))
  end
  return gone
end

-- 1. Expired holders give their weight back.
local held = tonumber(redis.call('HGET', weights, '__held__') or '0')
local expired = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
  held = held - drop_weights(expired)
  if held < 0 then held = 0 end
  redis.call('HSET', weights, '__held__', held)
end

-- 2. Stale tickets (their waiter stopped polling) leave the queue.
local stale = redis.call('ZRANGEBYSCORE', tickets, '-inf', now)
if #stale > 0 then
  for i = 1, #stale, 1000 do
    local chunk = {}
    for j = i, math.min(i + 999, #stale) do
      chunk[#chunk + 1] = stale[j]
    end
    redis.call('ZREM', queue, unpack(chunk))
    redis.call('ZREM', tickets, unpack(chunk))
  end
end

local mine = tonumber(redis.call('HGET', weights, id) or '0')
local others = held - mine

local function grant()
  redis.call('ZADD', holders, now + ttl, id)
  redis.call('HSET', weights, id, weight, '__held__', others + weight)
  redis.call('ZREM', queue, id)
  redis.call('ZREM', tickets, id)
  return {1, others + weight, 0, 0}
end

-- 3. A holder keeping or lowering its weight never waits (it frees permits, or refreshes).
if mine > 0 and weight <= mine then
  return grant()
end

-- 4. Where does the caller stand?
local my_ticket = tonumber(redis.call('ZSCORE', queue, id) or '0')
if my_ticket == 0 or (ticket ~= 0 and ticket ~= my_ticket) then
  -- No valid ticket: first call, or the old one went stale.
  if my_ticket ~= 0 then
    -- A different ticket for the same id: the caller's view is stale; keep the queue's one.
    ticket = my_ticket
  else
    if redis.call('ZCARD', queue) == 0 and others + weight <= permits then
      return grant()
    end
    if nowait then
      return {0, held, 0, 0}
    end
    ticket = redis.call('INCR', seq)
    redis.call('ZADD', queue, ticket, id)
  end
else
  ticket = my_ticket
end

-- 5. Only the head may take permits, and only its whole weight.
local head = redis.call('ZRANGE', queue, 0, 0)[1]
if head == id and others + weight <= permits then
  return grant()
end
-- Still waiting (a NOWAIT caller that already had a ticket keeps it: it asked by ticket).
redis.call('ZADD', tickets, now + ticket_ttl, id)
return {0, held, ticket, redis.call('ZRANK', queue, id) + 1}
