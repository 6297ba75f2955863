'use strict';
// The permitd.js helper: Semaphore, Lease, withPermit, Heartbeat, under ioredis 5 and 6.
const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { SETUPS, connect, closeAll, newNamespace, sleep, waitFor } = require('./common');
const {
  ACQUIRED, UNAVAILABLE, TIMED_OUT, Lease, Heartbeat, Semaphore, withPermit, NotAcquiredError, LeaseLostError,
  parseAcquire, withPermits, NotAcquiredAllError,
} = require('../permitd');

for (const setup of [SETUPS[0], SETUPS[1], SETUPS[2]]) {
  describe(`permitd.js with ${setup.name}`, () => {
    let r;
    let ns;
    before(async () => {
      r = await connect(setup);
      ns = await newNamespace(r, 'jsh');
    });
    after(async () => {
      await r.call('NS.DELETE', ns);
      await closeAll();
    });

    it('refuses a client without stringNumbers', async () => {
      const lossy = await connect(setup, { stringNumbers: false });
      assert.throws(() => new Semaphore(lossy, ns, 'x'), /stringNumbers: true/);
      await assert.rejects(Lease.create(lossy, ns, 'w', 10), /stringNumbers: true/);
    });

    it('refuses an acquire timeout not below the client commandTimeout', async () => {
      const impatient = await connect(setup, { commandTimeout: 1000 });
      const sem = new Semaphore(impatient, ns, 'nowhere');
      await assert.rejects(sem.acquire('ls_x', 1, 2), RangeError);
      await assert.rejects(sem.acquire('ls_x', 1, 1), /commandTimeout/);
      // below it: sent (and answered by the server)
      await assert.rejects(sem.acquire('ls_x', 1, 0.5), { message: /^NOTFOUND/ });
    });

    it('Semaphore.acquire / release / holders with typed results', async () => {
      await r.call('SEM.CREATE', ns, 'pool', 3);
      const sem = new Semaphore(r, ns, 'pool');
      const lease = await Lease.create(r, ns, 'worker-1', 30, { host: 'h1' });
      assert.match(lease.id, /^ls_[0-9A-Za-z]{28}$/);
      assert.equal(lease.info.process_id, 'worker-1');
      assert.deepEqual(lease.info.metadata, { host: 'h1' });
      assert.equal(typeof lease.info.expires_at, 'bigint');
      assert.ok(!JSON.stringify(lease).includes('ls_'), 'the lease id is a secret');

      const res = await sem.acquire(lease, 2, 0, { job: '1' });
      assert.equal(res.outcome, ACQUIRED);
      assert.equal(res.acquired, true);
      assert.equal(typeof res.fencingToken, 'bigint');
      assert.equal(res.semaphore.active_holds, 2);
      assert.equal(res.semaphore.permits, 3);

      const other = await Lease.create(r, ns, 'worker-2', 30);
      const un = await sem.acquire(other, 2);
      assert.equal(un.outcome, UNAVAILABLE);
      assert.equal(un.acquired, false);
      assert.equal(un.fencingToken, null);

      const to = await sem.acquire(other.id, 2, 0.2);
      assert.equal(to.outcome, TIMED_OUT);

      const page = await sem.holders();
      assert.deepEqual(page.holders.map((h) => h.lease_id), [lease.id]);
      assert.equal(page.holders[0].fencing_token, res.fencingToken);
      assert.deepEqual(page.holders[0].metadata, { job: '1' });
      assert.equal(page.holders[0].weight, 2);

      assert.equal((await sem.release(lease)).active_holds, 0);
      assert.equal((await sem.release(lease)).active_holds, 0); // no-op
      await assert.rejects(sem.acquire(lease, 4, 1), { message: 'INVALIDARG weight exceeds semaphore permits' });
    });

    it('withPermit: runs fn with the token and always releases', async () => {
      await r.call('SEM.CREATE', ns, 'wp', 2);
      const sem = new Semaphore(r, ns, 'wp');
      const lease = await Lease.create(r, ns, 'w', 30);
      const out = await withPermit(sem, lease, 2, 1, async (token) => {
        assert.equal(typeof token, 'bigint');
        assert.equal((await sem.get()).active_holds, 2);
        return 'done';
      });
      assert.equal(out, 'done');
      assert.equal((await sem.get()).active_holds, 0);

      await assert.rejects(withPermit(sem, lease, 1, 0, async () => { throw new Error('body failed'); }),
        { message: 'body failed' });
      assert.equal((await sem.get()).active_holds, 0);

      const tokens = [];
      await withPermit(sem, lease, 1, 0, (t) => tokens.push(t));
      await withPermit(sem, lease, 1, 0, (t) => tokens.push(t));
      assert.ok(tokens[1] > tokens[0]);
    });

    it('withPermits: all or none, tokens in order, every hold released', async () => {
      await r.call('SEM.CREATE', ns, 'wa', 2);
      await r.call('SEM.CREATE', ns, 'wb', 1);
      const a = new Semaphore(r, ns, 'wa');
      const b = new Semaphore(r, ns, 'wb');
      const lease = await Lease.create(r, ns, 'w', 30);
      const other = await Lease.create(r, ns, 'o', 30);
      const out = await withPermits([[b, 1], [a, 2]], lease, 1, async (tokens) => {
        assert.equal(tokens.length, 2);
        assert.ok(tokens.every((t) => typeof t === 'bigint') && tokens[0] < tokens[1]);
        assert.equal((await a.get()).active_holds, 2);
        // other fits neither a nor b now: it gets nothing, and fn does not run
        let ran = false;
        await assert.rejects(withPermits([[a, 1], [b, 1]], other, 0.2, () => { ran = true; }), (err) => {
          assert.ok(err instanceof NotAcquiredAllError && err instanceof NotAcquiredError);
          assert.equal(err.outcome, TIMED_OUT);
          assert.deepEqual(err.semaphores.map((s) => s.name), ['wa', 'wb']);
          return true;
        });
        assert.equal(ran, false);
        return 'done';
      });
      assert.equal(out, 'done');
      assert.equal((await a.get()).active_holds, 0);
      assert.equal((await b.get()).active_holds, 0);
      await assert.rejects(withPermits([[a, 1], [b, 1]], lease, 0, async () => { throw new Error('body failed'); }),
        { message: 'body failed' });
      assert.equal((await b.get()).active_holds, 0);
      await assert.rejects(withPermits([[a, 1], [b, 1]], lease, 0, () => r.call('LEASE.REVOKE', ns, lease.id)),
        LeaseLostError);
      await assert.rejects(Semaphore.acquireAll([[a, 3]], other),
        { message: "INVALIDARG weight exceeds semaphore permits of 'wa'" });
    });

    it('withPermit: NotAcquiredError when the outcome is not ACQUIRED, fn not run', async () => {
      await r.call('SEM.CREATE', ns, 'na', 1);
      const sem = new Semaphore(r, ns, 'na');
      const a = await Lease.create(r, ns, 'a', 30);
      const b = await Lease.create(r, ns, 'b', 30);
      await sem.acquire(a, 1);
      let ran = false;
      await assert.rejects(withPermit(sem, b, 1, 0.2, () => { ran = true; }), (err) => {
        assert.ok(err instanceof NotAcquiredError);
        assert.equal(err.outcome, TIMED_OUT);
        assert.equal(err.semaphore.active_holds, 1);
        assert.match(err.message, /not acquired/);
        return true;
      });
      await assert.rejects(withPermit(sem, b, 1, 0, () => { ran = true; }), { outcome: UNAVAILABLE });
      assert.equal(ran, false);
    });

    it('withPermit: LeaseLostError when the lease died during fn', async () => {
      await r.call('SEM.CREATE', ns, 'll', 1);
      const sem = new Semaphore(r, ns, 'll');
      const lease = await Lease.create(r, ns, 'w', 30);
      await assert.rejects(withPermit(sem, lease, 1, 0, () => lease.revoke()), LeaseLostError);
      assert.equal((await sem.get()).active_holds, 0);
    });

    it('withPermit waits server-side until another connection releases', async () => {
      await r.call('SEM.CREATE', ns, 'wait', 1);
      const other = await connect(setup);
      const a = await Lease.create(other, ns, 'a', 30);
      const b = await Lease.create(r, ns, 'b', 30);
      await new Semaphore(other, ns, 'wait').acquire(a, 1);
      setTimeout(() => new Semaphore(other, ns, 'wait').release(a), 300);
      const start = Date.now();
      const waited = await withPermit(new Semaphore(r, ns, 'wait'), b, 1, 10, () => Date.now() - start);
      assert.ok(waited >= 250 && waited < 6000, `waited ${waited} ms`);
    });

    it('heartbeat keeps a lease (and its hold) alive past its ttl', async () => {
      await r.call('SEM.CREATE', ns, 'hb', 2);
      const sem = new Semaphore(r, ns, 'hb');
      // ttl 3 s, refreshed every 0.6 s: 2.4 s of slack for a loaded machine, where one
      // LEASE.REFRESH under --fsync always can take a second
      const lease = await Lease.create(r, ns, 'beating', 3);
      const silent = await Lease.create(r, ns, 'silent', 3);
      await sem.acquire(lease, 1);
      await sem.acquire(silent, 1);
      const lostErrors = [];
      const near = (a, b) => Math.abs(a - b) < 1e-6;
      assert.ok(near(new Heartbeat(lease).intervalMs, 1000)); // default: a third of the ttl
      const hb = lease.heartbeat({ fraction: 0.2, onLost: (e) => lostErrors.push(e) });
      assert.ok(near(hb.intervalMs, 600));
      // the main connection parks in an acquire meanwhile: the heartbeat has its own connection
      const other = await Lease.create(r, ns, 'other', 30);
      const parked = sem.acquire(other, 2, 6.5);
      await sleep(6500);
      assert.equal(hb.lost, false, `heartbeat lost the lease: ${hb.error && hb.error.message}`);
      assert.deepEqual(lostErrors, []);
      assert.ok(hb.refreshes >= 5, `refreshes ${hb.refreshes}`);
      assert.equal((await parked).outcome, TIMED_OUT);
      assert.equal((await lease.get()).lease_id, lease.id);
      assert.deepEqual((await sem.holders()).holders.map((h) => h.lease_id), [lease.id]);
      await assert.rejects(lease.client.call('LEASE.GET', ns, silent.id), { message: /^NOTFOUND/ });
      await hb.stop();
      await sleep(3300);
      await assert.rejects(lease.get(), { message: /^NOTFOUND/ });
      assert.equal((await sem.get()).active_holds, 0);
    });

    it('heartbeat reports loss after LEASE.REVOKE', async () => {
      const lease = await Lease.create(r, ns, 'doomed', 3);
      let seen = null;
      const hb = lease.heartbeat({ fraction: 0.1, onLost: (e) => { seen = e; } });
      try {
        assert.ok(await waitFor(() => hb.refreshes >= 1, 5000), 'a first refresh');
        assert.equal(hb.lost, false);
        await lease.revoke();
        assert.ok(await waitFor(() => hb.lost, 6000), 'loss reported');
        assert.ok(seen instanceof LeaseLostError);
        assert.equal(hb.error, seen);
        assert.match(seen.message, /NOTFOUND/);
        assert.match(seen.cause.message, /^NOTFOUND/);
      } finally {
        await hb.stop();
      }
    });

    it('parseAcquire reads .multi() results', async () => {
      await r.call('SEM.CREATE', ns, 'px', 2);
      const lease = await Lease.create(r, ns, 'w', 30);
      const res = await r.multi()
        .call('SEM.ACQUIRE', ns, 'px', lease.id, 1, 0)
        .call('SEM.ACQUIRE', ns, 'px', lease.id, 2, 0)
        .exec();
      const [first, second] = res.map(([err, reply]) => { assert.equal(err, null); return parseAcquire(reply); });
      assert.ok(first.acquired && second.acquired);
      assert.equal(first.fencingToken, second.fencingToken);
      assert.equal(second.semaphore.active_holds, 2);
    });
  });
}
