'use strict';
// peers.js: the client side of scripts/bench-peers. One Node process, one code path for every
// peer; only the adapter (how a worker acquires and releases) differs:
//
//   permitd          SEM.ACQUIRE ns sem lease weight timeout (parks server-side, FIFO) and
//                    SEM.RELEASE, each worker on its own connection under its own lease.
//   redis-semaphore  npm redis-semaphore on redis-server: Semaphore (weight 1) and
//                    MultiSemaphore (weight > 1) on one key, default options (retryInterval
//                    10 ms, acquireTimeout 10 s, lockTimeout 10 s), each worker on its own
//                    ioredis connection. A TimeoutError (acquireTimeout) is retried, as an
//                    application that needs the permits would; the wait counts from the first
//                    attempt.
//   fair-lua         redis-compat/lua/fair_acquire.lua + fair_release.lua on redis-server: a
//                    ticket queue, the head takes permits, waiters re-call with their ticket
//                    every 10 ms (redis-semaphore's default retryInterval), each worker on its
//                    own ioredis connection.
//
// Modes (each prints one JSON object to --out):
//   contention  W workers share a semaphore of P permits; each does R rounds of
//               acquire -> hold H ms -> release; every --heavy-every'th worker asks for weight
//               --heavy-weight. Wait (grant latency), utilisation, Jain's index.
//   handoff     a 1-permit semaphore, one holder and one waiter: release -> waiter's grant.
//   idle        N waiters parked on a full semaphore for S seconds: server commands/s (INFO
//               total_commands_processed) and CPU (/proc/PID/stat utime+stime).
//   expiry      a holder stops refreshing (ttl 1 s): its expiry -> a waiter's grant.
//   memory      fill a server with N leases + holders over K semaphores, pipelined; VmRSS.
//   fairtest    quick correctness checks of the fair Lua scripts (exits non-zero on failure).
//
// Every loop is bounded by a count and a deadline; only 127.0.0.1 is contacted.

const fs = require('node:fs');
const path = require('node:path');
const crypto = require('node:crypto');
const { performance } = require('node:perf_hooks');
const Redis = require('ioredis');
const { Semaphore, MultiSemaphore, TimeoutError } = require('redis-semaphore');

const HOST = '127.0.0.1';
const ROOT = path.resolve(__dirname, '..', '..');
const LUA_DIR = path.join(ROOT, 'redis-compat', 'lua');
const ACQUIRED = 'ACQUIRE_OUTCOME_ACQUIRED';
const RETRY_MS = 10; // the fair-lua poll interval = redis-semaphore's default retryInterval
const TICKET_TTL_MS = 5000; // a fair-lua ticket not polled for 5 s goes stale
const MAX_PERMITD_TIMEOUT_S = 300; // SEM.ACQUIRE's largest timeout (SPEC §6)

const now = () => performance.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const log = (...a) => console.error('[peers.js]', ...a);

// ------------------------------------------------------------------------------------------
// arguments

function parseArgs(argv) {
  const mode = argv[0];
  const o = {};
  for (let i = 1; i < argv.length; i++) {
    const a = argv[i];
    if (!a.startsWith('--')) throw new Error(`unexpected argument ${a}`);
    const k = a.slice(2).replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    const v = argv[i + 1];
    if (v === undefined || v.startsWith('--')) {
      o[k] = true;
    } else {
      o[k] = /^-?\d+(\.\d+)?$/.test(v) ? Number(v) : v;
      i++;
    }
  }
  return { mode, o };
}

// ------------------------------------------------------------------------------------------
// connections

async function connect(port, extra = {}) {
  const c = new Redis({
    host: HOST,
    port,
    lazyConnect: true,
    maxRetriesPerRequest: 2,
    retryStrategy: (n) => (n > 5 ? null : 50 * n),
    ...extra,
  });
  c.on('error', () => {}); // surfaced through the command promises
  await c.connect();
  return c;
}

/** Runs `fn(i)` for i in 0..n with at most `limit` at once. */
async function pool(n, limit, fn) {
  const out = new Array(n);
  let next = 0;
  const runners = Array.from({ length: Math.min(limit, n) }, async () => {
    while (next < n) {
      const i = next++;
      out[i] = await fn(i);
    }
  });
  await Promise.all(runners);
  return out;
}

function field(flat, name) {
  if (!Array.isArray(flat)) return undefined;
  for (let i = 0; i + 1 < flat.length; i += 2) if (String(flat[i]) === name) return flat[i + 1];
  return undefined;
}

function infoField(text, name) {
  const m = new RegExp(`^${name}:(.*)$`, 'm').exec(String(text));
  return m ? m[1].trim() : undefined;
}

function procCpuTicks(pid) {
  // /proc/PID/stat: fields after the ")" of comm; utime and stime are fields 14 and 15.
  const s = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const rest = s.slice(s.lastIndexOf(')') + 2).split(' ');
  return Number(rest[11]) + Number(rest[12]);
}

function procRssKb(pid) {
  const s = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const m = /^VmRSS:\s+(\d+) kB/m.exec(s);
  return m ? Number(m[1]) : NaN;
}

const CLK_TCK = 100; // scripts/bench-peers checks `getconf CLK_TCK` and passes --clk-tck

/** Wall clock in ms with sub-ms resolution: Date.now() anchored to performance.now(). */
function wallClock() {
  let off = -Infinity;
  for (let i = 0; i < 2000; i++) off = Math.max(off, Date.now() - performance.now());
  return () => off + performance.now();
}

const uniq = (p) => `${p}_${process.pid}_${crypto.randomBytes(4).toString('hex')}`;

// ------------------------------------------------------------------------------------------
// peers

class PermitdPeer {
  constructor(port) {
    this.port = port;
    this.kind = 'permitd';
    this.ns = uniq('peers');
  }
  async init() {
    this.ctl = await connect(this.port, { stringNumbers: true });
    await this.ctl.call('NS.CREATE', this.ns);
  }
  async createSem(name, permits) {
    await this.ctl.call('SEM.CREATE', this.ns, name, permits);
  }
  async blockedClients() {
    return Number(infoField(await this.ctl.info('clients'), 'blocked_clients'));
  }
  async worker(sem, permits, opt = {}) {
    const c = await connect(this.port, { stringNumbers: true });
    const ttl = opt.leaseTtlS || MAX_PERMITD_TIMEOUT_S;
    const lease = await c.call('LEASE.CREATE', this.ns, opt.processId || 'bench', ttl);
    const id = String(field(lease, 'lease_id'));
    const ns = this.ns;
    const w = {
      client: c,
      lease: id,
      expiresAt: String(field(lease, 'expires_at')),
      attempts: 0,
      timeouts: 0,
      async acquire(weight, timeoutMs) {
        const t = Math.min(MAX_PERMITD_TIMEOUT_S, Math.max(0, timeoutMs / 1000));
        const r = await c.call('SEM.ACQUIRE', ns, sem, id, weight, t.toFixed(3));
        w.attempts++;
        const out = String(field(r, 'outcome'));
        if (out !== ACQUIRED) w.timeouts++;
        return out === ACQUIRED;
      },
      async release() {
        await c.call('SEM.RELEASE', ns, sem, id);
      },
      async close() {
        c.disconnect();
      },
    };
    return w;
  }
  async close() {
    try {
      await this.ctl.call('NS.DELETE', this.ns);
    } catch (_) {}
    this.ctl.disconnect();
  }
}

class RedisSemaphorePeer {
  constructor(port) {
    this.port = port;
    this.kind = 'redis-semaphore';
  }
  async init() {
    this.ctl = await connect(this.port);
  }
  async createSem() {} // redis-semaphore keeps no semaphore object: the key is the semaphore
  async worker(sem, permits, opt = {}) {
    const c = await connect(this.port);
    const lockOpts = opt.lockOpts || {}; // default options unless a test says otherwise
    const objs = new Map();
    const lockFor = (weight) => {
      if (!objs.has(weight)) {
        objs.set(
          weight,
          weight === 1
            ? new Semaphore(c, sem, permits, lockOpts)
            : new MultiSemaphore(c, sem, permits, weight, lockOpts),
        );
      }
      return objs.get(weight);
    };
    // Count the attempts (each acquire attempt is one EVALSHA of the library's acquire script).
    const evalsha = c.evalsha.bind(c);
    const w = {
      client: c,
      attempts: 0,
      timeouts: 0,
      current: null,
      abort: new AbortController(),
      async acquire(weight, timeoutMs) {
        const lock = lockFor(weight);
        const end = now() + timeoutMs;
        for (let k = 0; k < 100000; k++) {
          const left = end - now();
          if (left <= 0 || w.abort.signal.aborted) return false;
          const signal = AbortSignal.any([w.abort.signal, AbortSignal.timeout(Math.ceil(left))]);
          try {
            await lock.acquire(signal);
            w.current = lock;
            return true;
          } catch (e) {
            if (e instanceof TimeoutError && !signal.aborted) {
              w.timeouts++; // the library's acquireTimeout (10 s): ask again
              continue;
            }
            if (signal.aborted) return false;
            throw e;
          }
        }
        return false;
      },
      async release() {
        const l = w.current;
        w.current = null;
        await l.release();
      },
      async close() {
        w.abort.abort();
        for (const l of objs.values()) l.stopRefresh();
        c.disconnect();
      },
      identifier: (weight) => lockFor(weight).identifier,
    };
    c.evalsha = (...a) => evalsha(...a).finally(() => w.attempts++);
    return w;
  }
  async close() {
    this.ctl.disconnect();
  }
}

class FairLuaPeer {
  constructor(port) {
    this.port = port;
    this.kind = 'fair-lua';
  }
  async init() {
    this.ctl = await connect(this.port);
    this.acquireSha = await this.ctl.script(
      'LOAD',
      fs.readFileSync(path.join(LUA_DIR, 'fair_acquire.lua'), 'utf8'),
    );
    this.releaseSha = await this.ctl.script(
      'LOAD',
      fs.readFileSync(path.join(LUA_DIR, 'fair_release.lua'), 'utf8'),
    );
  }
  keys(sem) {
    const t = `{fair:${sem}}`;
    return [`${t}:holders`, `${t}:weights`, `${t}:queue`, `${t}:tickets`, `${t}:seq`];
  }
  async createSem() {} // the permits travel with every call, as with acquire.lua
  async worker(sem, permits, opt = {}) {
    const c = await connect(this.port);
    const keys = this.keys(sem);
    const { acquireSha, releaseSha } = this;
    const holdTtl = opt.holdTtlMs || 10000; // = redis-semaphore's default lockTimeout
    const id = opt.id || `ls_${crypto.randomBytes(14).toString('hex')}`;
    const w = {
      client: c,
      id,
      attempts: 0,
      timeouts: 0,
      stopped: false,
      async acquire(weight, timeoutMs) {
        const end = now() + timeoutMs;
        let ticket = '';
        for (let k = 0; k < 10000000; k++) {
          const r = await c.evalsha(
            acquireSha, 5, ...keys, id, weight, permits, holdTtl, TICKET_TTL_MS, ticket,
          );
          w.attempts++;
          if (r[0] === 1) return true;
          ticket = String(r[2]);
          if (now() + RETRY_MS >= end || w.stopped) {
            await c.evalsha(releaseSha, 4, ...keys.slice(0, 4), id); // withdraw the ticket
            w.timeouts++;
            return false;
          }
          await sleep(RETRY_MS);
        }
        return false;
      },
      async release() {
        await c.evalsha(releaseSha, 4, ...keys.slice(0, 4), id);
      },
      async close() {
        w.stopped = true;
        c.disconnect();
      },
    };
    return w;
  }
  async close() {
    this.ctl.disconnect();
  }
}

function makePeer(kind, port) {
  if (kind === 'permitd') return new PermitdPeer(port);
  if (kind === 'redis-semaphore') return new RedisSemaphorePeer(port);
  if (kind === 'fair-lua') return new FairLuaPeer(port);
  throw new Error(`unknown peer ${kind}`);
}

async function serverCommands(peer) {
  return Number(infoField(await peer.ctl.info('stats'), 'total_commands_processed'));
}

// ------------------------------------------------------------------------------------------
// statistics

function quantile(sorted, q) {
  if (!sorted.length) return null;
  const rank = Math.ceil(q * sorted.length);
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1];
}

function summary(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const mean = s.length ? s.reduce((a, b) => a + b, 0) / s.length : null;
  return {
    n: s.length,
    p50: quantile(s, 0.5),
    p90: quantile(s, 0.9),
    p99: quantile(s, 0.99),
    max: s.length ? s[s.length - 1] : null,
    mean,
  };
}

function jain(xs) {
  if (!xs.length) return null;
  const sum = xs.reduce((a, b) => a + b, 0);
  const sq = xs.reduce((a, b) => a + b * b, 0);
  return sq === 0 ? 1 : (sum * sum) / (xs.length * sq);
}

const round3 = (x) => (x === null || x === undefined ? x : Math.round(x * 1000) / 1000);

// ------------------------------------------------------------------------------------------
// contention

async function contention(peer, o) {
  const W = o.workers;
  const P = o.permits;
  const sem = uniq('cont');
  await peer.createSem(sem, P);
  const heavyEvery = o.heavyEvery || 10;
  const heavyWeight = o.heavyWeight || 5;
  const weightOf = (i) => (i % heavyEvery === heavyEvery - 1 ? heavyWeight : 1);
  log(`${peer.kind} contention: ${W} workers, ${P} permits, hold ${o.hold} ms, ${o.rounds} rounds`);
  const workers = await pool(W, 50, () => peer.worker(sem, P));
  const cmd0 = await serverCommands(peer);
  const cpu0 = o.serverPid ? procCpuTicks(o.serverPid) : 0;
  const cli0 = process.cpuUsage();
  const T0 = now();
  const deadline = T0 + o.deadline * 1000;
  const recs = [];
  await Promise.all(
    workers.map(async (w, i) => {
      const weight = weightOf(i);
      for (let r = 0; r < o.rounds; r++) {
        const t0 = now();
        if (t0 >= deadline) break;
        const ok = await w.acquire(weight, deadline - t0);
        const t1 = now();
        if (!ok) {
          recs.push({ i, weight, t0, t1, ok: false });
          break;
        }
        await sleep(o.hold);
        const t2 = now();
        await w.release();
        const t3 = now();
        recs.push({ i, weight, t0, t1, t2, t3, ok: true });
      }
    }),
  );
  const T1 = now();
  const cmd1 = await serverCommands(peer);
  const cpu1 = o.serverPid ? procCpuTicks(o.serverPid) : 0;
  const cli = process.cpuUsage(cli0);
  const timeouts = workers.reduce((a, w) => a + w.timeouts, 0);
  const attempts = workers.reduce((a, w) => a + w.attempts, 0);
  await pool(W, 100, (i) => workers[i].close());

  // Utilisation: sweep over holds [grant received, release acknowledged] and waits
  // [acquire sent, grant received].
  const ev = [];
  for (const r of recs) {
    ev.push([r.t0, 0, 1]);
    ev.push([r.t1, 0, -1]);
    if (r.ok) {
      ev.push([r.t1, r.weight, 0]);
      ev.push([r.t3, -r.weight, 0]);
    }
  }
  ev.sort((a, b) => a[0] - b[0]);
  let held = 0;
  let waiting = 0;
  let last = T0;
  let waitTime = 0;
  let fullWhileWaiting = 0;
  let heldWhileWaiting = 0;
  for (const [t, dw, dn] of ev) {
    const dt = t - last;
    if (waiting > 0 && dt > 0) {
      waitTime += dt;
      if (held >= P) fullWhileWaiting += dt;
      heldWhileWaiting += dt * Math.min(held, P);
    }
    held += dw;
    waiting += dn;
    last = t;
  }

  const waits = recs.map((r) => r.t1 - r.t0);
  const light = recs.filter((r) => r.weight === 1).map((r) => r.t1 - r.t0);
  const heavy = recs.filter((r) => r.weight !== 1).map((r) => r.t1 - r.t0);
  const perWorker = new Map();
  for (const r of recs) {
    const a = perWorker.get(r.i) || [];
    a.push(r.t1 - r.t0);
    perWorker.set(r.i, a);
  }
  const meanOf = (a) => a.reduce((x, y) => x + y, 0) / a.length;
  const workerMeans = [...perWorker.values()].map(meanOf);
  const meansBy = (heavyWorkers) =>
    [...perWorker.entries()]
      .filter(([i]) => (weightOf(i) !== 1) === heavyWorkers)
      .map(([, a]) => meanOf(a));
  const extremes = (xs) => {
    const s = [...xs].sort((a, b) => a - b);
    return { n: s.length, min: round3(s[0]), p50: round3(quantile(s, 0.5)), max: round3(s[s.length - 1]) };
  };
  const granted = recs.filter((r) => r.ok).length;
  const grantedUnits = recs.filter((r) => r.ok).reduce((a, r) => a + r.weight, 0);
  const secs = (T1 - T0) / 1000;
  return {
    mode: 'contention',
    peer: peer.kind,
    workers: W,
    permits: P,
    hold_ms: o.hold,
    rounds: o.rounds,
    heavy_every: heavyEvery,
    heavy_weight: heavyWeight,
    duration_s: round3(secs),
    deadline_s: o.deadline,
    requests: recs.length,
    granted,
    not_granted_by_deadline: recs.length - granted,
    library_timeouts: peer.kind === 'redis-semaphore' ? timeouts : null,
    acquire_attempts: attempts,
    grants_per_s: round3(granted / secs),
    permit_ms_per_s: round3((grantedUnits * o.hold) / secs),
    server_commands: cmd1 - cmd0 - 1,
    server_commands_per_grant: round3((cmd1 - cmd0 - 1) / Math.max(1, granted)),
    server_cpu_s: o.serverPid ? (cpu1 - cpu0) / (o.clkTck || CLK_TCK) : null,
    client_cpu_s: round3((cli.user + cli.system) / 1e6),
    wait_ms: mapRound(summary(waits)),
    light_wait_ms: mapRound(summary(light)),
    heavy_wait_ms: mapRound(summary(heavy)),
    utilisation_full: round3(waitTime ? fullWhileWaiting / waitTime : null),
    utilisation_mean: round3(waitTime ? heldWhileWaiting / waitTime / P : null),
    waiting_time_share: round3(waitTime / (T1 - T0)),
    jain_worker_mean_wait: round3(jain(workerMeans)),
    jain_request_wait: round3(jain(waits)),
    worker_mean_wait_ms: { light: extremes(meansBy(false)), heavy: extremes(meansBy(true)) },
    raw: {
      light_wait_ms: light.map((x) => Math.round(x * 100) / 100),
      heavy_wait_ms: heavy.map((x) => Math.round(x * 100) / 100),
    },
  };
}

function mapRound(s) {
  const out = {};
  for (const [k, v] of Object.entries(s)) out[k] = k === 'n' ? v : round3(v);
  return out;
}

// ------------------------------------------------------------------------------------------
// hand-off

async function handoff(peer, o) {
  const sem = uniq('ho');
  await peer.createSem(sem, 1);
  const a = await peer.worker(sem, 1);
  const b = await peer.worker(sem, 1);
  if (!(await a.acquire(1, 5000))) throw new Error('hand-off: the first holder got nothing');
  let holder = a;
  let waiter = b;
  const samples = [];
  const end = now() + o.maxSeconds * 1000;
  log(`${peer.kind} hand-off: ${o.count} samples`);
  for (let i = 0; i < o.warmup + o.count; i++) {
    if (now() > end) throw new Error(`hand-off: --max-seconds reached after ${i} samples`);
    let t1 = 0;
    const before = waiter.attempts;
    const got = waiter.acquire(1, 10000).then((ok) => {
      t1 = now();
      return ok;
    });
    // The waiter is parked (permitd: INFO blocked_clients) or has polled at least once.
    const give = now() + 5000;
    for (;;) {
      if (peer.kind === 'permitd' ? (await peer.blockedClients()) >= 1 : waiter.attempts > before) break;
      if (now() > give) throw new Error('hand-off: the waiter never parked / polled');
      if (peer.kind !== 'permitd') await sleep(1);
    }
    // A random delay, so the release lands at a random phase of a poller's retry interval
    // (--no-gap: release at once, a permitd-only variant that keeps the machine awake).
    if (!o.noGap) await sleep(15 + Math.random() * 10);
    const t0 = now();
    await holder.release();
    if (!(await got)) throw new Error('hand-off: the waiter was not granted');
    if (i >= o.warmup) samples.push(t1 - t0);
    [holder, waiter] = [waiter, holder];
  }
  await holder.release();
  await a.close();
  await b.close();
  const us = samples.map((x) => x * 1000);
  return {
    mode: 'handoff',
    peer: peer.kind,
    gap: !o.noGap,
    count: samples.length,
    latency_us: mapRound(summary(us)),
    raw: { latency_us: us.map((x) => Math.round(x)) },
  };
}

// ------------------------------------------------------------------------------------------
// idle cost

async function idle(peer, o) {
  const P = o.permits || 10;
  const N = o.waiters;
  const sem = uniq('idle');
  await peer.createSem(sem, P);
  // The holder takes every permit and keeps them through the window (permitd: lease ttl
  // 300 s; fair-lua: hold ttl 300 s; redis-semaphore: default lockTimeout 10 s, kept by the
  // library's own refresh every 8 s, as a real holder would).
  const holder = await peer.worker(sem, P, { holdTtlMs: 300000 });
  if (!(await holder.acquire(P, 5000))) throw new Error('idle: the holder got nothing');
  log(`${peer.kind} idle: ${N} waiters for ${o.seconds} s`);
  const waiters = await pool(N, 200, () => peer.worker(sem, P, { holdTtlMs: 300000 }));
  const waitFor = (o.seconds + 120) * 1000;
  let grantedCount = 0;
  const pending = waiters.map((w) =>
    w.acquire(1, waitFor).then(
      (ok) => {
        if (ok) grantedCount++;
        return ok;
      },
      () => false,
    ),
  );
  // All parked (permitd) / polling (the others), then one more second to settle.
  const give = now() + 60000;
  for (;;) {
    if (peer.kind === 'permitd') {
      if ((await peer.blockedClients()) >= N) break;
    } else if (waiters.every((w) => w.attempts > 0)) break;
    if (now() > give) throw new Error('idle: the waiters did not all park / poll within 60 s');
    await sleep(50);
  }
  await sleep(1000);
  const sent = () => waiters.reduce((a, w) => a + w.attempts, 0);
  const a0 = sent();
  const c0 = await serverCommands(peer);
  const cpu0 = procCpuTicks(o.serverPid);
  const cli0 = process.cpuUsage();
  const t0 = now();
  await sleep(o.seconds * 1000);
  const c1 = await serverCommands(peer);
  const cpu1 = procCpuTicks(o.serverPid);
  const t1 = now();
  const a1 = sent();
  const cli = process.cpuUsage(cli0);
  const secs = (t1 - t0) / 1000;
  const blocked = peer.kind === 'permitd' ? await peer.blockedClients() : null;
  const granted = grantedCount;
  // Stop the waiters: permitd's leave the queue when their connection closes.
  await pool(N, 100, (i) => waiters[i].close());
  await Promise.race([Promise.all(pending), sleep(5000)]);
  // permitd: a waiter whose connection closed leaves the queue (SPEC §3); check it did.
  let left = null;
  if (peer.kind === 'permitd') {
    const until = now() + 5000;
    for (;;) {
      const info = await peer.ctl.info();
      left = {
        blocked_clients: Number(infoField(info, 'blocked_clients')),
        waiters: Number(infoField(info, 'waiters')),
      };
      if ((left.blocked_clients === 0 && left.waiters === 0) || now() > until) break;
      await sleep(100);
    }
  }
  await holder.release().catch(() => {});
  await holder.close();
  const cmds = c1 - c0 - 1; // the second INFO counts the first (Redis) or itself (permitd)
  return {
    mode: 'idle',
    peer: peer.kind,
    waiters: N,
    permits: P,
    seconds: round3(secs),
    server_commands: cmds,
    server_commands_per_s: round3(cmds / secs),
    client_requests: a1 - a0,
    client_requests_per_s: round3((a1 - a0) / secs),
    server_cpu_s: (cpu1 - cpu0) / (o.clkTck || CLK_TCK),
    server_cpu_pct: round3((100 * (cpu1 - cpu0)) / (o.clkTck || CLK_TCK) / secs),
    client_cpu_pct: round3((100 * (cli.user + cli.system)) / 1e6 / secs),
    blocked_clients: blocked,
    granted_during_idle: granted,
    after_disconnect: left,
  };
}

// ------------------------------------------------------------------------------------------
// expiry reclaim

async function expiry(peer, o) {
  const trials = [];
  log(`${peer.kind} expiry: ${o.trials} trials`);
  for (let k = 0; k < o.trials; k++) {
    const sem = uniq('exp');
    await peer.createSem(sem, 1);
    const wall = wallClock();
    let holder;
    let expiresAtMs;
    if (peer.kind === 'permitd') {
      holder = await peer.worker(sem, 1, { leaseTtlS: 1 });
      if (!(await holder.acquire(1, 1000))) throw new Error('expiry: holder got nothing');
      expiresAtMs = Number(BigInt(holder.expiresAt) / 1000n) / 1000; // ns -> ms (µs precision)
    } else if (peer.kind === 'redis-semaphore') {
      // lockTimeout 1 s, and no refresh: the holder "crashed" right after acquiring.
      holder = await peer.worker(sem, 1, { lockOpts: { lockTimeout: 1000, refreshInterval: 0 } });
      if (!(await holder.acquire(1, 1000))) throw new Error('expiry: holder got nothing');
      const score = await peer.ctl.zscore(`semaphore:${sem}`, holder.identifier(1));
      expiresAtMs = Number(score) + 1000; // acquire.lua: expired once now - lockTimeout >= score
    } else {
      holder = await peer.worker(sem, 1, { holdTtlMs: 1000 });
      if (!(await holder.acquire(1, 1000))) throw new Error('expiry: holder got nothing');
      const score = await peer.ctl.zscore(peer.keys(sem)[0], holder.id);
      expiresAtMs = Number(score); // pruned once TIME (ms) >= score
    }
    // The waiter uses the same settings as the holder (redis-semaphore's waiter judges expiry
    // with its own lockTimeout).
    const waiter = await peer.worker(sem, 1, {
      leaseTtlS: 30,
      holdTtlMs: 1000,
      lockOpts: { lockTimeout: 1000, refreshInterval: 0 },
    });
    const ok = await waiter.acquire(1, 5000);
    const t = wall();
    if (!ok) throw new Error('expiry: the waiter was not granted within 5 s');
    trials.push(t - expiresAtMs);
    await waiter.release().catch(() => {});
    await holder.close();
    await waiter.close();
  }
  return {
    mode: 'expiry',
    peer: peer.kind,
    trials: trials.length,
    reclaim_ms: mapRound(summary(trials)),
    raw: { reclaim_ms: trials.map(round3) },
  };
}

// ------------------------------------------------------------------------------------------
// memory

const B62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
function leaseLikeId() {
  // 31 bytes like a permitd lease id ("ls_" + 28 base62), so both servers store equal ids.
  const b = crypto.randomBytes(28);
  let s = 'ls_';
  for (const x of b) s += B62[x % 62];
  return s;
}

async function memory(o) {
  const N = o.leases;
  const K = o.sems;
  const perSem = Math.ceil(N / K);
  const BATCH = 10000;
  const pid = o.serverPid;
  const c = await connect(o.port, { stringNumbers: o.target === 'permitd' });
  const rss = { empty_kb: procRssKb(pid) };
  const t0 = now();
  const batches = async (total, add, check) => {
    for (let i = 0; i < total; i += BATCH) {
      const p = c.pipeline();
      for (let j = i; j < Math.min(total, i + BATCH); j++) add(p, j);
      const res = await p.exec();
      for (let j = 0; j < res.length; j++) {
        if (res[j][0]) throw new Error(`command ${i + j}: ${res[j][0].message}`);
        if (check) check(res[j][1], i + j);
      }
      if (now() - t0 > o.maxSeconds * 1000) throw new Error('memory: --max-seconds reached');
    }
  };
  const out = { mode: 'memory', target: o.target, leases: N, semaphores: K, holders_per_semaphore: perSem };
  log(`memory ${o.target}: ${N} leases + holders over ${K} semaphores`);
  if (o.target === 'permitd') {
    const ns = 'mem';
    await c.call('NS.DELETE', ns); // a fresh server has none; a re-run starts clean
    await c.call('NS.CREATE', ns);
    await batches(K, (p, j) => p.call('SEM.CREATE', ns, `s${j}`, perSem));
    rss.semaphores_kb = procRssKb(pid);
    const ids = new Array(N);
    await batches(
      N,
      (p, j) => p.call('LEASE.CREATE', ns, `p${j}`, o.leaseTtl),
      (r, j) => {
        ids[j] = String(field(r, 'lease_id'));
      },
    );
    rss.leases_kb = procRssKb(pid);
    let acquired = 0;
    await batches(
      N,
      (p, j) => p.call('SEM.ACQUIRE', ns, `s${j % K}`, ids[j], 1, 0),
      (r) => {
        if (String(field(r, 'outcome')) === ACQUIRED) acquired++;
      },
    );
    out.acquired = acquired;
    rss.holders_kb = procRssKb(pid);
    const info = await c.info('semaphores');
    out.info = {
      leases: Number(infoField(info, 'leases')),
      holders: Number(infoField(info, 'holders')),
      semaphores: Number(infoField(info, 'semaphores')),
    };
    out.sample_lease_id = ids[0];
  } else if (o.target === 'lua') {
    const sha = await c.script('LOAD', fs.readFileSync(path.join(LUA_DIR, 'acquire.lua'), 'utf8'));
    let acquired = 0;
    await batches(
      N,
      (p, j) => {
        const t = `{mem:s${j % K}}`;
        p.evalsha(sha, 2, `${t}:holders`, `${t}:weights`, leaseLikeId(), 1, perSem, o.leaseTtl * 1000);
      },
      (r) => {
        if (r[0] === 1) acquired++;
      },
    );
    out.acquired = acquired;
    rss.holders_kb = procRssKb(pid);
  } else if (o.target === 'redis-semaphore') {
    // The library's own acquire script (read from the installed package), with the
    // arguments Semaphore.acquire sends: key, limit, identifier (a UUID), lockTimeout, now.
    const src = fs.readFileSync(require.resolve('redis-semaphore/lib/semaphore/acquire/lua.js'), 'utf8');
    const script = /createEval\)\(`([\s\S]*?)`/.exec(src)[1];
    const sha = await c.script('LOAD', script);
    let acquired = 0;
    const when = Date.now();
    await batches(
      N,
      (p, j) => p.evalsha(sha, 1, `semaphore:mem:s${j % K}`, perSem, crypto.randomUUID(), o.leaseTtl * 1000, when),
      (r) => {
        if (Number(r) === 1) acquired++;
      },
    );
    out.acquired = acquired;
    rss.holders_kb = procRssKb(pid);
  } else {
    throw new Error(`unknown --target ${o.target}`);
  }
  out.fill_s = round3((now() - t0) / 1000);
  if (o.target !== 'permitd') {
    const info = await c.info('memory');
    out.used_memory = Number(infoField(info, 'used_memory'));
    out.dbsize = await c.dbsize();
  }
  c.disconnect();
  await sleep(o.settle === undefined ? 2000 : o.settle * 1000); // the fill connection is gone
  rss.settled_kb = procRssKb(pid);
  out.rss = rss;
  out.bytes_per_lease_holder = round3(((rss.settled_kb - rss.empty_kb) * 1024) / N);
  return out;
}

// ------------------------------------------------------------------------------------------
// fair Lua: correctness checks (quick, deterministic)

async function fairtest(o) {
  const peer = new FairLuaPeer(o.port);
  await peer.init();
  const c = peer.ctl;
  const sem = uniq('ft');
  const keys = peer.keys(sem);
  const acq = (id, weight, permits, ticket = '', extra = []) =>
    c.evalsha(peer.acquireSha, 5, ...keys, id, weight, permits, 60000, 300, ticket, ...extra);
  const rel = (id) => c.evalsha(peer.releaseSha, 4, ...keys.slice(0, 4), id);
  const eq = (got, want, what) => {
    if (JSON.stringify(got) !== JSON.stringify(want)) {
      throw new Error(`fairtest: ${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
    }
  };
  eq(await acq('a', 2, 3), [1, 2, 0, 0], 'free permits are granted at once');
  const b = await acq('b', 3, 3);
  eq([b[0], b[3]], [0, 1], 'a heavy request that does not fit takes ticket 1');
  eq(await acq('c', 1, 3, '', ['NOWAIT']), [0, 2, 0, 0], 'NOWAIT does not jump the queue');
  const cT = await acq('c', 1, 3);
  eq([cT[0], cT[3]], [0, 2], 'a light request behind the heavy one queues (1 permit is free)');
  eq((await acq('c', 1, 3, cT[2]))[0], 0, 'only the head may take permits');
  eq(await rel('a'), [1, 0, 0], 'release gives the permits back');
  eq((await acq('c', 1, 3, cT[2]))[0], 0, 'the light one still waits behind the head');
  eq(await acq('b', 3, 3, b[2]), [1, 3, 0, 0], 'the head is granted on its next poll');
  eq((await acq('c', 1, 3, cT[2]))[3], 1, 'the next one is now the head');
  await sleep(400); // c's ticket goes stale (ticket ttl 300 ms in this test)
  const c2 = await acq('d', 1, 3);
  eq(c2[3], 1, 'a stale ticket leaves the queue: the next caller is the head');
  const cAgain = await acq('c', 1, 3, cT[2]);
  eq([cAgain[0], cAgain[3]], [0, 2], 'a stale ticket re-queues at the tail');
  eq((await rel('d'))[2], 1, 'release withdraws a ticket');
  eq((await rel('b'))[0], 1, 'the heavy one releases');
  eq((await acq('c', 1, 3, String(cAgain[2])))[0], 1, 'the head is granted after the release');
  await c.del(...keys);
  await peer.close();
  return { mode: 'fairtest', ok: true };
}

// ------------------------------------------------------------------------------------------

async function main() {
  const { mode, o } = parseArgs(process.argv.slice(2));
  const hardStop = setTimeout(() => {
    log(`${mode}: --max-seconds (${o.maxSeconds || 600}) passed; giving up`);
    process.exit(3);
  }, (o.maxSeconds || 600) * 1000 + 30000);
  hardStop.unref();
  let res;
  if (mode === 'memory') res = await memory(o);
  else if (mode === 'fairtest') res = await fairtest(o);
  else {
    const peer = makePeer(o.peer, o.port);
    await peer.init();
    if (mode === 'contention') res = await contention(peer, o);
    else if (mode === 'handoff') res = await handoff(peer, o);
    else if (mode === 'idle') res = await idle(peer, o);
    else if (mode === 'expiry') res = await expiry(peer, o);
    else throw new Error(`unknown mode ${mode}`);
    await peer.close();
  }
  res.loadavg = fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
  const text = JSON.stringify(res);
  if (o.out) fs.writeFileSync(o.out, text + '\n');
  else console.log(text);
  const brief = { ...res };
  delete brief.raw;
  log(JSON.stringify(brief));
  process.exit(0);
}

main().catch((e) => {
  log('error:', e && e.stack ? e.stack : e);
  process.exit(1);
});
