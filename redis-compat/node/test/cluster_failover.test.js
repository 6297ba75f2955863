'use strict';
// ioredis Cluster across real failovers (SPEC §10): a 3-node permitd cluster of its own, started
// from PERMITD_BIN, whose leader is killed with SIGKILL three times while workers keep acquiring
// and releasing; once with ioredis 5 (RESP2), once with ioredis 6 (RESP3).
//
// Each worker is what a user would write: a `new Redis.Cluster([3 nodes], OPTIONS)`, a lease of
// its own (refreshed every second) and a loop of SEM.ACQUIRE ... 1 0 / SEM.RELEASE on one
// semaphore of fewer permits than workers. An error is retried by the loop after a short pause;
// after an error on an acquire (its outcome may be unknown: LEADERCHANGED, a closed connection)
// the worker sends SEM.RELEASE until it is answered before it goes on, so that it never holds a
// permit without knowing it. ioredis hides most of a failover by itself: MOVED, TRYAGAIN,
// CLUSTERDOWN and "Connection is closed" are re-sent (16 tries in all, `maxRedirections`), and
// were a slots refresh to find no node serving (permitd keeps showing the last leader's slots
// during an election, so it does not) it would drop every connection and reconnect
// (`clusterRetryStrategy`), keeping the commands queued meanwhile. What gets past it reaches the loop and is counted by
// kind; seen so far: "Too many Cluster redirections. Last error: Error: Connection is closed."
//
// Asserted, as a user would check it:
// - after each kill, every worker gets an answer to a command sent after the kill within 3 s
//   (SPEC §10), and some worker acquires a permit within 3 s;
// - never more permits held at once than the semaphore has, counting a hold from its ACQUIRED
//   reply to the first send of its SEM.RELEASE;
// - fencing tokens rise: an acquire sent after another one's ACQUIRED reply gets a larger token;
// - no lease is lost, and once every worker has stopped the semaphore has no holds left.
//
// Runs only when PERMITD_BIN names the server binary (skipped otherwise, so the suite can still
// run against a single server with run.sh PORT); a PERMITD_BIN that is not an executable fails.
// The failover gaps (p50 and max per kill and worker) and the errors by kind are printed.
const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { performance } = require('node:perf_hooks');
const { Redis5, Redis6 } = require('./common');
const { asMap, sleep } = require('./util');

const BIN = process.env.PERMITD_BIN;
const HOST = '127.0.0.1';
const NODES = 3;
const KILLS = 3;
const WORKERS = 4;
const PERMITS = 2;
const LEASE_TTL = 10; // seconds
const REFRESH_EVERY_MS = 1000;
const HOLD_MS = 20; // how long a worker keeps a permit
const PAUSE_MS = 10; // between a worker's iterations (the machine may have 2 cores for everything)
const ERROR_PAUSE_MS = 50; // after an error reached the loop
const STEADY_MS = 1000; // traffic on a settled cluster before each kill
const FAILOVER_LIMIT_MS = 3000; // SPEC §10
const START_TIMEOUT_MS = 30000;
const REJOIN_TIMEOUT_MS = 20000;
const ACQUIRED = 'ACQUIRE_OUTCOME_ACQUIRED';
const UNAVAILABLE = 'ACQUIRE_OUTCOME_UNAVAILABLE';

// The Cluster options a user would set for failovers; everything else is ioredis's default.
// - clusterRetryStrategy: when every node connection is gone (a refresh found no node), try
//   again after 100 ms, then up to 500 ms, instead of up to 2 s (default 100 + 2 * times, at
//   most 2000): a failover takes about 2 s, so a 2 s step could alone miss the 3 s.
// - retryDelayOnFailover / retryDelayOnClusterDown / retryDelayOnTryAgain: the pause before a
//   command is re-sent after "Connection is closed" / CLUSTERDOWN / TRYAGAIN (each also
//   refreshes the slots for the first two); 100 ms each by default, kept at 100 ms.
// - retryDelayOnMoved: 0 (default): follow a MOVED at once; maxRedirections 16 (default) tries.
// - slotsRefreshTimeout: 1000 ms (default) for CLUSTER SLOTS, which a dead node cannot answer.
// - redisOptions.stringNumbers: integers as strings (nanosecond timestamps exceed 2^53).
const OPTIONS = {
  clusterRetryStrategy: (times) => Math.min(100 * times, 500),
  retryDelayOnFailover: 100,
  retryDelayOnClusterDown: 100,
  retryDelayOnTryAgain: 100,
  retryDelayOnMoved: 0,
  slotsRefreshTimeout: 1000,
  redisOptions: { stringNumbers: true },
};

const now = () => performance.now();

/** A port free on 127.0.0.1, below the ephemeral range (32768-) so that no outgoing connection
 * takes it while its node is down, and not in `taken`. */
async function freePort(taken) {
  for (let i = 0; i < 200; i++) {
    const port = 15000 + Math.floor(Math.random() * 17000);
    if (taken.has(port)) continue;
    const ok = await new Promise((resolve) => {
      const s = net.createServer();
      s.once('error', () => resolve(false));
      s.listen(port, HOST, () => s.close(() => resolve(true)));
    });
    if (ok) {
      taken.add(port);
      return port;
    }
  }
  throw new Error('no free port found');
}

/** `INFO section` as { field: value }, a "k=v,k=v" value as an object; null if no answer. */
async function info(port, section) {
  const c = new Redis5({
    host: HOST, port, lazyConnect: true, connectTimeout: 1000, commandTimeout: 1000,
    maxRetriesPerRequest: 0, retryStrategy: () => null, enableOfflineQueue: false,
  });
  c.on('error', () => {});
  try {
    await c.connect();
    const text = String(await c.info(section));
    const fields = {};
    for (const line of text.split(/\r?\n/)) {
      const i = line.indexOf(':');
      if (i < 0 || line.startsWith('#')) continue;
      const value = line.slice(i + 1);
      fields[line.slice(0, i)] = /^[a-z_]+=/.test(value)
        ? Object.fromEntries(value.split(',').map((kv) => kv.split('=', 2)))
        : value;
    }
    return fields;
  } catch {
    return null;
  } finally {
    c.disconnect();
  }
}

// setpriv (util-linux) makes each server die with this process, even if it is killed itself.
const SETPRIV = fs.existsSync('/usr/bin/setpriv') ? '/usr/bin/setpriv' : null;
const SPAWNED = new Set();

class Node {
  constructor(id, port, cport, root) {
    Object.assign(this, { id, port, cport, proc: null, exited: null });
    this.dir = path.join(root, `node${id}`);
    this.logPath = path.join(root, `node${id}.log`);
    fs.mkdirSync(this.dir);
  }

  start(init) {
    const args = ['--bind', HOST, '--port', String(this.port), '--dir', this.dir, '--shards', '2',
      '--cluster-node-id', String(this.id), '--cluster-port', String(this.cport)];
    if (init) args.push('--cluster-init', init);
    const log = fs.openSync(this.logPath, 'a');
    fs.writeSync(log, `--- start: ${BIN} ${args.join(' ')}\n`);
    const [cmd, argv] = SETPRIV ? [SETPRIV, ['--pdeathsig', 'KILL', '--', BIN, ...args]] : [BIN, args];
    const proc = spawn(cmd, argv, { stdio: ['ignore', log, log] });
    fs.closeSync(log);
    SPAWNED.add(proc);
    this.proc = proc;
    this.exited = new Promise((resolve) => proc.once('exit', resolve));
  }

  alive() {
    return this.proc !== null && this.proc.exitCode === null && this.proc.signalCode === null;
  }

  /** SIGKILL; resolves to the moment the signal was sent, once the process is gone. */
  async kill() {
    const at = now();
    if (this.alive()) {
      this.proc.kill('SIGKILL');
      await this.exited;
    }
    return at;
  }

  logTail(lines = 30) {
    try {
      return fs.readFileSync(this.logPath, 'utf8').split('\n').slice(-lines).join('\n');
    } catch (e) {
      return `(no log: ${e.message})`;
    }
  }
}

class Cluster {
  async init() {
    this.root = fs.mkdtempSync(path.join(os.tmpdir(), 'permitd-failover-'));
    const taken = new Set();
    this.nodes = new Map();
    for (let id = 1; id <= NODES; id++) {
      this.nodes.set(id, new Node(id, await freePort(taken), await freePort(taken), this.root));
    }
    // the error replies the nodes sent (INFO errorstats), summed over their processes: the last
    // sample of each running process, plus those of the processes killed
    this.sampled = new Map();
    this.banked = new Map();
  }

  async start() {
    const init = [...this.nodes.values()].map((n) => `${n.id}=${HOST}:${n.port}@${n.cport}`).join(',');
    for (const n of this.nodes.values()) if (n.id !== 1) n.start();
    this.nodes.get(1).start(init);
    return this.waitStable(START_TIMEOUT_MS);
  }

  startupNodes() {
    return [...this.nodes.values()].map((n) => ({ host: HOST, port: n.port }));
  }

  /** The leader's id when every node runs, answers, agrees on one leader that says it leads,
   * and every peer matches the leader's log (lag 0); else null. */
  async stableLeader() {
    const infos = new Map();
    for (const n of this.nodes.values()) {
      if (!n.alive()) return null;
      const i = await info(n.port, 'raft');
      if (!i) return null;
      infos.set(n.id, i);
    }
    const leaders = new Set([...infos.values()].map((i) => i.raft_leader_id));
    if (leaders.size !== 1) return null;
    const leader = Number([...leaders][0]);
    const li = infos.get(leader);
    if (!li || li.raft_role !== 'leader') return null;
    for (const n of this.nodes.values()) {
      if (n.id !== leader && li[`raft_peer${n.id}`]?.lag !== '0') return null;
    }
    return leader;
  }

  async waitStable(timeoutMs) {
    const deadline = now() + timeoutMs;
    while (now() < deadline) {
      for (const n of this.nodes.values()) {
        if (n.proc && !n.alive()) {
          throw new Error(`node ${n.id} exited (${n.proc.exitCode ?? n.proc.signalCode}); its log:\n${n.logTail()}`);
        }
      }
      const leader = await this.stableLeader();
      if (leader !== null) return leader;
      await sleep(100);
    }
    const states = [];
    for (const n of this.nodes.values()) states.push(`node ${n.id}: ${JSON.stringify(await info(n.port, 'raft'))}`);
    throw new Error(`the cluster did not settle on a leader in ${timeoutMs} ms: ${states.join('; ')}`);
  }

  /** The id of a leader other than `old`: a live node that says it leads. */
  async newLeader(old, timeoutMs) {
    const deadline = now() + timeoutMs;
    while (now() < deadline) {
      for (const n of this.nodes.values()) {
        if (n.id === old || !n.alive()) continue;
        const i = await info(n.port, 'raft');
        if (i?.raft_role === 'leader') return n.id;
      }
      await sleep(50);
    }
    throw new Error(`no new leader ${timeoutMs} ms after node ${old} was killed`);
  }

  async sampleErrorstats() {
    for (const n of this.nodes.values()) {
      if (!n.alive()) continue;
      const stats = await info(n.port, 'errorstats');
      if (stats) {
        this.sampled.set(n.id, Object.fromEntries(Object.entries(stats)
          .map(([k, v]) => [k.replace(/^errorstat_/, ''), Number(v.count)])));
      }
    }
  }

  /** SIGKILL, after a last look at the node's error counts; resolves to when it was sent. */
  async kill(id) {
    await this.sampleErrorstats();
    const at = await this.nodes.get(id).kill();
    for (const [code, count] of Object.entries(this.sampled.get(id) || {})) {
      this.banked.set(code, (this.banked.get(code) || 0) + count);
    }
    this.sampled.delete(id);
    return at;
  }

  async errorReplies() {
    await this.sampleErrorstats();
    const total = new Map(this.banked);
    for (const stats of this.sampled.values()) {
      for (const [code, count] of Object.entries(stats)) total.set(code, (total.get(code) || 0) + count);
    }
    return total;
  }

  async stop() {
    for (const n of this.nodes.values()) await n.kill();
  }

  remove() {
    fs.rmSync(this.root, { recursive: true, force: true });
  }
}

/** An error as a short kind: the server's error code, or the error's class and message start. */
function kind(err) {
  if (err.name === 'ReplyError') return `ReplyError ${String(err.message).split(' ')[0]}`;
  return `${err.name}: ${String(err.message).replace(/\d+\.\d+\.\d+\.\d+:\d+/g, 'ADDR').slice(0, 80)}`;
}

function ready(c) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`Cluster not ready after 10 s (${c.status})`)), 10000);
    c.once('ready', () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

class Worker {
  constructor(index, Redis, startupNodes, ns, sem) {
    Object.assign(this, { index, Redis, startupNodes, ns, sem });
    this.name = `worker${index}`;
    this.answers = []; // { sent, answered, command, outcome }
    this.errors = []; // { sent, failed, command, kind, message }
    this.holds = []; // { sent, received, released (first release sent), token (BigInt) }
    this.lost = null; // the error that said the lease is gone
    this.crash = null; // an exception the loop did not expect
    this.stopped = false;
    this.done = false;
  }

  async open() {
    this.c = new this.Redis.Cluster(this.startupNodes, OPTIONS);
    this.c.on('error', () => {});
    await ready(this.c);
    this.lease = asMap(await this.c.call('LEASE.CREATE', this.ns, `worker-${this.index}`, LEASE_TTL)).lease_id;
  }

  /** [true, reply] or [false, error], recording either. */
  async call(command, ...args) {
    const sent = now();
    let reply;
    try {
      reply = await this.c.call(command, ...args);
    } catch (err) {
      this.errors.push({ sent, failed: now(), command, kind: kind(err), message: String(err.message).slice(0, 200) });
      return [false, err];
    }
    const outcome = command === 'SEM.ACQUIRE' ? String(asMap(reply).outcome) : 'OK';
    this.answers.push({ sent, answered: now(), command, outcome });
    return [true, reply];
  }

  /** SEM.RELEASE until the cluster answers it. A lease that holds nothing there is a no-op
   * (SPEC §9), so this also settles an acquire whose outcome was unknown. */
  async releaseUntilAnswered() {
    const giveUp = now() + 30000;
    while (now() < giveUp) {
      const [ok, res] = await this.call('SEM.RELEASE', this.ns, this.sem, this.lease);
      if (ok) return;
      if (/^NOTFOUND/.test(res.message)) {
        this.lost = res;
        return;
      }
      await sleep(ERROR_PAUSE_MS);
    }
    throw new Error(`${this.name}: SEM.RELEASE not answered for 30 s`);
  }

  async run() {
    try {
      await this.loop();
    } catch (err) {
      this.crash = err;
    }
    this.done = true;
  }

  async loop() {
    let refreshed = now();
    let unsure = false;
    while (!this.stopped && this.lost === null) {
      if (now() - refreshed >= REFRESH_EVERY_MS) {
        const [ok, res] = await this.call('LEASE.REFRESH', this.ns, this.lease, LEASE_TTL);
        if (ok) {
          refreshed = now();
        } else if (/^NOTFOUND/.test(res.message)) {
          this.lost = res;
          return;
        }
      }
      if (unsure) {
        await this.releaseUntilAnswered();
        unsure = false;
      }
      const sent = now();
      const [ok, res] = await this.call('SEM.ACQUIRE', this.ns, this.sem, this.lease, 1, 0);
      if (!ok) {
        unsure = true;
        await sleep(ERROR_PAUSE_MS);
        continue;
      }
      const reply = asMap(res);
      if (String(reply.outcome) === ACQUIRED) {
        const hold = { sent, received: now(), released: null, token: BigInt(String(reply.fencing_token)) };
        this.holds.push(hold);
        await sleep(HOLD_MS);
        hold.released = now();
        await this.releaseUntilAnswered();
      } else {
        assert.equal(String(reply.outcome), UNAVAILABLE);
      }
      await sleep(PAUSE_MS);
    }
    if (unsure) await this.releaseUntilAnswered();
  }

  /** The first answer to a command sent at or after `after` (its answering time), or null. */
  nextAnswer(after) {
    const a = this.answers.find((x) => x.sent >= after);
    return a ? a.answered : null;
  }

  nextAcquired(after) {
    const h = this.holds.find((x) => x.sent >= after);
    return h ? h.received : null;
  }
}

/** The most holds open at one instant, a hold counting from its ACQUIRED reply to the first send
 * of its release (ends before starts at the same instant). */
function maxConcurrent(holds, end) {
  const edges = [];
  for (const h of holds) {
    edges.push([h.received, 1], [h.released ?? end, -1]);
  }
  edges.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let most = 0;
  let cur = 0;
  for (const [, d] of edges) {
    cur += d;
    most = Math.max(most, cur);
  }
  return most;
}

/** Pairs where the later acquire was sent after the earlier one's ACQUIRED reply, yet its token
 * is not larger: SPEC §3's tokens must rise. */
function tokenInversions(holds) {
  const byReply = [...holds].sort((a, b) => a.received - b.received);
  const prefixMax = [];
  let best = null;
  for (const h of byReply) {
    if (best === null || h.token > best.token) best = h;
    prefixMax.push(best);
  }
  const bad = [];
  for (const h of holds) {
    let lo = 0;
    let hi = byReply.length; // first index whose reply came at or after h was sent
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (byReply[mid].received < h.sent) lo = mid + 1;
      else hi = mid;
    }
    if (lo > 0 && prefixMax[lo - 1].token >= h.token) bad.push([prefixMax[lo - 1].token, h.token]);
  }
  return bad;
}

function stats(values) {
  if (!values.length) return '-';
  const s = [...values].sort((a, b) => a - b);
  const mid = s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
  return `p50 ${mid.toFixed(0)} ms, max ${s[s.length - 1].toFixed(0)} ms`;
}

async function scenario(t, cluster, Redis, label) {
  const started = now();
  const lines = [`${label} failover: ${WORKERS} workers, ${PERMITS} permits, ${KILLS} leader kills (SIGKILL)`];
  const problems = [];
  const admin = new Redis.Cluster(cluster.startupNodes(), OPTIONS);
  admin.on('error', () => {});
  const workers = [];
  try {
    await ready(admin);
    const ns = `failover-${process.pid}-${label.replace(/\W/g, '')}`;
    const sem = 'pool';
    await admin.call('NS.CREATE', ns, 'DESC', `redis-compat ${label} failover`);
    await admin.call('SEM.CREATE', ns, sem, PERMITS);

    for (let i = 0; i < WORKERS; i++) {
      const w = new Worker(i, Redis, cluster.startupNodes(), ns, sem);
      workers.push(w);
      await w.open();
    }
    const running = workers.map((w) => w.run());
    const kills = []; // { killedAt, leader, next, elected }
    try {
      for (let k = 0; k < KILLS; k++) {
        const leader = await cluster.waitStable(REJOIN_TIMEOUT_MS);
        // every worker in its loop, answered since the cluster settled and lately, so that the
        // kill lands mid-traffic
        const settled = now();
        for (;;) {
          const at = now();
          if (at - settled >= STEADY_MS && workers.every((w) => w.holds.length && w.nextAnswer(settled) !== null
              && at - w.answers[w.answers.length - 1].answered < 500)) break;
          if (at - settled > 10000 || workers.some((w) => w.crash || w.lost)) {
            throw new Error(`workers not all answered before kill ${k + 1}: ${JSON.stringify(workers.map((w) => [
              w.name, w.answers.length, String(w.crash || w.lost || '')]))}`);
          }
          await sleep(50);
        }
        const killedAt = await cluster.kill(leader);
        const next = await cluster.newLeader(leader, 10000);
        kills.push({ killedAt, leader, next, elected: now() });
        // let the workers find the new leader before the killed node comes back
        const deadline = killedAt + FAILOVER_LIMIT_MS + 2000;
        while (now() < deadline && !workers.every((w) => w.nextAnswer(killedAt) !== null)) await sleep(50);
        cluster.nodes.get(leader).start();
      }
      await cluster.waitStable(REJOIN_TIMEOUT_MS);
      await sleep(500);
    } finally {
      // a kill loop cut short leaves no node down for the next scenario
      for (const n of cluster.nodes.values()) if (!n.alive()) n.start();
      for (const w of workers) w.stopped = true;
      let timer;
      const late = new Promise((resolve) => { timer = setTimeout(resolve, 40000); });
      await Promise.race([Promise.all(running), late]);
      clearTimeout(timer);
      for (const w of workers) if (!w.done) problems.push(`${w.name} still running 40 s after stop`);
    }
    const end = now();

    for (const w of workers) {
      if (w.crash) problems.push(`${w.name} stopped on ${w.crash.stack || w.crash}`);
      if (w.lost) problems.push(`${w.name} lost its lease: ${w.lost.message}`);
    }

    const allGaps = [];
    kills.forEach(({ killedAt, leader, next, elected }, i) => {
      const gaps = [];
      const acq = [];
      for (const w of workers) {
        const answered = w.nextAnswer(killedAt);
        if (answered === null) {
          problems.push(`kill ${i + 1}: ${w.name} got no answer after the kill`);
          continue;
        }
        gaps.push(answered - killedAt);
        const got = w.nextAcquired(killedAt);
        if (got !== null) acq.push(got - killedAt);
        if (answered - killedAt >= FAILOVER_LIMIT_MS) {
          problems.push(`kill ${i + 1}: ${w.name} answered ${(answered - killedAt).toFixed(0)} ms after the kill`);
        }
      }
      allGaps.push(...gaps);
      if (!acq.length || Math.min(...acq) >= FAILOVER_LIMIT_MS) {
        problems.push(`kill ${i + 1}: no worker acquired within ${FAILOVER_LIMIT_MS} ms (${acq})`);
      }
      lines.push(`  kill ${i + 1}: node ${leader} -> node ${next} leads ${(elected - killedAt).toFixed(0)} ms after;`
        + ` next answer per worker (ms): ${gaps.map((g) => g.toFixed(0)).join(', ')} (${stats(gaps)});`
        + ` next ACQUIRED: ${stats(acq)}`);
    });
    lines.push(`  all kills: next answer ${stats(allGaps)}`);

    const quiet = workers.flatMap((w) => w.answers)
      .filter((a) => !kills.some((k) => a.sent >= k.killedAt - 500 && a.sent <= k.killedAt + FAILOVER_LIMIT_MS + 1000));
    for (const command of ['SEM.ACQUIRE', 'SEM.RELEASE', 'LEASE.REFRESH']) {
      const took = quiet.filter((a) => a.command === command).map((a) => a.answered - a.sent).sort((a, b) => a - b);
      if (took.length) {
        lines.push(`  ${command} latency away from the kills: p50 ${took[Math.floor((took.length - 1) / 2)].toFixed(1)} ms,`
          + ` p99 ${took[Math.floor(0.99 * (took.length - 1))].toFixed(1)} ms (${took.length} calls)`);
      }
    }

    const holds = workers.flatMap((w) => w.holds);
    const most = maxConcurrent(holds, end);
    const inversions = tokenInversions(holds);
    lines.push(`  ${holds.length} holds, at most ${most} at once; ${workers.reduce((n, w) => n + w.answers.length, 0)} answers`);
    if (most > PERMITS) problems.push(`${most} permits held at once, the semaphore has ${PERMITS}`);
    if (inversions.length) {
      problems.push(`${inversions.length} fencing tokens did not rise, e.g. ${inversions.slice(0, 3).join(' / ')}`);
    }

    const errors = new Map();
    for (const e of workers.flatMap((w) => w.errors)) {
      const key = `${e.command} ${e.kind}`;
      if (!errors.has(key)) errors.set(key, { count: 0, example: e.message });
      errors.get(key).count++;
    }
    lines.push(`  errors that reached the loop, by command and kind:${errors.size ? '' : ' none'}`);
    for (const [key, { count, example }] of [...errors].sort()) {
      lines.push(`    ${key}: ${count} (e.g. ${JSON.stringify(example)})`);
    }
    const replies = await cluster.errorReplies();
    lines.push('  error replies the nodes sent (INFO errorstats; a killed node\'s since its last sample lost): '
      + ([...replies].sort().map(([code, n]) => `${code} ${n}`).join(', ') || 'none'));

    // every worker stopped and released: nothing may be left held (an unknown acquire that was
    // granted was released by its worker)
    const state = asMap(await admin.call('SEM.GET', ns, sem));
    if (String(state.active_holds) !== '0') {
      problems.push(`after every worker released, SEM.GET shows active_holds ${state.active_holds}`);
    }
    for (const w of workers) {
      try {
        await w.c.call('LEASE.REVOKE', ns, w.lease);
      } catch (err) {
        problems.push(`${w.name}: LEASE.REVOKE failed: ${err.message}`);
      }
    }
    await admin.call('NS.DELETE', ns);
    lines.push(`  total ${((now() - started) / 1000).toFixed(1)} s`);
  } finally {
    for (const w of workers) w.c?.disconnect();
    admin.disconnect();
  }
  for (const line of lines) t.diagnostic(line);
  assert.deepEqual(problems, [], [...problems, ...lines].join('\n'));
}

describe('ioredis Cluster across leader kills', {
  skip: BIN ? false : 'PERMITD_BIN is not set: this test starts a 3-node cluster from that binary',
}, () => {
  const cluster = new Cluster();
  let failed = false;

  before(async () => {
    try {
      fs.accessSync(BIN, fs.constants.X_OK);
    } catch (err) {
      throw new Error(`PERMITD_BIN=${BIN} is not an executable file (${err.code})`);
    }
    await cluster.init();
    try {
      await cluster.start();
    } catch (err) {
      failed = true;
      throw err;
    }
  });

  after(async () => {
    if (cluster.nodes) await cluster.stop();
    if (failed && cluster.nodes) {
      for (const n of cluster.nodes.values()) console.log(`--- node ${n.id} (port ${n.port}) log, last lines ---\n${n.logTail()}`);
    }
    if (cluster.root) cluster.remove();
  });

  const run = (Redis, label) => async (t) => {
    try {
      await scenario(t, cluster, Redis, label);
    } catch (err) {
      failed = true;
      throw err;
    }
  };
  it('ioredis 5 Cluster (RESP2)', { timeout: 90000 }, run(Redis5, 'ioredis5'));
  it('ioredis 6 Cluster (RESP3)', { timeout: 90000 }, run(Redis6, 'ioredis6'));
});

// a last resort if this process exits without after(): no server outlives it (setpriv's
// --pdeathsig also covers a kill of this process)
process.on('exit', () => {
  for (const proc of SPAWNED) if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
});
