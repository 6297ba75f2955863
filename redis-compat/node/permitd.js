'use strict';
// permitd.js: a thin helper for permitd on top of ioredis (5.x or 6.x, RESP2 or RESP3), a plain
// client (`new Redis`) or a cluster client (`new Redis.Cluster`).
//
// Every method is one server command, plus a lease heartbeat. The server does the waiting
// (SEM.ACQUIRE parks server-side up to `timeout` seconds, FIFO), expiry and fencing tokens;
// nothing here queues or polls an acquire. On a single node a command is sent once, exactly as
// `client.call` would; only the errors of cluster mode (SPEC §10) and lost connections make the
// helper send it again (below).
//
//   const Redis = require('ioredis');
//   const { Lease, Semaphore, withPermit } = require('./permitd');
//   const redis = new Redis({ port: 6379, stringNumbers: true });
//   // or, for a cluster: new Redis.Cluster([{ port: 7001 }, { port: 7002 }, { port: 7003 }],
//   //                                      { redisOptions: { stringNumbers: true } })
//   const lease = await Lease.create(redis, 'team', 'worker-1', 30);
//   const hb = lease.heartbeat({ onLost: (err) => console.error('lease lost', err) });
//   await withPermit(new Semaphore(redis, 'team', 'db'), lease, 2, 10, async (token) => { ... });
//   // several at once, all or none (SEM.ACQUIREALL); tokens in the order asked:
//   const [db, cache] = [new Semaphore(redis, 'team', 'db'), new Semaphore(redis, 'team', 'cache')];
//   await withPermits([[db, 1], [cache, 2]], lease, 10, async (tokens) => { ... });
//   await hb.stop(); await lease.revoke();
//
// Some ioredis facts shape this helper:
// - Timestamps are nanosecond integers above 2^53, so a client must be created with
//   `stringNumbers: true` (a Cluster: `redisOptions: { stringNumbers: true }`) or they lose
//   precision (rounded to a multiple of 256 ns). Fencing tokens are a counter below 2^53, exact
//   as a Number too, except in a data directory written before they were one, which keeps
//   counting from its clock-sized tokens (about 1.8e18). The helper refuses other clients, and
//   returns timestamps and tokens as BigInt.
// - One ioredis connection is one queue, and a parked SEM.ACQUIRE holds every command queued
//   behind it on that connection (as BLPOP does; a Cluster has one connection per node). So the
//   heartbeat runs on its own client (`client.duplicate()`), and a program that waits on
//   several semaphores at once should give each waiting task its own client.
// - ioredis's `commandTimeout` rejects a command's promise without cancelling it on the server:
//   an acquire could then be granted after the caller gave up. Semaphore.acquire refuses a
//   timeout that is not below the client's commandTimeout.
//
// Retries in cluster mode (SPEC §10; none of these errors occurs on a single node):
// - MOVED / TRYAGAIN / CLUSTERDOWN ran nothing: the command is sent again after a short
//   back-off (50 ms, doubling, at most 500 ms), an acquire with what is left of its timeout
//   (the helper keeps the deadline of the first send), anything else within a retry budget
//   (5 s; `setRetryPolicy(client, { budgetMs, baseDelayMs, maxDelayMs })`). When the deadline or
//   the budget is spent the call rejects with RetriesExhaustedError (`cause`: the last error).
//   An acquire whose timeout is spent gets one last try with timeout 0 at its deadline; a
//   timeout-0 acquire has no time for a retry. An acquire that asked to wait and ends
//   UNAVAILABLE (a re-send at its deadline) is reported TIMED_OUT: it waited its whole timeout.
// - LEADERCHANGED, or a connection lost or timed out after sending: the outcome is unknown, and
//   the command is sent again within the same limits (an acquire also for a retry budget past
//   its deadline, with timeout 0 once the deadline is spent, to learn whether it holds):
//   SEM.ACQUIRE / SEM.ACQUIREALL with the same lease and weights (a committed first try makes
//   the server answer the same hold and fencing token); SEM.RELEASE and LEASE.REFRESH as they
//   are; LEASE.REVOKE and SEM.DELETE / NS.DELETE take NOTFOUND as done; SEM.CREATE / NS.CREATE
//   that meet ALREADYEXISTS read the entity and succeed when it has the permits, description
//   and metadata asked (else the ALREADYEXISTS error is thrown); LEASE.CREATE may leave one
//   orphan lease behind, which dies at its ttl. If the outcome is still unknown when the
//   retries end, RetriesExhaustedError has `outcomeUnknown: true`: after an acquire the lease
//   may hold the permits (release them, or revoke the lease).
// - The heartbeat keeps refreshing through all of this until the moment the lease is known
//   alive until; only NOTFOUND (or another definite error reply) or that moment passing reports
//   the lease lost.
// - A plain client (`new Redis`) connected to a follower gets MOVED: the helper does not follow
//   it on connections of its own (a plain client knows one address, so it could not survive
//   that node's death anyway) and rejects with MovedError, which says to use Redis.Cluster.
// - Redis.Cluster handles MOVED, TRYAGAIN, CLUSTERDOWN and a closed connection itself, before
//   the helper sees anything: it writes the same command again, up to `maxRedirections` (16)
//   times, at once after MOVED and 100 ms apart otherwise, then rejects with "Too many Cluster
//   redirections", which the helper judges by its last error; LEADERCHANGED it leaves to the
//   helper. A plain client also writes a command in flight again after a reconnect, unless
//   `maxRetriesPerRequest` is 0. The helper's commands compute an acquire's timeout anew at
//   every write, so these writes carry what is left of it too and the server never waits past
//   the caller's deadline; the client's own tries do go on after the deadline (with timeout 0)
//   until they end, up to about 1.7 s more on the Cluster's defaults.
// - The helper sends with `sendCommand`, so a client's `enableAutoPipelining` does not apply
//   to its commands.

const timers = require('node:timers/promises');

const ACQUIRED = 'ACQUIRE_OUTCOME_ACQUIRED';
const UNAVAILABLE = 'ACQUIRE_OUTCOME_UNAVAILABLE';
const TIMED_OUT = 'ACQUIRE_OUTCOME_TIMED_OUT';

const BIG_FIELDS = new Set(['created_at', 'updated_at', 'last_activity_at', 'expires_at', 'locked_at', 'fencing_token']);
const SMALL_FIELDS = new Set(['permits', 'active_holds', 'active_holders_count', 'waiters', 'version', 'weight']);
const LIST_FIELDS = ['namespaces', 'semaphores', 'holders', 'leases'];

class PermitdError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = this.constructor.name;
  }
}

/** withPermit did not get its permits (outcome UNAVAILABLE or TIMED_OUT). */
class NotAcquiredError extends PermitdError {
  constructor(result, sem, weight, timeout) {
    const s = result.semaphore;
    super(`permits not acquired on ${sem.ns}/${sem.name}: ${result.outcome} ` +
      `(weight ${weight}, timeout ${timeout} s; ${s.active_holds} of ${s.permits} permits held)`);
    this.result = result;
    this.outcome = result.outcome;
    this.semaphore = s;
  }
}

/** withPermits did not get its permits (UNAVAILABLE or TIMED_OUT): it holds none of them. */
class NotAcquiredAllError extends NotAcquiredError {
  constructor(result, parts, timeout) {
    const free = result.holds.map((h, i) =>
      `${h.semaphore.name} ${parts[i][1]} of ${h.semaphore.permits - h.semaphore.active_holds} free`);
    super({ outcome: result.outcome, semaphore: result.holds[0].semaphore }, parts[0][0], 0, timeout);
    this.message = `permits not acquired in ${parts[0][0].ns}: ${result.outcome} ` +
      `(timeout ${timeout} s; ${free.join(', ')})`;
    this.result = result;
    this.semaphores = result.holds.map((h) => h.semaphore);
  }
}

/** The lease is gone: expired, revoked, or not refreshed before its expiry. */
class LeaseLostError extends PermitdError {}

/** A plain client reached a follower of a permitd cluster (`-MOVED slot host:port`). */
class MovedError extends PermitdError {
  constructor(err, outcomeUnknown) {
    const [, slot, address] = err.message.split(' ');
    super(`${err.message}: this permitd node is a follower in cluster mode. permitd.js does not ` +
      'follow redirects of a plain ioredis client; connect with new Redis.Cluster([{ host, port }, ...], ' +
      '{ redisOptions: { stringNumbers: true } })' +
      (outcomeUnknown ? ' (an earlier try of this command may have taken effect)' : ''), { cause: err });
    this.slot = Number(slot);
    this.address = address;
    this.outcomeUnknown = outcomeUnknown;
  }
}

/** A command could not get an answer before its acquire deadline or its retry budget ran out:
 * `cause` is the last error, `tries` how many times the helper sent it, and `outcomeUnknown`
 * says whether one of them may have taken effect. */
class RetriesExhaustedError extends PermitdError {
  constructor(name, why, tries, outcomeUnknown, cause) {
    super(`${name}: no answer ${why} (${tries} ${tries === 1 ? 'try' : 'tries'}): ${cause.message}` +
      (outcomeUnknown ? '; an earlier try may have taken effect (outcome unknown)' : ''), { cause });
    this.tries = tries;
    this.outcomeUnknown = outcomeUnknown;
  }
}

function isNotFound(err) {
  return !!err && typeof err.message === 'string' && err.message.startsWith('NOTFOUND');
}

/** An error reply from the server (ioredis's ReplyError, in any copy of redis-errors), as
 * opposed to a connection problem. */
function isReplyError(err) {
  for (let p = err && Object.getPrototypeOf(err); p; p = Object.getPrototypeOf(p)) {
    if (p.constructor && p.constructor.name === 'ReplyError') return true;
  }
  return false;
}

/** The options a connection of `client` uses (a Cluster's are its `redisOptions`). */
function connectionOptions(client) {
  return (client.isCluster ? client.options.redisOptions : client.options) || {};
}

function requireStringNumbers(client) {
  if (!client || typeof client.sendCommand !== 'function' || typeof client.pipeline !== 'function') {
    throw new TypeError('permitd: expected an ioredis client (Redis or Redis.Cluster)');
  }
  if (!client.options || connectionOptions(client).stringNumbers !== true) {
    throw new TypeError(`permitd: create the ioredis ${client.isCluster ? 'Cluster with { redisOptions: ' +
      '{ stringNumbers: true } }' : 'client with { stringNumbers: true }'}: ` +
      'timestamps are nanosecond integers above Number.MAX_SAFE_INTEGER');
  }
}

const DEFAULT_RETRY = Object.freeze({ budgetMs: 5000, baseDelayMs: 50, maxDelayMs: 500 });
const retryPolicies = new WeakMap();

/** Sets how long the helper keeps re-sending a command on `client` after cluster errors and
 * lost connections (see the top of this file): `budgetMs` (5000) for anything but an acquire,
 * which has its own deadline, and the back-off from `baseDelayMs` (50), doubling, up to
 * `maxDelayMs` (500). `budgetMs: 0` sends every command once (an acquire still retries within
 * its timeout). */
function setRetryPolicy(client, policy = {}) {
  const merged = { ...DEFAULT_RETRY, ...policy };
  for (const [k, v] of Object.entries(merged)) {
    if (!(Number.isFinite(v) && v >= 0)) throw new RangeError(`permitd: retry policy ${k} must be a number >= 0`);
  }
  retryPolicies.set(client, Object.freeze(merged));
}

const retryPolicy = (client) => retryPolicies.get(client) || DEFAULT_RETRY;

/**
 * The Command class of `client`'s own copy of ioredis (ioredis 5 and 6 differ, and a Cluster has
 * no static for it): the one a throwaway pipeline builds, which is never executed. Cached by the
 * client's prototype (ioredis's mixins leave every client's `constructor` EventEmitter).
 */
const commandClasses = new WeakMap();
function trackedCommandClass(client) {
  const kind = Object.getPrototypeOf(client);
  let Tracked = commandClasses.get(kind);
  if (Tracked) return Tracked;
  const pipeline = client.pipeline();
  let Base;
  pipeline.sendCommand = (command) => { Base = command.constructor; };
  pipeline.call('PING');
  // Counts the times ioredis writes it (it re-writes the same command after MOVED / TRYAGAIN /
  // CLUSTERDOWN in a Cluster, and after a reconnect), and gives every write but the first what
  // is left of an acquire's timeout.
  Tracked = class extends Base {
    toWritable(socket) {
      this.writes = (this.writes || 0) + 1;
      if (this.timeoutAt && (this.writes > 1 || !this.timeoutAt.keepFirst)) {
        this.args[this.timeoutAt.index] = secondsLeft(this.timeoutAt.deadline);
      }
      return super.toWritable(socket);
    }
  };
  commandClasses.set(kind, Tracked);
  return Tracked;
}

/** What is left until `deadline` (a performance.now() instant) in seconds, floored to the
 * millisecond, never negative, as the server reads an acquire timeout. */
const secondsLeft = (deadline) => String(Math.max(0, Math.floor(deadline - performance.now())) / 1000);

/** What a failed try says: 'retry' (nothing ran), 'unknown' (it may have run), 'moved' (a plain
 * client at a follower) or 'final' (the answer). */
function failureKind(client, err) {
  if (isReplyError(err)) {
    const code = err.message.split(' ', 1)[0];
    if (code === 'MOVED') return client.isCluster ? 'retry' : 'moved';
    if (code === 'TRYAGAIN' || code === 'CLUSTERDOWN') return 'retry';
    return code === 'LEADERCHANGED' ? 'unknown' : 'final';
  }
  // a Cluster that used up its own redirections: the last error decides
  const last = /^Too many Cluster redirections\. Last error: (?:ReplyError: )?(\S+)/.exec(err.message);
  if (last) return ['MOVED', 'TRYAGAIN', 'CLUSTERDOWN'].includes(last[1]) ? 'retry' : 'unknown';
  // closed by its owner: nothing will answer; or a bug, not the network
  if (client.status === 'end' || err instanceof TypeError || err instanceof RangeError) return 'final';
  // the connection was lost or timed out, with the command perhaps already sent
  return 'unknown';
}

const sleep = (ms, signal) => timers.setTimeout(ms, undefined, { signal });

/**
 * Sends `name args...` on `client`, re-sending after cluster errors and lost connections (the
 * table at the top of this file). Options:
 * - `acquire: { index, deadline }`: the argument at `index` is an acquire timeout, re-sent as
 *   what is left until `deadline` (performance.now() ms), which also ends the retries;
 * - `giveUpAt` (performance.now() ms): ends the retries (default: now + the retry budget);
 * - `settle(err)`: after a try of unknown outcome, turns a final error reply into the answer
 *   (NOTFOUND of a revoke, ALREADYEXISTS of a create) or throws;
 * - `signal`: an AbortSignal that stops the retries.
 * Resolves to { reply, sentAt } (sentAt: performance.now() when the answered try was sent).
 */
async function send(client, name, args, { acquire, giveUpAt, settle, signal } = {}) {
  const policy = retryPolicy(client);
  const Command = trackedCommandClass(client);
  const errorStack = client.options.showFriendlyErrorStack;
  const keyPrefix = client.options.keyPrefix;
  const start = performance.now();
  let end = acquire ? acquire.deadline : (giveUpAt ?? start + policy.budgetMs);
  let unknown = false; // a try so far may have run
  let settling = false; // an acquire's retries were extended to learn whether it holds
  for (let tries = 1; ; tries++) {
    const command = new Command(name, [...args],
      { replyEncoding: 'utf8', keyPrefix, errorStack: errorStack ? new Error() : undefined });
    if (acquire) command.timeoutAt = { ...acquire, keepFirst: tries === 1 };
    const sentAt = performance.now();
    let err;
    try {
      return { reply: await client.sendCommand(command), sentAt };
    } catch (e) {
      err = e;
    }
    // the client itself wrote it more than once: a try before the last may have run
    const maybeRan = unknown || command.writes > 1;
    const kind = failureKind(client, err);
    if (kind === 'final') {
      if (maybeRan && settle) return { reply: await settle(err), sentAt };
      throw err;
    }
    if (kind === 'moved') throw new MovedError(err, maybeRan);
    unknown = maybeRan || kind === 'unknown';
    // whether the lease holds the permits must be learnt: past the deadline, with timeout 0
    if (acquire && kind === 'unknown' && !settling) {
      settling = true;
      end = acquire.deadline + policy.budgetMs;
    }
    const left = end - performance.now();
    if (left <= 0) {
      const why = acquire && !settling ? 'within its timeout' : `within the retry budget of ${policy.budgetMs} ms`;
      throw new RetriesExhaustedError(name, why, tries, unknown, err);
    }
    try {
      await sleep(Math.min(left, policy.baseDelayMs * 2 ** (tries - 1), policy.maxDelayMs), signal);
    } catch (_) { // aborted (or aborted already)
      throw new RetriesExhaustedError(name, 'before it was stopped', tries, unknown, err);
    }
  }
}

const str = (v) => (Buffer.isBuffer(v) ? v.toString() : v);

/** A RESP3 map (object or Map) or a RESP2 flat array [k, v, ...] as a plain object. */
function toObject(reply) {
  if (reply instanceof Map) return Object.fromEntries([...reply].map(([k, v]) => [str(k), v]));
  if (Array.isArray(reply)) {
    if (reply.length % 2) throw new TypeError(`permitd: not a map reply (odd length ${reply.length})`);
    const out = {};
    for (let i = 0; i < reply.length; i += 2) out[str(reply[i])] = reply[i + 1];
    return out;
  }
  if (reply && typeof reply === 'object') return { ...reply };
  throw new TypeError(`permitd: not a map reply: ${reply}`);
}

function num(field, v) {
  if (v === undefined || v === null) return v;
  if (BIG_FIELDS.has(field)) return BigInt(v);
  if (SMALL_FIELDS.has(field)) return Number(v);
  return v;
}

/** A namespace / semaphore / lease / holder reply as an object (metadata an object too). */
function parseEntity(reply) {
  const e = toObject(reply);
  for (const k of Object.keys(e)) {
    if (k === 'metadata') e.metadata = toObject(e.metadata);
    else e[k] = num(k, e[k]);
  }
  return e;
}

/** A page reply (NS.LIST, SEM.LIST, SEM.HOLDERS, LEASE.LIST) with its items parsed. */
function parsePage(reply) {
  const p = toObject(reply);
  for (const k of LIST_FIELDS) if (k in p) p[k] = p[k].map(parseEntity);
  return p;
}

/** SEM.ACQUIRE's reply: { outcome, acquired, semaphore, fencingToken (BigInt or null) }. */
function parseAcquire(reply) {
  const r = toObject(reply);
  const outcome = str(r.outcome);
  return {
    outcome,
    acquired: outcome === ACQUIRED,
    semaphore: parseEntity(r.semaphore),
    fencingToken: r.fencing_token === undefined ? null : BigInt(r.fencing_token),
  };
}

/** SEM.ACQUIREALL's reply: { outcome, acquired, holds: [{ semaphore, fencingToken }], in the
 * order asked; fencingToken BigInt or null }. */
function parseAcquireAll(reply) {
  const r = toObject(reply);
  const outcome = str(r.outcome);
  const holds = r.holds.map((h) => {
    const m = toObject(h);
    return {
      semaphore: parseEntity(m.semaphore),
      fencingToken: m.fencing_token === undefined ? null : BigInt(m.fencing_token),
    };
  });
  return { outcome, acquired: outcome === ACQUIRED, holds };
}

function metaArgs(meta) {
  const pairs = metaPairs(meta);
  return pairs.length ? ['META', ...pairs.flat()] : [];
}

function metaPairs(meta) {
  if (!meta) return [];
  return meta instanceof Map ? [...meta] : Array.isArray(meta) ? meta : Object.entries(meta);
}

const leaseId = (lease) => (lease instanceof Lease ? lease.id : String(lease));

/** The answer to a re-sent LEASE.REVOKE / *.DELETE whose earlier try may have run: NOTFOUND
 * means it did. */
function notFoundIsDone(err) {
  if (isNotFound(err)) return 'OK';
  throw err;
}

/**
 * NS.CREATE / SEM.CREATE `args` (with `settings`, what the entity must show, among them
 * `description` and `metadata`), and GET `getArgs`: after a try of unknown outcome,
 * ALREADYEXISTS is success when the entity has the settings asked (the earlier try made it),
 * else the ALREADYEXISTS error is thrown.
 */
async function createEntity(client, name, args, getName, getArgs, settings) {
  const settle = async (err) => {
    if (!err.message.startsWith('ALREADYEXISTS')) throw err;
    const { reply } = await send(client, getName, getArgs);
    const found = parseEntity(reply);
    const same = Object.entries(settings).every(([k, v]) => (k === 'metadata'
      ? sameMetadata(found.metadata, v) : String(found[k]) === String(v)));
    if (!same) throw err;
    return reply;
  };
  return parseEntity((await send(client, name, args, { settle })).reply);
}

function sameMetadata(found, asked) {
  const want = new Map(metaPairs(asked).map(([k, v]) => [String(k), String(v)]));
  const have = Object.entries(found || {});
  return have.length === want.size && have.every(([k, v]) => want.get(k) === String(str(v)));
}

const descArgs = (description) => (description === undefined ? [] : ['DESC', description]);

/** A namespace (NS.CREATE / NS.GET / NS.DELETE). */
class Namespace {
  constructor(client, name) {
    requireStringNumbers(client);
    this.client = client;
    this.name = name;
  }

  /** NS.CREATE; the namespace. ALREADYEXISTS rejects, unless a re-send after an unknown
   * outcome finds the namespace with this description and metadata. */
  static async create(client, name, { description, meta } = {}) {
    requireStringNumbers(client);
    return createEntity(client, 'NS.CREATE', [name, ...descArgs(description), ...metaArgs(meta)],
      'NS.GET', [name], { description: description ?? '', metadata: meta });
  }

  async get() {
    return parseEntity((await send(this.client, 'NS.GET', [this.name])).reply);
  }

  /** NS.DELETE: deletes everything inside it. */
  async delete() {
    await send(this.client, 'NS.DELETE', [this.name], { settle: notFoundIsDone });
  }
}

class Lease {
  /** Wraps an existing lease id (a capability: keep it secret). */
  constructor(client, ns, id, ttl, info = {}) {
    requireStringNumbers(client);
    this.client = client;
    this.ns = ns;
    this.id = id;
    this.ttl = Number(ttl);
    this.info = info;
    // performance.now() before which the lease is known alive (server expiry = receipt + ttl).
    this.aliveUntil = performance.now();
  }

  /** LEASE.CREATE. A re-send after an unknown outcome may leave an orphan lease, which dies at
   * its ttl. */
  static async create(client, ns, processId, ttl, meta) {
    requireStringNumbers(client);
    const { reply, sentAt } = await send(client, 'LEASE.CREATE', [ns, processId, Number(ttl), ...metaArgs(meta)]);
    const info = parseEntity(reply);
    const lease = new Lease(client, ns, str(info.lease_id), ttl, info);
    lease.aliveUntil = sentAt + Number(ttl) * 1000;
    return lease;
  }

  /** LEASE.REFRESH: expires_at = server now + ttl (default: this lease's ttl). */
  async refresh(ttl, client = this.client) {
    return this._refresh(ttl, client, {});
  }

  async _refresh(ttl, client, options) {
    if (ttl !== undefined && ttl !== null) this.ttl = Number(ttl);
    const { reply, sentAt } = await send(client, 'LEASE.REFRESH', [this.ns, this.id, this.ttl], options);
    this.info = parseEntity(reply);
    this.aliveUntil = sentAt + this.ttl * 1000;
    return this.info;
  }

  async get() {
    return parseEntity((await send(this.client, 'LEASE.GET', [this.ns, this.id])).reply);
  }

  /** LEASE.REVOKE: releases every hold of the lease and deletes it. */
  async revoke() {
    await send(this.client, 'LEASE.REVOKE', [this.ns, this.id], { settle: notFoundIsDone });
  }

  /** Starts a Heartbeat (see there). */
  heartbeat(options = {}) {
    return new Heartbeat(this, options).start();
  }

  toJSON() {
    return { ns: this.ns, ttl: this.ttl };
  }
}

/**
 * Refreshes a lease every `fraction * ttl` seconds (default 1/3) on its own connection.
 * Reports loss once (`lost` becomes true, `error` says why, `onLost(error)` is called, the
 * timer stops) when LEASE.REFRESH answers an error reply (NOTFOUND: expired or revoked), or
 * when it could not be refreshed before the moment the lease is known alive until: a refresh
 * that meets cluster errors (MOVED, TRYAGAIN, CLUSTERDOWN, LEADERCHANGED) or a lost connection
 * is re-sent until then (see the top of this file), so a failover shorter than the ttl's
 * slack goes unnoticed.
 */
class Heartbeat {
  constructor(lease, { fraction = 1 / 3, onLost = null, client = null } = {}) {
    if (!(fraction > 0 && fraction < 1)) throw new RangeError('fraction must be between 0 and 1');
    this.lease = lease;
    this.intervalMs = lease.ttl * fraction * 1000;
    this.onLost = onLost;
    this.lost = false;
    this.error = null;
    this.refreshes = 0;
    this._ownClient = !client;
    this._client = client;
    this._timer = null;
    this._stopped = false;
    this._inflight = null;
    this._abort = new AbortController();
  }

  start() {
    if (!this._client) {
      // its own connection, so a parked SEM.ACQUIRE on the main one cannot delay a refresh
      this._client = this.lease.client.duplicate();
      this._client.on('error', () => {}); // connection errors surface through refresh()
      setRetryPolicy(this._client, retryPolicy(this.lease.client));
    }
    this._nextAt = performance.now() + this.intervalMs;
    this._schedule();
    return this;
  }

  // fixed rate: a slow refresh (e.g. a slow disk under --fsync always) does not push the next
  // one back
  _schedule() {
    if (this._stopped || this.lost) return;
    const now = performance.now();
    if (this._nextAt < now) this._nextAt = now; // after a very slow refresh: one at once, no backlog
    const delay = this._nextAt - now;
    this._nextAt += this.intervalMs;
    this._timer = setTimeout(() => { this._inflight = this._beat(); }, delay);
  }

  async _beat() {
    try {
      // re-sent on cluster errors as long as the lease is known alive
      await this.lease._refresh(undefined, this._client,
        { giveUpAt: this.lease.aliveUntil, signal: this._abort.signal });
      this.refreshes += 1;
    } catch (err) {
      if (this._stopped) return;
      if (isReplyError(err)) {
        return this._report(new LeaseLostError(`lease refresh failed: ${err.message}`, { cause: err }));
      }
      if (performance.now() >= this.lease.aliveUntil) {
        return this._report(new LeaseLostError(
          `lease could not be refreshed before it expired: ${err.message}`, { cause: err }));
      }
    }
    this._schedule();
  }

  _report(err) {
    this.lost = true;
    this.error = err;
    if (this.onLost) {
      try { this.onLost(err); } catch (_) { /* the callback's own failure is not ours */ }
    }
    this._close();
  }

  _close() {
    if (this._ownClient && this._client) {
      this._client.disconnect();
    }
  }

  /** Stops the timer (waiting for a refresh in flight, but not for its re-sends) and closes
   * the heartbeat's connection. */
  async stop() {
    this._stopped = true;
    clearTimeout(this._timer);
    this._abort.abort();
    if (this._inflight) await this._inflight.catch(() => {});
    this._close();
  }
}

function checkCommandTimeout(client, timeout) {
  const ct = connectionOptions(client).commandTimeout;
  if (ct && Number(timeout) > 0 && ct <= Number(timeout) * 1000) {
    // ioredis would reject the promise while the acquire is still parked on the server; if it
    // is granted afterwards, the caller would not know it holds the permits.
    throw new RangeError(`permitd: acquire timeout ${timeout} s is not below the client's ` +
      `commandTimeout ${ct} ms; use a client whose commandTimeout exceeds the acquire timeout`);
  }
}

/** Sends an acquire whose timeout is argument `index`: re-sent with what is left of it. A
 * caller that asked to wait is told TIMED_OUT, not UNAVAILABLE (a re-send at the deadline). */
async function sendAcquire(client, name, args, index, timeout, parse) {
  const deadline = performance.now() + Number(timeout) * 1000;
  const result = parse((await send(client, name, args, { acquire: { index, deadline } })).reply);
  if (result.outcome === UNAVAILABLE && Number(timeout) > 0) result.outcome = TIMED_OUT;
  return result;
}

class Semaphore {
  constructor(client, ns, name) {
    requireStringNumbers(client);
    this.client = client;
    this.ns = ns;
    this.name = name;
  }

  /** SEM.CREATE; the semaphore. ALREADYEXISTS rejects, unless a re-send after an unknown
   * outcome finds the semaphore with these permits, description and metadata. */
  static async create(client, ns, name, permits, { description, meta } = {}) {
    requireStringNumbers(client);
    return createEntity(client, 'SEM.CREATE', [ns, name, Number(permits), ...descArgs(description), ...metaArgs(meta)],
      'SEM.GET', [ns, name], { permits: Number(permits), description: description ?? '', metadata: meta });
  }

  /** SEM.ACQUIRE: waits server-side up to `timeout` s (0: do not wait). UNAVAILABLE and
   * TIMED_OUT are results (check `.acquired`); server errors reject. */
  async acquire(lease, weight = 1, timeout = 0, meta = undefined) {
    checkCommandTimeout(this.client, timeout);
    const args = [this.ns, this.name, leaseId(lease), Number(weight), String(timeout), ...metaArgs(meta)];
    return sendAcquire(this.client, 'SEM.ACQUIRE', args, 4, timeout, parseAcquire);
  }

  /** SEM.ACQUIREALL over `parts`, [Semaphore, weight] pairs of one client and namespace: every
   * weight or none, waiting server-side up to `timeout` s, FIFO across the semaphores; META goes
   * to every hold. UNAVAILABLE and TIMED_OUT are results (check `.acquired`). */
  static async acquireAll(parts, lease, timeout = 0, meta = undefined) {
    if (!parts.length) throw new TypeError('permitd: acquireAll needs at least one [semaphore, weight]');
    const [{ client, ns }] = parts[0];
    if (parts.some(([sem]) => sem.client !== client || sem.ns !== ns)) {
      throw new TypeError('permitd: acquireAll: every semaphore must share one client and namespace');
    }
    checkCommandTimeout(client, timeout);
    const args = [ns, leaseId(lease), String(timeout)];
    for (const [sem, weight] of parts) args.push(sem.name, Number(weight));
    return sendAcquire(client, 'SEM.ACQUIREALL', [...args, ...metaArgs(meta)], 2, timeout, parseAcquireAll);
  }

  /** SEM.RELEASE: the semaphore (unchanged if the lease held nothing here). */
  async release(lease) {
    return parseEntity((await send(this.client, 'SEM.RELEASE', [this.ns, this.name, leaseId(lease)])).reply);
  }

  async get() {
    return parseEntity((await send(this.client, 'SEM.GET', [this.ns, this.name])).reply);
  }

  /** One page of SEM.HOLDERS, oldest first: { holders, next_cursor, previous_cursor }. */
  async holders({ limit, cursor } = {}) {
    const args = [this.ns, this.name];
    if (cursor) args.push('CURSOR', cursor);
    if (limit !== undefined) args.push('LIMIT', Number(limit));
    return parsePage((await send(this.client, 'SEM.HOLDERS', args)).reply);
  }

  /** SEM.DELETE. */
  async delete() {
    await send(this.client, 'SEM.DELETE', [this.ns, this.name], { settle: notFoundIsDone });
  }
}

/**
 * Acquires `weight` permits (waiting up to `timeout` s), runs `fn(fencingToken)`, and always
 * releases, returning fn's result. Throws NotAcquiredError (fn not run) when the outcome is not
 * ACQUIRED. If the lease died while fn ran, the release answers NOTFOUND and withPermit throws
 * LeaseLostError, unless fn itself threw (then fn's error is thrown).
 */
async function withPermit(sem, lease, weight, timeout, fn) {
  const result = await sem.acquire(lease, weight, timeout);
  if (!result.acquired) throw new NotAcquiredError(result, sem, weight, timeout);
  return runReleasing([sem], lease, () => fn(result.fencingToken));
}

/**
 * withPermit over several semaphores at once (SEM.ACQUIREALL, all or none): `parts` is a list
 * of [Semaphore, weight] of one client and namespace; fn gets the fencing tokens in the order
 * asked, and every hold is released afterwards. Throws NotAcquiredAllError (fn not run, nothing
 * held) when the outcome is not ACQUIRED; LeaseLostError as withPermit.
 */
async function withPermits(parts, lease, timeout, fn) {
  const result = await Semaphore.acquireAll(parts, lease, timeout);
  if (!result.acquired) throw new NotAcquiredAllError(result, parts, timeout);
  return runReleasing(parts.map(([sem]) => sem), lease, () => fn(result.holds.map((h) => h.fencingToken)));
}

/** Runs fn, then releases `lease` on each of `sems` (every one, whatever fails). fn's error
 * wins; else a NOTFOUND release (the hold was lost meanwhile) throws LeaseLostError. */
async function runReleasing(sems, lease, fn) {
  let value;
  try {
    value = await fn();
  } catch (err) {
    await Promise.allSettled(sems.map((sem) => sem.release(lease)));
    throw err;
  }
  const failed = (await Promise.allSettled(sems.map((sem) => sem.release(lease))))
    .find((r) => r.status === 'rejected');
  if (failed) {
    const err = failed.reason;
    if (isNotFound(err)) {
      const where = sems.map((sem) => `${sem.ns}/${sem.name}`).join(', ');
      throw new LeaseLostError(`the hold on ${where} was lost before release: ${err.message}`, { cause: err });
    }
    throw err;
  }
  return value;
}

module.exports = {
  ACQUIRED,
  UNAVAILABLE,
  TIMED_OUT,
  PermitdError,
  NotAcquiredError,
  NotAcquiredAllError,
  LeaseLostError,
  MovedError,
  RetriesExhaustedError,
  setRetryPolicy,
  Namespace,
  Lease,
  Heartbeat,
  Semaphore,
  withPermit,
  withPermits,
  toObject,
  parseEntity,
  parsePage,
  parseAcquire,
  parseAcquireAll,
  isNotFound,
  isReplyError,
};
