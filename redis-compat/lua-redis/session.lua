-- redis-compat/lua-redis/session.lua: one whole permitd session through Debian's lua-redis
-- (redis-lua 2.0.5, RESP2 only) on Lua 5.1, where every integer reply is a double.
--
--   lua5.1 session.lua HOST PORT
--
-- NS.CREATE, SEM.CREATE, LEASE.CREATE; an acquire that parks and is woken by a SEM.RELEASE
-- from another connection (this same script run as a child process: lua-redis only blocks);
-- SEM.HOLDERS; a pipeline; MULTI/EXEC with two acquires on two semaphores, whose tokens must
-- differ as Lua numbers; a MULTI across two namespaces (CROSSSLOT, nothing runs); INFO; every
-- token an exact integer below 2^53. Prints "ok - step" or "FAIL - step: why" per step and
-- "N passed, M failed" last; exits non-zero on any failure.
-- PERMITD_PASSWORD, when set, is sent with AUTH on each connection.
--
--   lua5.1 session.lua HOST PORT release NS SEM LEASE CLIENT-ID
--
-- is the child: it waits until CLIENT LIST shows CLIENT-ID parked, then releases LEASE's hold
-- and prints "released <time>".
local redis = require('redis')
local socket = require('socket')

local PARK_TIMEOUT = 5
-- lua-redis sets no read timeout unless given one; this one is above the parked acquire's.
local READ_TIMEOUT = PARK_TIMEOUT + 10
local TWO_53 = 2 ^ 53

for name, cmd in pairs({
  ns_create = 'NS.CREATE', ns_delete = 'NS.DELETE', sem_create = 'SEM.CREATE', sem_get = 'SEM.GET',
  sem_acquire = 'SEM.ACQUIRE', sem_release = 'SEM.RELEASE', sem_holders = 'SEM.HOLDERS',
  lease_create = 'LEASE.CREATE', lease_refresh = 'LEASE.REFRESH', client_cmd = 'CLIENT',
  info_text = 'INFO',
}) do
  redis.commands[name] = redis.command(cmd)
end

local host, port = arg[1], tonumber(arg[2])

local function connect()
  local c = redis.connect(host, port, READ_TIMEOUT)
  local password = os.getenv('PERMITD_PASSWORD')
  if password and password ~= '' then c:auth(password) end
  return c
end

-- A RESP2 map reply (a flat array name, value, ...) as a table.
local function map(reply)
  assert(type(reply) == 'table', 'not a map reply: ' .. tostring(reply))
  local m = {}
  for i = 1, #reply, 2 do m[reply[i]] = reply[i + 1] end
  return m
end

-- CLIENT LIST on `c` shows connection `id` parked: flags=b, cmd=sem.acquire.
local function is_parked(c, id)
  for line in c:client_cmd('LIST'):gmatch('[^\n]+') do
    if line:sub(1, #('id=' .. id .. ' ')) == 'id=' .. id .. ' ' then
      return line:find(' flags=b ', 1, true) ~= nil and line:find(' cmd=sem.acquire ', 1, true) ~= nil
    end
  end
  return false
end

if arg[3] == 'release' then
  local ns, sem, lease, id = arg[4], arg[5], arg[6], arg[7]
  local c = connect()
  local deadline = socket.gettime() + 5
  while not is_parked(c, id) do
    if socket.gettime() > deadline then
      print('error: CLIENT LIST never showed the acquire parked')
      os.exit(1)
    end
    socket.sleep(0.02)
  end
  socket.sleep(0.2)
  local at = socket.gettime()
  c:sem_release(ns, sem, lease)
  print(string.format('released %.6f', at))
  os.exit(0)
end

local passed, failed = 0, 0
local function step(name, fn)
  local ok, err = pcall(fn)
  if ok then
    passed = passed + 1
    print('ok - ' .. name)
  else
    failed = failed + 1
    print('FAIL - ' .. name .. ': ' .. tostring(err))
  end
  io.stdout:flush()
end

local tokens = {}
local function acquired(reply, what)
  local r = map(reply)
  assert(r.outcome == 'ACQUIRE_OUTCOME_ACQUIRED', what .. ': outcome ' .. tostring(r.outcome))
  assert(type(r.fencing_token) == 'number', what .. ': token is a ' .. type(r.fencing_token))
  tokens[#tokens + 1] = { what = what, value = r.fencing_token }
  return r.fencing_token, r
end

local c = connect()
local tag = string.format('%x', math.floor(socket.gettime() * 1e6))
local ns, other = 'lua-' .. tag, 'lua-' .. tag .. '-other'
local holder, waiter, parked_token

print('# ' .. redis._VERSION .. ' on ' .. _VERSION .. ', RESP2')

local created = true
step('NS.CREATE, SEM.CREATE, LEASE.CREATE', function()
  created = false
  local n = map(c:ns_create(ns, 'DESC', 'redis-compat lua-redis'))
  assert(n.name == ns and n.version == 1, 'NS.CREATE reply')
  c:ns_create(other)
  for _, sem in ipairs({ 'pool', 'a', 'b' }) do
    local s = map(c:sem_create(ns, sem, 1))
    assert(s.name == sem and s.permits == 1 and s.active_holds == 0, 'SEM.CREATE ' .. sem)
  end
  local l = map(c:lease_create(ns, 'holder', 30))
  assert(l.lease_id:match('^ls_' .. string.rep('%w', 28) .. '$'), 'lease id ' .. tostring(l.lease_id))
  -- nanosecond timestamps are doubles here: exact only to a few hundred nanoseconds
  assert(math.abs(l.expires_at - l.created_at - 30e9) <= 1024, 'expires_at - created_at')
  holder = l.lease_id
  waiter = map(c:lease_create(ns, 'waiter', 30)).lease_id
  created = true
end)

if created then
  step('an acquire parks (timeout 5 s) and is woken by SEM.RELEASE on another connection', function()
    local first = acquired(c:sem_acquire(ns, 'pool', holder, 1, 0), 'first acquire')
    local id = c:client_cmd('ID')
    local child = assert(io.popen(string.format('lua5.1 %q %s %d release %s pool %s %d',
      arg[0], host, port, ns, holder, id)))
    local started = socket.gettime()
    local ok, reply = pcall(c.sem_acquire, c, ns, 'pool', waiter, 1, PARK_TIMEOUT)
    local woken = socket.gettime()
    local out = child:read('*a')
    child:close()
    assert(ok, 'parked acquire: ' .. tostring(reply))
    local released = tonumber(out:match('^released (%S+)'))
    assert(released, 'the releasing child said: ' .. out)
    parked_token = acquired(reply, 'woken acquire')
    assert(woken - released < 2, string.format('woken %.2f s after the release', woken - released))
    assert(woken - started >= 0.2, 'answered before the release')
    assert(parked_token > first, 'token not above the first')
  end)

  step('SEM.HOLDERS lists the woken holder with its token', function()
    local page = map(c:sem_holders(ns, 'pool'))
    assert(#page.holders == 1, #page.holders .. ' holders')
    local h = map(page.holders[1])
    assert(h.lease_id == waiter and h.process_id == 'waiter' and h.weight == 1, 'holder fields')
    assert(h.fencing_token == parked_token, 'holder token')
    assert(page.next_cursor == '', 'next_cursor')
  end)

  step('a pipeline: replies in order', function()
    local res = c:pipeline(function(p)
      p:lease_refresh(ns, holder, 30)
      p:sem_acquire(ns, 'pool', holder, 1, 0)
      p:sem_release(ns, 'pool', waiter)
      p:sem_acquire(ns, 'pool', holder, 1, 0)
      p:sem_holders(ns, 'pool')
    end)
    assert(#res == 5, #res .. ' replies')
    assert(map(res[1]).lease_id == holder, 'LEASE.REFRESH')
    assert(map(res[2]).outcome == 'ACQUIRE_OUTCOME_UNAVAILABLE', 'first pipelined acquire')
    assert(map(res[3]).active_holds == 0, 'SEM.RELEASE')
    assert(acquired(res[4], 'pipelined acquire') > parked_token, 'pipelined token')
    local holders = map(res[5]).holders
    assert(#holders == 1 and map(holders[1]).lease_id == holder, 'SEM.HOLDERS')
  end)

  step('MULTI/EXEC: two acquires on two semaphores, tokens differ as Lua numbers', function()
    local res = c:transaction(function(t)
      t:sem_acquire(ns, 'a', holder, 1, 0)
      t:sem_acquire(ns, 'b', holder, 1, 0)
      t:sem_get(ns, 'a')
    end)
    assert(#res == 3, #res .. ' replies')
    local ta = acquired(res[1], 'MULTI token a')
    local tb = acquired(res[2], 'MULTI token b')
    assert(ta ~= tb, string.format('two acquires in one MULTI got the same number %.17g', ta))
    assert(map(res[3]).active_holds == 1, 'SEM.GET')
  end)

  step('MULTI across two namespaces: EXEC answers CROSSSLOT and nothing runs', function()
    local ok, err = pcall(c.transaction, c, function(t)
      t:sem_create(ns, 'x', 1)
      t:sem_create(other, 'y', 1)
    end)
    assert(not ok, 'EXEC succeeded')
    assert(tostring(err):find('redis error: CROSSSLOT ', 1, true), tostring(err))
    for _, pair in ipairs({ { ns, 'x' }, { other, 'y' } }) do
      local got, e = pcall(c.sem_get, c, pair[1], pair[2])
      assert(not got and tostring(e):find('NOTFOUND ', 1, true), 'SEM.GET ' .. pair[2] .. ': ' .. tostring(e))
    end
  end)

  step('INFO: redis_version and the # Semaphores counts', function()
    local info = c:info_text()
    assert(info:find('redis_version:', 1, true), 'no redis_version')
    assert(info:find('# Semaphores\r\n', 1, true), 'no # Semaphores')
    assert(info:find('\r\nnamespaces:%d'), 'no namespaces count')
    assert(info:find('\r\nblocked_clients:%d'), 'no blocked_clients')
  end)

  step('every fencing token seen is an exact integer below 2^53', function()
    assert(#tokens >= 5, #tokens .. ' tokens seen')
    for _, t in ipairs(tokens) do
      assert(t.value > 0 and t.value < TWO_53 and t.value == math.floor(t.value),
        string.format('%s: %.17g is not an exact integer below 2^53', t.what, t.value))
    end
  end)
end

pcall(c.ns_delete, c, ns)
pcall(c.ns_delete, c, other)
print(string.format('%d passed, %d failed', passed, failed))
os.exit(failed == 0 and 0 or 1)
