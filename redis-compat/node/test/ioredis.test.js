'use strict';
// ioredis against permitd with plain `call`, pipelines and MULTI, under every client setup.
const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const {
  SETUPS, connect, closeAll, asMap, newNamespace, newLease, newName, waitFor, infoNumber, sleep,
} = require('./common');

/** The CLIENT LIST line of connection `id`, or undefined. */
async function clientLine(r, id) {
  return String(await r.call('CLIENT', 'LIST')).split('\n').find((l) => l.startsWith(`id=${id} `));
}

/** Parked in `cmd` (SEM.ACQUIRE by default): Redis's flags=b and cmd=sem.acquire. */
async function isBlocked(r, id, cmd = 'sem.acquire') {
  const line = await clientLine(r, id);
  return !!line && / flags=b /.test(line) && line.includes(` cmd=${cmd} `);
}

const SEM_FIELDS = ['name', 'description', 'permits', 'active_holds', 'active_holders_count', 'waiters', 'version',
  'created_at', 'updated_at', 'last_activity_at', 'metadata'];

for (const setup of SETUPS) {
  describe(setup.name, () => {
    let r;
    let ns;
    before(async () => {
      r = await connect(setup);
      ns = await newNamespace(r);
    });
    after(async () => {
      await r.call('NS.DELETE', ns);
      await closeAll();
    });

    it('connects: HELLO/INFO ready check pass, CLIENT INFO shows the protocol', async () => {
      assert.equal(r.status, 'ready');
      const info = await r.call('CLIENT', 'INFO');
      assert.match(String(info), new RegExp(`resp=${setup.proto} `));
      assert.match(String(info), /lib-name=ioredis /);
      const server = String(await r.info('server'));
      assert.match(server, /^redis_version:/m);
      const persistence = String(await r.info('persistence'));
      assert.match(persistence, /^loading:0\r?$/m);
      assert.equal(await r.ping(), 'PONG');
      assert.equal(await r.echo('hi'), 'hi');
    });

    it('entity replies: shape, field order, types', async () => {
      const raw = await r.call('SEM.CREATE', ns, 'shape', 3, 'DESC', 'db pool', 'META', 'owner', 'a');
      if (setup.options.replyMapping === 'resp3') {
        assert.ok(!Array.isArray(raw) && typeof raw === 'object');
        assert.deepEqual(Object.keys(raw), SEM_FIELDS);
      } else {
        assert.ok(Array.isArray(raw));
        assert.deepEqual(raw.filter((_, i) => i % 2 === 0), SEM_FIELDS);
      }
      const sem = asMap(raw);
      assert.equal(sem.name, 'shape');
      assert.equal(sem.description, 'db pool');
      assert.equal(sem.permits, '3'); // stringNumbers: integers as decimal strings
      assert.equal(sem.active_holds, '0');
      assert.equal(sem.version, '1');
      assert.ok(BigInt(sem.created_at) > 1600000000n * 10n ** 9n);
      assert.equal(sem.created_at, sem.updated_at);
      assert.equal(sem.created_at, sem.last_activity_at);
      assert.deepEqual(asMap(sem.metadata), { owner: 'a' });

      const lease = asMap(await r.call('LEASE.CREATE', ns, 'worker-1', 30));
      assert.match(lease.lease_id, /^ls_[0-9A-Za-z]{28}$/);
      const ttl = BigInt(lease.expires_at) - BigInt(lease.created_at);
      assert.equal(ttl, 30n * 10n ** 9n);
      assert.deepEqual(asMap(lease.metadata), {});
    });

    it('acquire outcomes, fencing tokens, holders, release', async () => {
      await r.call('SEM.CREATE', ns, 'acq', 3);
      const a = await newLease(r, ns, 'a');
      const b = await newLease(r, ns, 'b');
      const got = asMap(await r.call('SEM.ACQUIRE', ns, 'acq', a, 2, 0, 'META', 'job', '7'));
      assert.equal(got.outcome, 'ACQUIRE_OUTCOME_ACQUIRED');
      assert.equal(asMap(got.semaphore).active_holds, '2');
      const t1 = BigInt(got.fencing_token);

      const un = asMap(await r.call('SEM.ACQUIRE', ns, 'acq', b, 2, 0));
      assert.equal(un.outcome, 'ACQUIRE_OUTCOME_UNAVAILABLE');
      assert.equal(un.fencing_token, undefined);

      const start = Date.now();
      const to = asMap(await r.call('SEM.ACQUIRE', ns, 'acq', b, 2, '0.25'));
      assert.equal(to.outcome, 'ACQUIRE_OUTCOME_TIMED_OUT');
      assert.ok(Date.now() - start >= 240, `waited ${Date.now() - start} ms`);

      const got2 = asMap(await r.call('SEM.ACQUIRE', ns, 'acq', b, 1, 0));
      assert.equal(got2.outcome, 'ACQUIRE_OUTCOME_ACQUIRED');
      assert.ok(BigInt(got2.fencing_token) > t1);

      const page = asMap(await r.call('SEM.HOLDERS', ns, 'acq'));
      const holders = page.holders.map(asMap);
      assert.deepEqual(holders.map((h) => h.lease_id), [a, b]);
      assert.deepEqual(holders.map((h) => h.weight), ['2', '1']);
      assert.deepEqual(asMap(holders[0].metadata), { job: '7' });
      assert.equal(page.next_cursor, '');

      const rel = asMap(await r.call('SEM.RELEASE', ns, 'acq', a));
      assert.equal(rel.active_holds, '1');
      assert.equal(rel.active_holders_count, '1');
    });

    it('server errors reject with the code word', async () => {
      await r.call('SEM.CREATE', ns, 'err', 2);
      const a = await newLease(r, ns);
      await assert.rejects(r.call('SEM.ACQUIRE', ns, 'err', a, 3, 1),
        { message: 'INVALIDARG weight exceeds semaphore permits' });
      await assert.rejects(r.call('SEM.GET', ns, 'missing'), { message: /^NOTFOUND / });
      await assert.rejects(r.call('SEM.CREATE', ns, 'err', 2), { message: /^ALREADYEXISTS / });
      await assert.rejects(r.call('SEM.ACQUIRE', ns, 'err'),
        { message: "ERR wrong number of arguments for 'sem.acquire' command" });
      await assert.rejects(r.call('LEASE.CREATE', ns, 'w', 'ten'),
        { message: 'ERR value is not an integer or out of range' });
      await assert.rejects(r.call('SEM.ACQUIRE', ns, 'err', a, 1, 'later'),
        { message: 'ERR timeout is not a float or out of range' });
      await assert.rejects(r.call('LEASE.GET', ns, 'ls_' + 'A'.repeat(28)), { message: /^NOTFOUND / });
      await assert.rejects(r.call('SELECT', 1), { message: /^ERR / });
      assert.equal(await r.call('SELECT', 0), 'OK');
      // the connection is still usable
      assert.equal(asMap(await r.call('SEM.GET', ns, 'err')).active_holds, '0');
    });

    it('.pipeline(): replies in order, errors inline, a parked acquire holds the rest', async () => {
      await r.call('SEM.CREATE', ns, 'pipe', 2);
      const a = await newLease(r, ns, 'a');
      const b = await newLease(r, ns, 'b');
      const start = Date.now();
      const res = await r.pipeline()
        .call('SEM.ACQUIRE', ns, 'pipe', a, 2, 0)
        .call('SEM.ACQUIRE', ns, 'pipe', b, 1, '0.3')
        .call('SEM.RELEASE', ns, 'pipe', a)
        .call('SEM.ACQUIRE', ns, 'pipe', b, 1, 0)
        .call('SEM.GET', ns, 'missing')
        .ping()
        .exec();
      assert.ok(Date.now() - start >= 290);
      assert.equal(res.length, 6);
      assert.equal(res[0][0], null);
      assert.equal(asMap(res[0][1]).outcome, 'ACQUIRE_OUTCOME_ACQUIRED');
      assert.equal(asMap(res[1][1]).outcome, 'ACQUIRE_OUTCOME_TIMED_OUT');
      assert.equal(asMap(res[2][1]).active_holds, '0');
      assert.equal(asMap(res[3][1]).outcome, 'ACQUIRE_OUTCOME_ACQUIRED');
      assert.match(res[4][0].message, /^NOTFOUND /);
      assert.deepEqual(res[5], [null, 'PONG']);
    });

    it('.multi(): atomic in one namespace, acquire never waits inside it', async () => {
      await r.call('SEM.CREATE', ns, 'tx', 1);
      const a = await newLease(r, ns, 'a');
      const b = await newLease(r, ns, 'b');
      const start = Date.now();
      const res = await r.multi()
        .call('SEM.ACQUIRE', ns, 'tx', a, 1, 0)
        .call('SEM.ACQUIRE', ns, 'tx', b, 1, 10)
        .call('SEM.HOLDERS', ns, 'tx')
        .exec();
      assert.ok(Date.now() - start < 5000);
      assert.equal(asMap(res[0][1]).outcome, 'ACQUIRE_OUTCOME_ACQUIRED');
      assert.equal(asMap(res[1][1]).outcome, 'ACQUIRE_OUTCOME_UNAVAILABLE');
      assert.deepEqual(asMap(res[2][1]).holders.map((h) => asMap(h).lease_id), [a]);

      // an error inside EXEC does not stop the others
      const res2 = await r.multi()
        .call('SEM.RELEASE', ns, 'tx', a)
        .call('SEM.GET', ns, 'nope')
        .call('SEM.ACQUIRE', ns, 'tx', b, 1, 0)
        .exec();
      assert.equal(asMap(res2[0][1]).active_holds, '0');
      assert.match(res2[1][0].message, /^NOTFOUND /);
      assert.equal(asMap(res2[2][1]).outcome, 'ACQUIRE_OUTCOME_ACQUIRED');
    });

    it('.multi() across namespaces: EXEC answers CROSSSLOT and nothing runs', async () => {
      const other = await newNamespace(r);
      try {
        await assert.rejects(
          r.multi().call('SEM.CREATE', ns, 'x1', 1).call('SEM.CREATE', other, 'x2', 1).exec(),
          (err) => /CROSSSLOT/.test(err.message) || /CROSSSLOT/.test(String(err.previousErrors)),
        );
        await assert.rejects(r.call('SEM.GET', ns, 'x1'), { message: /^NOTFOUND / });
        await assert.rejects(r.call('SEM.GET', other, 'x2'), { message: /^NOTFOUND / });
      } finally {
        await r.call('NS.DELETE', other);
      }
    });

    it('a parked acquire is released from another connection; its connection waits behind it', async () => {
      await r.call('SEM.CREATE', ns, 'park', 1);
      const a = await newLease(r, ns, 'a');
      const b = await newLease(r, ns, 'b');
      await r.call('SEM.ACQUIRE', ns, 'park', a, 1, 0);
      const waiter = await connect(setup);
      const id = await waiter.call('CLIENT', 'ID');
      const order = [];
      const started = Date.now();
      const parked = waiter.call('SEM.ACQUIRE', ns, 'park', b, 1, 10).then((x) => { order.push('acquire'); return x; });
      const behind = waiter.ping().then((x) => { order.push('ping'); return x; });
      assert.ok(await waitFor(() => isBlocked(r, id)));
      // INFO counts it (other suites may park clients on the same server at the same time)
      assert.ok((await infoNumber(r, 'clients', 'blocked_clients')) >= 1);
      assert.ok((await infoNumber(r, 'semaphores', 'waiters')) >= 1);
      await sleep(200);
      assert.deepEqual(order, []); // the PING is queued behind the parked acquire
      const releasedAt = Date.now();
      await r.call('SEM.RELEASE', ns, 'park', a);
      const got = asMap(await parked);
      assert.equal(await behind, 'PONG');
      assert.deepEqual(order, ['acquire', 'ping']);
      assert.equal(got.outcome, 'ACQUIRE_OUTCOME_ACQUIRED');
      assert.ok(Date.now() - releasedAt < 3000, 'woken by the release, not the 10 s timeout');
      assert.ok(Date.now() - started >= 200);
      waiter.disconnect();
    });

    it('a parked SEM.ACQUIREALL is woken by the release of its last missing semaphore', async () => {
      await r.call('SEM.CREATE', ns, 'all1', 1);
      await r.call('SEM.CREATE', ns, 'all2', 3);
      const a = await newLease(r, ns, 'a');
      const b = await newLease(r, ns, 'b');
      await r.call('SEM.ACQUIRE', ns, 'all1', a, 1, 0);
      await r.call('SEM.ACQUIRE', ns, 'all2', a, 2, 0);
      const waiter = await connect(setup);
      const id = await waiter.call('CLIENT', 'ID');
      const parked = waiter.call('SEM.ACQUIREALL', ns, b, 10, 'all2', 3, 'all1', 1);
      parked.catch(() => {}); // awaited below; a rejection must not go unhandled meanwhile
      assert.ok(await waitFor(() => isBlocked(r, id, 'sem.acquireall')));
      await r.call('SEM.RELEASE', ns, 'all2', a);
      await sleep(300);
      assert.ok(await isBlocked(r, id, 'sem.acquireall'), 'all1 is still taken: still parked');
      assert.equal(Number(asMap(await r.call('SEM.GET', ns, 'all2')).active_holds), 0, 'nothing held meanwhile');
      const releasedAt = Date.now();
      await r.call('SEM.RELEASE', ns, 'all1', a);
      const got = asMap(await parked);
      assert.ok(Date.now() - releasedAt < 3000, 'woken by the release, not the 10 s timeout');
      assert.equal(got.outcome, 'ACQUIRE_OUTCOME_ACQUIRED');
      const holds = got.holds.map(asMap);
      assert.deepEqual(holds.map((h) => String(asMap(h.semaphore).name)), ['all2', 'all1']);
      assert.ok(holds.every((h) => h.fencing_token !== undefined));
      assert.equal(Number(asMap(await r.call('SEM.GET', ns, 'all2')).active_holds), 3);
      waiter.disconnect();
    });

    it('CLIENT UNBLOCK TIMEOUT / ERROR from another connection', async () => {
      await r.call('SEM.CREATE', ns, 'unb', 1);
      const a = await newLease(r, ns, 'a');
      const b = await newLease(r, ns, 'b');
      await r.call('SEM.ACQUIRE', ns, 'unb', a, 1, 0);
      const waiter = await connect(setup);
      const id = await waiter.call('CLIENT', 'ID');

      let p = waiter.call('SEM.ACQUIRE', ns, 'unb', b, 1, 20);
      assert.ok(await waitFor(() => isBlocked(r, id)));
      assert.equal(String(await r.call('CLIENT', 'UNBLOCK', id, 'TIMEOUT')), '1');
      assert.equal(asMap(await p).outcome, 'ACQUIRE_OUTCOME_TIMED_OUT');

      p = waiter.call('SEM.ACQUIRE', ns, 'unb', b, 1, 20);
      assert.ok(await waitFor(() => isBlocked(r, id)));
      // Watched before the unblock: the waiter's error comes before CLIENT UNBLOCK's answer.
      const rejected = assert.rejects(p, { message: 'UNBLOCKED client unblocked via CLIENT UNBLOCK' });
      assert.equal(String(await r.call('CLIENT', 'UNBLOCK', id, 'ERROR')), '1');
      await rejected;
      waiter.disconnect();
    });

    it('commandTimeout below the acquire timeout: ioredis gives up, the server still grants', async () => {
      // Why permitd.js refuses such a call: the promise rejects while the acquire stays parked.
      await r.call('SEM.CREATE', ns, 'ct', 1);
      const a = await newLease(r, ns, 'a');
      const b = await newLease(r, ns, 'b');
      await r.call('SEM.ACQUIRE', ns, 'ct', a, 1, 0);
      const impatient = await connect(setup, { commandTimeout: 200 });
      const p = impatient.call('SEM.ACQUIRE', ns, 'ct', b, 1, 3);
      await assert.rejects(p, { message: 'Command timed out' });
      await r.call('SEM.RELEASE', ns, 'ct', a);
      assert.ok(await waitFor(async () => asMap(await r.call('SEM.HOLDERS', ns, 'ct')).holders
        .map((h) => asMap(h).lease_id).join() === b));
      impatient.disconnect();
    });

    it('a waiter whose connection drops is never granted', async () => {
      await r.call('SEM.CREATE', ns, 'drop', 1);
      const a = await newLease(r, ns, 'a');
      const b = await newLease(r, ns, 'b');
      await r.call('SEM.ACQUIRE', ns, 'drop', a, 1, 0);
      const waiter = await connect(setup, { retryStrategy: () => null });
      const id = await waiter.call('CLIENT', 'ID');
      const p = waiter.call('SEM.ACQUIRE', ns, 'drop', b, 1, 10).catch((e) => e);
      assert.ok(await waitFor(() => isBlocked(r, id)));
      waiter.disconnect();
      assert.ok((await p) instanceof Error);
      assert.ok(await waitFor(async () => !(await clientLine(r, id))));
      await r.call('SEM.RELEASE', ns, 'drop', a);
      await sleep(100);
      assert.deepEqual(asMap(await r.call('SEM.HOLDERS', ns, 'drop')).holders, []);
    });
  });
}

describe('number precision', () => {
  it('without stringNumbers, nanosecond integers lose precision (why the helper needs it)', async () => {
    const setup = SETUPS[0];
    const plain = await connect(setup, { stringNumbers: false });
    const exact = await connect(setup);
    const ns = await newNamespace(exact);
    try {
      const id = await newLease(exact, ns);
      const lossy = asMap(await plain.call('LEASE.GET', ns, id)).expires_at;
      const precise = asMap(await exact.call('LEASE.GET', ns, id)).expires_at;
      assert.equal(typeof lossy, 'number');
      assert.ok(!Number.isSafeInteger(lossy));
      assert.equal(typeof precise, 'string');
      assert.equal(BigInt(Math.round(lossy)) / 1000000n, BigInt(precise) / 1000000n);
    } finally {
      await exact.call('NS.DELETE', ns);
      await closeAll();
    }
  });

  it('a fresh namespace name is unique', () => {
    assert.notEqual(newName(), newName());
  });
});
