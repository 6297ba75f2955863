'use strict';
// One whole permitd session, the same steps for every JavaScript client: node-redis 4 and 5
// (createClient, createCluster) in redis-compat/node-redis, ioredis Cluster here. Each client
// plugs in through a small adapter, so every one of them runs exactly these checks:
//
//   adapter = {
//     connect(): Promise<conn>,  a new client with connections of its own
//     resp: 2|3,                  the protocol the client speaks (CLIENT INFO must say so)
//     numbers: 'number'|'string', the JavaScript type the client gives integer replies
//     execNumbers: the same inside an EXEC reply, where it differs (default: `numbers`)
//     crossSlot: RegExp,          the error of a MULTI across two namespaces: the server's
//                                 CROSSSLOT, or the client's own refusal before it sends anything
//   }
//   conn = { call(args), multi(cmds), pipeline(cmds), close() }: replies as the client gives them
//
// The session: NS.CREATE, SEM.CREATE, LEASE.CREATE; an acquire that parks and is woken by a
// SEM.RELEASE on another connection; SEM.HOLDERS; a pipeline; a MULTI with two acquires on two
// semaphores of one namespace, whose fencing tokens must differ as the client delivers them; a
// MULTI across two namespaces, which runs nothing; INFO. Every fencing token seen must be an
// exact integer below 2^53 in that client.
const assert = require('node:assert/strict');
const { newName, asMap, waitFor, sleep } = require('./util');

const ACQUIRED = 'ACQUIRE_OUTCOME_ACQUIRED';
const UNAVAILABLE = 'ACQUIRE_OUTCOME_UNAVAILABLE';
// Long enough that a wake-up by the release cannot be mistaken for the timeout; short enough
// for every client's default read timeout (none of these clients has one by default).
const PARK_TIMEOUT_S = 5;
const TWO_53 = 2n ** 53n;

/** The key a cluster client routes a command by: the namespace, or none (CLIENT, INFO, ...). */
function routingKey(args) {
  return /^(NS|SEM|LEASE)\./i.test(args[0]) ? String(args[1]) : undefined;
}

/** The CLIENT LIST line of connection `id` shows it parked: Redis's flags=b, cmd=sem.acquire. */
async function isParked(conn, id) {
  const line = String(await conn.call(['CLIENT', 'LIST'])).split('\n')
    .find((l) => l.startsWith(`id=${id} `));
  return !!line && / flags=b /.test(line) && / cmd=sem\.acquire /.test(line);
}

async function runSession(t, adapter, prefix) {
  const ns = newName(prefix);
  const other = newName(prefix);
  const main = await adapter.connect();
  let waiterConn;

  // Every fencing token seen, as the client delivered it; the range is checked last, so that a
  // server handing out tokens above 2^53 still gets the rest of the session run.
  const tokens = [];
  const token = (value, what, type = adapter.numbers) => {
    assert.equal(typeof value, type, `${what}: ${value} arrives as a ${typeof value}`);
    tokens.push({ what, value });
    return value;
  };
  const int = (value) => (adapter.numbers === 'number' ? value : String(value));

  let holder;
  let waiter;
  let parkedToken;
  try {
    waiterConn = await adapter.connect();
    await t.test(`NS.CREATE, SEM.CREATE, LEASE.CREATE over RESP${adapter.resp}`, async () => {
      assert.match(String(await main.call(['CLIENT', 'INFO'])), new RegExp(` resp=${adapter.resp} `));
      const created = asMap(await main.call(['NS.CREATE', ns, 'DESC', 'redis-compat session']));
      assert.equal(created.name, ns);
      assert.equal(created.description, 'redis-compat session');
      assert.equal(created.version, int(1));
      await main.call(['NS.CREATE', other]);
      for (const sem of ['pool', 'a', 'b']) {
        const s = asMap(await main.call(['SEM.CREATE', ns, sem, 1]));
        assert.equal(s.name, sem);
        assert.equal(s.permits, int(1));
        assert.equal(s.active_holds, int(0));
      }
      const lease = asMap(await main.call(['LEASE.CREATE', ns, 'holder', 30]));
      assert.match(lease.lease_id, /^ls_[0-9A-Za-z]{28}$/);
      assert.equal(lease.process_id, 'holder');
      assert.equal(typeof lease.created_at, adapter.numbers);
      if (adapter.numbers === 'string') {
        // decimal strings: nanosecond timestamps exact
        assert.equal(BigInt(lease.expires_at) - BigInt(lease.created_at), 30n * 10n ** 9n);
      }
      holder = lease.lease_id;
      waiter = asMap(await main.call(['LEASE.CREATE', ns, 'waiter', 30])).lease_id;
    });

    await t.test(`an acquire parks (timeout ${PARK_TIMEOUT_S} s) and is woken by SEM.RELEASE on another connection`, async () => {
      const first = asMap(await main.call(['SEM.ACQUIRE', ns, 'pool', holder, 1, 0]));
      assert.equal(first.outcome, ACQUIRED);
      const t0 = token(first.fencing_token, 'first token');

      const id = await waiterConn.call(['CLIENT', 'ID']);
      const started = Date.now();
      const parked = waiterConn.call(['SEM.ACQUIRE', ns, 'pool', waiter, 1, PARK_TIMEOUT_S]);
      parked.catch(() => {}); // awaited below; a rejection must not go unhandled meanwhile
      assert.ok(await waitFor(() => isParked(main, id)), 'CLIENT LIST shows the acquire parked');
      await sleep(200);
      const releasedAt = Date.now();
      const released = asMap(await main.call(['SEM.RELEASE', ns, 'pool', holder]));
      assert.equal(released.name, 'pool');
      const got = asMap(await parked);
      assert.equal(got.outcome, ACQUIRED);
      assert.ok(Date.now() - releasedAt < 2000, `woken ${Date.now() - releasedAt} ms after the release`);
      assert.ok(Date.now() - started >= 200);
      assert.equal(asMap(got.semaphore).active_holds, int(1));
      parkedToken = token(got.fencing_token, 'token of the woken acquire');
      assert.ok(BigInt(parkedToken) > BigInt(t0), `${parkedToken} > ${t0}`);
    });

    await t.test('SEM.HOLDERS lists the woken holder with its token', async () => {
      const page = asMap(await main.call(['SEM.HOLDERS', ns, 'pool']));
      const holders = page.holders.map(asMap);
      assert.deepEqual(holders.map((h) => h.lease_id), [waiter]);
      assert.equal(holders[0].process_id, 'waiter');
      assert.equal(holders[0].weight, int(1));
      assert.equal(token(holders[0].fencing_token, 'holder token'), parkedToken);
      assert.equal(page.next_cursor, '');
    });

    await t.test('a pipeline: replies in order', async () => {
      const res = await main.pipeline([
        ['LEASE.REFRESH', ns, holder, 30],
        ['SEM.ACQUIRE', ns, 'pool', holder, 1, 0],
        ['SEM.RELEASE', ns, 'pool', waiter],
        ['SEM.ACQUIRE', ns, 'pool', holder, 1, 0],
        ['SEM.HOLDERS', ns, 'pool'],
      ]);
      assert.equal(res.length, 5);
      assert.equal(asMap(res[0]).lease_id, holder);
      assert.equal(asMap(res[1]).outcome, UNAVAILABLE);
      assert.equal(asMap(res[2]).active_holds, int(0));
      const again = asMap(res[3]);
      assert.equal(again.outcome, ACQUIRED);
      assert.ok(BigInt(token(again.fencing_token, 'pipelined token')) > BigInt(parkedToken));
      assert.deepEqual(asMap(res[4]).holders.map((h) => asMap(h).lease_id), [holder]);
    });

    await t.test('MULTI/EXEC: two acquires on two semaphores, tokens differ as numbers here', async () => {
      const res = await main.multi([
        ['SEM.ACQUIRE', ns, 'a', holder, 1, 0],
        ['SEM.ACQUIRE', ns, 'b', holder, 1, 0],
        ['SEM.GET', ns, 'a'],
      ]);
      assert.equal(res.length, 3);
      const [ra, rb] = [asMap(res[0]), asMap(res[1])];
      assert.equal(ra.outcome, ACQUIRED);
      assert.equal(rb.outcome, ACQUIRED);
      const execNumbers = adapter.execNumbers || adapter.numbers;
      const ta = token(ra.fencing_token, 'MULTI token a', execNumbers);
      const tb = token(rb.fencing_token, 'MULTI token b', execNumbers);
      assert.notEqual(ta, tb, 'two acquires in one MULTI got the same token in this client');
      const held = asMap(res[2]).active_holds;
      assert.equal(typeof held, execNumbers);
      assert.equal(Number(held), 1);
    });

    await t.test(`MULTI across two namespaces is refused (${adapter.crossSlot}) and runs nothing`, async () => {
      await assert.rejects(main.multi([
        ['SEM.CREATE', ns, 'x', 1],
        ['SEM.CREATE', other, 'y', 1],
      ]), (err) => {
        assert.match(String(err.message), adapter.crossSlot);
        return true;
      });
      await assert.rejects(main.call(['SEM.GET', ns, 'x']), { message: /^NOTFOUND / });
      await assert.rejects(main.call(['SEM.GET', other, 'y']), { message: /^NOTFOUND / });
    });

    await t.test('INFO: redis_version and the # Semaphores counts', async () => {
      const info = String(await main.call(['INFO']));
      assert.match(info, /^redis_version:/m);
      assert.match(info, /^# Semaphores\r?$/m);
      const namespaces = Number(info.match(/^namespaces:(\d+)/m)[1]);
      assert.ok(namespaces >= 2, `namespaces:${namespaces}`);
      assert.match(info, /^blocked_clients:\d+/m);
    });


    await t.test('every fencing token seen is an exact integer below 2^53 in this client', () => {
      assert.ok(tokens.length >= 6, `${tokens.length} tokens seen`);
      for (const { what, value } of tokens) {
        if (typeof value === 'number') {
          assert.ok(Number.isSafeInteger(value) && value > 0, `${what}: ${value} is not an exact integer below 2^53`);
        } else {
          assert.match(value, /^[1-9][0-9]*$/, what);
          assert.ok(BigInt(value) < TWO_53, `${what}: ${value} is not below 2^53`);
        }
      }
    });
  } finally {
    await main.call(['NS.DELETE', ns]).catch(() => {});
    await main.call(['NS.DELETE', other]).catch(() => {});
    await main.close();
    if (waiterConn) await waiterConn.close();
  }
}

module.exports = { runSession, routingKey, PARK_TIMEOUT_S };
