'use strict';
// permitd.js's retry rules for cluster mode (SPEC §10, replication.md §4.3), each with a real
// ioredis client (5 on RESP2, 6 on RESP3; plain and Cluster) over real sockets against a
// scripted fake node (fake.js) that answers MOVED / TRYAGAIN / CLUSTERDOWN / LEADERCHANGED or
// drops the connection where a test says so. Needs no permitd server.
const { describe, it, beforeEach, afterEach } = require('node:test');
const assert = require('node:assert/strict');
const Redis6 = require('ioredis');
const Redis5 = require('ioredis5');
const { FakeNode, keySlot } = require('./fake');
const {
  ACQUIRED, TIMED_OUT, Lease, Namespace, Semaphore, MovedError, RetriesExhaustedError, LeaseLostError,
  setRetryPolicy, withPermit,
} = require('../permitd');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const NS = 'team';

const clients = new Set();
function track(c) {
  c.on('error', () => {});
  clients.add(c);
  return c;
}

/** A plain client of `node`; maxRetriesPerRequest 0 (as the suite's other tests) makes ioredis
 * reject a command in flight when the connection drops, so the helper's own re-send is seen. */
async function plain(Redis, node, extra = {}) {
  const c = track(new Redis({
    host: '127.0.0.1', port: node.port, stringNumbers: true, lazyConnect: true, maxRetriesPerRequest: 0, ...extra,
  }));
  await c.connect();
  return c;
}

async function cluster(Redis, node) {
  const c = track(new Redis.Cluster([{ host: '127.0.0.1', port: node.port }],
    { redisOptions: { stringNumbers: true } }));
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`Cluster not ready (${c.status})`)), 5000);
    c.once('ready', () => {
      clearTimeout(timer);
      resolve();
    });
  });
  return c;
}

/** A semaphore 'db' and a lease, made through the helper before anything is scripted; the
 * node's record of what it received starts after them. */
async function setup(node, client, permits = 2) {
  await Semaphore.create(client, NS, 'db', permits);
  const lease = await Lease.create(client, NS, 'worker', 30);
  node.received.length = 0;
  return { sem: new Semaphore(client, NS, 'db'), lease };
}

const timeouts = (node, name = 'SEM.ACQUIRE', index = 4) => node.sent(name).map((r) => Number(r.args[index]));

afterEach(() => {
  for (const c of clients) c.disconnect();
  clients.clear();
});

for (const [label, Redis] of [['ioredis 6 (RESP3)', Redis6], ['ioredis 5 (RESP2)', Redis5]]) {
  describe(`permitd.js retries, plain ${label}`, () => {
    let node;
    beforeEach(async () => { node = await new FakeNode().start(); });
    afterEach(() => node.stop());

    it('TRYAGAIN, then success: the re-sent acquire carries what is left of its timeout', async () => {
      const c = await plain(Redis, node);
      const { sem, lease } = await setup(node, c);
      node.script('SEM.ACQUIRE', { delay: 200, then: 'TRYAGAIN' });
      const res = await sem.acquire(lease, 2, 3);
      assert.equal(res.outcome, ACQUIRED);
      const [first, second] = timeouts(node);
      assert.equal(node.sent('SEM.ACQUIRE')[0].args[4], '3', 'the first send is the caller\'s timeout as given');
      assert.ok(second < first - 0.15 && second > 1, `re-sent with ${second} s`);
      const fixed = [NS, 'db', lease.id, '2'];
      assert.deepEqual(node.sent('SEM.ACQUIRE').map((r) => r.args.slice(0, 4)), [fixed, fixed]);
    });

    it('SEM.ACQUIREALL after TRYAGAIN: its timeout argument shrinks too', async () => {
      const c = await plain(Redis, node);
      const { lease } = await setup(node, c);
      await Semaphore.create(c, NS, 'cache', 1);
      node.script('SEM.ACQUIREALL', { delay: 200, then: 'TRYAGAIN' });
      const parts = [[new Semaphore(c, NS, 'db'), 1], [new Semaphore(c, NS, 'cache'), 1]];
      const res = await Semaphore.acquireAll(parts, lease, 2);
      assert.ok(res.acquired);
      const [first, second] = timeouts(node, 'SEM.ACQUIREALL', 2);
      assert.ok(first === 2 && second < 1.85, `timeouts ${first}, ${second}`);
    });

    it('CLUSTERDOWN a few times, then success (LEASE.CREATE, SEM.RELEASE)', async () => {
      const c = await plain(Redis, node);
      const { sem } = await setup(node, c);
      node.script('LEASE.CREATE', 'CLUSTERDOWN', 'CLUSTERDOWN', 'CLUSTERDOWN');
      const lease = await Lease.create(c, NS, 'w2', 30);
      assert.equal(node.sent('LEASE.CREATE').length, 4);
      assert.equal(node.leases.size, 2, 'no orphan: nothing ran before the fourth');
      await sem.acquire(lease, 1);
      node.script('SEM.RELEASE', 'CLUSTERDOWN', 'CLUSTERDOWN');
      assert.equal((await sem.release(lease)).active_holds, 0);
      assert.equal(node.sent('SEM.RELEASE').length, 3);
    });

    it('LEADERCHANGED on SEM.ACQUIRE: re-sent with the same lease and weight, the first token returned', async () => {
      const c = await plain(Redis, node);
      const { sem, lease } = await setup(node, c);
      node.script('SEM.ACQUIRE', 'LEADERCHANGED');
      const res = await sem.acquire(lease, 2, 1);
      const sent = node.sent('SEM.ACQUIRE');
      assert.equal(sent.length, 2);
      assert.deepEqual(sent[1].args.slice(0, 4), sent[0].args.slice(0, 4));
      const hold = node._sem(NS, 'db').holds.get(lease.id);
      assert.equal(res.outcome, ACQUIRED);
      assert.equal(res.fencingToken, BigInt(hold.token), 'the token of the first (committed) try');
      assert.equal(res.semaphore.active_holders_count, 1);
    });

    it('LEADERCHANGED on a timeout-0 acquire: settled by a re-send (timeout 0)', async () => {
      const c = await plain(Redis, node);
      const { sem, lease } = await setup(node, c);
      node.script('SEM.ACQUIRE', 'LEADERCHANGED');
      assert.ok((await sem.acquire(lease, 1)).acquired);
      assert.deepEqual(timeouts(node), [0, 0]);
    });

    it('LEADERCHANGED on LEASE.REVOKE, then NOTFOUND: done', async () => {
      const c = await plain(Redis, node);
      const { lease } = await setup(node, c);
      node.script('LEASE.REVOKE', 'LEADERCHANGED');
      await lease.revoke();
      assert.equal(node.sent('LEASE.REVOKE').length, 2);
      assert.equal(node.leases.has(lease.id), false);
      // a NOTFOUND with no doubt before it is still an error
      await assert.rejects(lease.revoke(), { message: /^NOTFOUND/ });
    });

    it('LEADERCHANGED on SEM.DELETE, NS.DELETE: re-sent, done', async () => {
      const c = await plain(Redis, node);
      await Namespace.create(c, 'gone');
      await Semaphore.create(c, 'gone', 's', 1);
      node.script('SEM.DELETE', 'LEADERCHANGED');
      await new Semaphore(c, 'gone', 's').delete();
      node.script('NS.DELETE', 'LEADERCHANGED');
      await new Namespace(c, 'gone').delete();
      assert.equal(node.sent('SEM.DELETE').length, 2);
      assert.equal(node.namespaces.has('gone'), false);
      // NOTFOUND (the namespace is gone) after an unknown outcome: done
      node.script('SEM.DELETE', 'LEADERCHANGED');
      await new Semaphore(c, 'gone', 's').delete();
    });

    it('ALREADYEXISTS after LEADERCHANGED on SEM.CREATE: same permits is success, other permits an error', async () => {
      const c = await plain(Redis, node);
      node.script('SEM.CREATE', 'LEADERCHANGED');
      const made = await Semaphore.create(c, NS, 'mine', 3, { description: 'pool', meta: { k: 'v' } });
      assert.equal(made.permits, 3);
      assert.deepEqual(made.metadata, { k: 'v' });
      assert.deepEqual(node.sent('SEM.CREATE').length, 2);
      assert.deepEqual(node.sent('SEM.GET').length, 1, 'read back and compared');

      await Semaphore.create(c, NS, 'theirs', 5); // someone else's
      node.script('SEM.CREATE', 'LEADERCHANGED');
      await assert.rejects(Semaphore.create(c, NS, 'theirs', 3), { message: /^ALREADYEXISTS semaphore 'theirs'/ });
      node.script('SEM.CREATE', 'LEADERCHANGED');
      await assert.rejects(Semaphore.create(c, NS, 'theirs', 5, { meta: { other: '1' } }),
        { message: /^ALREADYEXISTS/ });
      // ALREADYEXISTS with no doubt before it: an error, whatever the settings
      await assert.rejects(Semaphore.create(c, NS, 'mine', 3, { description: 'pool', meta: { k: 'v' } }),
        { message: /^ALREADYEXISTS/ });
    });

    it('ALREADYEXISTS after LEADERCHANGED on NS.CREATE: compared too', async () => {
      const c = await plain(Redis, node);
      node.script('NS.CREATE', 'LEADERCHANGED');
      assert.equal((await Namespace.create(c, 'ns-a', { description: 'd' })).name, 'ns-a');
      node.script('NS.CREATE', 'LEADERCHANGED');
      await assert.rejects(Namespace.create(c, 'ns-a', { description: 'other' }), { message: /^ALREADYEXISTS/ });
    });

    it('connection dropped after an acquire was sent: reconnect, re-send, the same hold', async () => {
      const c = await plain(Redis, node);
      const { sem, lease } = await setup(node, c);
      const before = node.connections;
      node.script('SEM.ACQUIRE', 'DROP');
      const res = await sem.acquire(lease, 1, 2);
      assert.equal(res.outcome, ACQUIRED);
      assert.equal(res.fencingToken, BigInt(node._sem(NS, 'db').holds.get(lease.id).token));
      assert.ok(node.connections > before, 'reconnected');
      const [first, second] = timeouts(node);
      assert.ok(first === 2 && second < 2, `timeouts ${first}, ${second}`);
      // dropped before it ran: the re-send is a first acquire
      const other = await Lease.create(c, NS, 'other', 30);
      node.script('SEM.ACQUIRE', 'DROP_UNRUN');
      assert.ok((await sem.acquire(other, 1)).acquired);
    });

    it('ioredis\'s own re-send on reconnect (maxRetriesPerRequest > 0) carries the remaining timeout', async () => {
      const c = await plain(Redis, node, { maxRetriesPerRequest: 5 });
      const { sem, lease } = await setup(node, c, 1);
      const other = await Lease.create(c, NS, 'other', 30);
      await sem.acquire(other, 1);
      node.received.length = 0;
      // parked for 300 ms, then the connection drops without a reply
      node.script('SEM.ACQUIRE', { delay: 300, then: 'DROP_UNRUN' });
      const res = await sem.acquire(lease, 1, 1);
      assert.equal(res.outcome, TIMED_OUT);
      const [first, second] = timeouts(node);
      assert.ok(first === 1 && second < 0.75, `timeouts ${first}, ${second}`);
    });

    it('the deadline spent while the node keeps answering CLUSTERDOWN: rejects in bounded time', async () => {
      const c = await plain(Redis, node);
      const { sem, lease } = await setup(node, c);
      node.always('SEM.ACQUIRE', 'CLUSTERDOWN');
      const start = performance.now();
      await assert.rejects(sem.acquire(lease, 1, 0.6), (e) => {
        assert.ok(e instanceof RetriesExhaustedError);
        assert.match(e.message, /^SEM\.ACQUIRE: no answer within its timeout \(\d+ tries\): CLUSTERDOWN no leader$/);
        assert.match(e.cause.message, /^CLUSTERDOWN/);
        assert.equal(e.outcomeUnknown, false);
        return true;
      });
      const took = performance.now() - start;
      assert.ok(took >= 550 && took < 3000, `took ${took} ms`);
      const sent = timeouts(node);
      assert.ok(sent.length >= 3 && sent.every((t, i) => i === 0 || t < sent[i - 1]), `timeouts ${sent}`);
      // a timeout-0 acquire has no time to retry
      node.received.length = 0;
      await assert.rejects(sem.acquire(lease, 1, 0), RetriesExhaustedError);
      assert.equal(node.sent('SEM.ACQUIRE').length, 1);
    });

    it('the retry budget bounds everything else (setRetryPolicy)', async () => {
      const c = await plain(Redis, node);
      const { sem } = await setup(node, c);
      setRetryPolicy(c, { budgetMs: 400 });
      node.always('SEM.GET', 'TRYAGAIN');
      const start = performance.now();
      await assert.rejects(sem.get(),
        (e) => e instanceof RetriesExhaustedError && /retry budget of 400 ms/.test(e.message));
      assert.ok(performance.now() - start < 2000);
      setRetryPolicy(c, { budgetMs: 0 });
      node.received.length = 0;
      await assert.rejects(sem.get(), RetriesExhaustedError);
      assert.equal(node.sent('SEM.GET').length, 1, 'budget 0: sent once');
    });

    it('MOVED on a plain client: MovedError, which says to use Redis.Cluster', async () => {
      const c = await plain(Redis, node);
      const { sem, lease } = await setup(node, c);
      node.script('SEM.ACQUIRE', { moved: '127.0.0.1:7777' });
      await assert.rejects(sem.acquire(lease, 1, 1), (e) => {
        assert.ok(e instanceof MovedError);
        assert.equal(e.address, '127.0.0.1:7777');
        assert.equal(e.slot, keySlot(NS));
        assert.match(e.message, /^MOVED \d+ 127\.0\.0\.1:7777: .*new Redis\.Cluster/);
        return true;
      });
      assert.equal(node.sent('SEM.ACQUIRE').length, 1, 'not followed');
    });

    it('heartbeat survives a window of CLUSTERDOWN and a dropped connection: not reported lost', async () => {
      const c = await plain(Redis, node);
      const lease2 = await Lease.create(c, NS, 'short', 2);
      const lost = [];
      const hb = lease2.heartbeat({ fraction: 0.25, onLost: (e) => lost.push(e) }); // every 500 ms
      try {
        assert.ok(await waitFor(() => hb.refreshes >= 1, 3000), 'a first refresh');
        node.during('LEASE.REFRESH', 900, 'CLUSTERDOWN');
        node.script('LEASE.REFRESH', 'DROP');
        const refreshes = hb.refreshes;
        await sleep(2500);
        assert.deepEqual(lost, []);
        assert.equal(hb.lost, false);
        assert.ok(hb.refreshes >= refreshes + 2, `refreshes ${hb.refreshes}`);
        assert.ok(node.sent('LEASE.REFRESH').length > hb.refreshes + 2, 'refreshes were re-sent');
        assert.equal(node.expired.has(lease2.id), false, 'the fake node never saw it expire');
        assert.ok(node._lease(NS, lease2.id));
      } finally {
        await hb.stop();
      }
    });

    it('heartbeat: NOTFOUND on refresh still reports the lease lost', async () => {
      const c = await plain(Redis, node);
      const lease = await Lease.create(c, NS, 'doomed', 2);
      let seen = null;
      const hb = lease.heartbeat({ fraction: 0.2, onLost: (e) => { seen = e; } });
      try {
        assert.ok(await waitFor(() => hb.refreshes >= 1, 3000), 'a first refresh');
        node.script('LEASE.REFRESH', 'TRYAGAIN'); // retried, and then:
        node.leases.delete(lease.id);
        assert.ok(await waitFor(() => hb.lost, 3000), 'loss reported');
        assert.ok(seen instanceof LeaseLostError);
        assert.match(seen.cause.message, /^NOTFOUND/);
      } finally {
        await hb.stop();
      }
    });

    it('heartbeat: a stop() during re-sends does not wait for the lease to run out', async () => {
      const c = await plain(Redis, node);
      const lease = await Lease.create(c, NS, 'stopping', 30);
      const hb = lease.heartbeat({ fraction: 0.01 }); // every 300 ms
      node.always('LEASE.REFRESH', 'CLUSTERDOWN');
      await sleep(600);
      const start = performance.now();
      await hb.stop();
      assert.ok(performance.now() - start < 1000);
      assert.equal(hb.lost, false);
    });

    it('withPermit through a LEADERCHANGED acquire and a TRYAGAIN release', async () => {
      const c = await plain(Redis, node);
      const { sem, lease } = await setup(node, c);
      node.script('SEM.ACQUIRE', 'LEADERCHANGED');
      node.script('SEM.RELEASE', 'TRYAGAIN');
      const token = await withPermit(sem, lease, 1, 1, async (t) => t);
      assert.equal(typeof token, 'bigint');
      assert.equal(node._sem(NS, 'db').holds.size, 0);
    });
  });

  describe(`permitd.js retries, ${label} Cluster`, () => {
    let a;
    let b;
    beforeEach(async () => {
      a = await new FakeNode().start();
      b = await new FakeNode().start();
      // b stands for another node of the same cluster: the same replicated state
      b.leases = a.leases;
      b.semaphores = a.semaphores;
    });
    afterEach(async () => {
      await a.stop();
      await b.stop();
    });

    it('TRYAGAIN: the Cluster re-sends itself, and its re-sends carry what is left of the timeout', async () => {
      const c = await cluster(Redis, a);
      const { sem, lease } = await setup(a, c);
      a.script('SEM.ACQUIRE', { delay: 150, then: 'TRYAGAIN' }, 'TRYAGAIN');
      const res = await sem.acquire(lease, 1, 2);
      assert.equal(res.outcome, ACQUIRED);
      const sent = timeouts(a);
      assert.equal(sent.length, 3, 'three writes of one command: the Cluster\'s own retries');
      assert.ok(sent[0] === 2 && sent[1] < 1.85 && sent[2] < sent[1], `timeouts ${sent}`);
    });

    it('a parked acquire answered MOVED: followed by the Cluster to the new leader with the time left', async () => {
      const c = await cluster(Redis, a);
      const { sem, lease } = await setup(a, c);
      a.leader = () => b.address;
      a.script('SEM.ACQUIRE', { delay: 400, then: { moved: b.address } });
      const res = await sem.acquire(lease, 1, 2);
      assert.equal(res.outcome, ACQUIRED);
      assert.equal(timeouts(a)[0], 2);
      const [onB] = timeouts(b);
      assert.ok(onB < 1.65, `the new leader got ${onB} s`);
    });

    it('LEADERCHANGED is left to the helper: re-sent with the same lease, the committed token returned', async () => {
      const c = await cluster(Redis, a);
      const { sem, lease } = await setup(a, c);
      a.script('SEM.ACQUIRE', 'LEADERCHANGED');
      const res = await sem.acquire(lease, 2, 1);
      assert.equal(a.sent('SEM.ACQUIRE').length, 2);
      assert.equal(res.fencingToken, BigInt(a._sem(NS, 'db').holds.get(lease.id).token));
    });

    it('CLUSTERDOWN to the end: the Cluster\'s tries, then the helper\'s; bounded, none waits late', async () => {
      const c = await cluster(Redis, a);
      const { sem, lease } = await setup(a, c);
      a.always('SEM.ACQUIRE', 'CLUSTERDOWN');
      const start = performance.now();
      await assert.rejects(sem.acquire(lease, 1, 0.5), (e) => {
        assert.ok(e instanceof RetriesExhaustedError);
        assert.match(e.cause.message, /^Too many Cluster redirections\. Last error: .*CLUSTERDOWN/);
        return true;
      });
      const took = performance.now() - start;
      // the Cluster's 16 tries 100 ms apart before the helper sees an error: about 1.7 s
      assert.ok(took >= 450 && took < 6000, `took ${took} ms`);
      const sent = a.sent('SEM.ACQUIRE');
      // written after the deadline (0.5 s), received a little later
      const late = sent.filter((r) => r.at - start > 800);
      assert.ok(late.length > 0 && late.every((r) => r.args[4] === '0'), 'past the deadline: timeout 0');
    });

    it('a Cluster lease heartbeat beats through CLUSTERDOWN', async () => {
      const c = await cluster(Redis, a);
      const lease = await Lease.create(c, NS, 'cl', 2);
      const hb = lease.heartbeat({ fraction: 0.25 });
      try {
        assert.ok(await waitFor(() => hb.refreshes >= 1, 3000), 'a first refresh');
        a.during('LEASE.REFRESH', 800, 'CLUSTERDOWN');
        const refreshes = hb.refreshes;
        await sleep(1800);
        assert.equal(hb.lost, false, hb.error && hb.error.message);
        assert.ok(hb.refreshes > refreshes);
        assert.equal(a.expired.has(lease.id), false);
      } finally {
        await hb.stop();
      }
    });
  });
}

async function waitFor(pred, ms) {
  const end = performance.now() + ms;
  while (performance.now() < end) {
    if (await pred()) return true;
    await sleep(20);
  }
  return false;
}
