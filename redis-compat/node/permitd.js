'use strict';
// permitd.js: a thin helper for permitd on top of ioredis (5.x or 6.x, RESP2 or RESP3).
//
// Every method is one server command (via `client.call`), plus a lease heartbeat. The server
// does the waiting (SEM.ACQUIRE parks server-side up to `timeout` seconds, FIFO), expiry and
// fencing tokens; nothing here queues, polls or retries an acquire.
//
//   const Redis = require('ioredis');
//   const { Lease, Semaphore, withPermit } = require('./permitd');
//   const redis = new Redis({ port: 6379, stringNumbers: true });
//   const lease = await Lease.create(redis, 'team', 'worker-1', 30);
//   const hb = lease.heartbeat({ onLost: (err) => console.error('lease lost', err) });
//   await withPermit(new Semaphore(redis, 'team', 'db'), lease, 2, 10, async (token) => { ... });
//   // several at once, all or none (SEM.ACQUIREALL); tokens in the order asked:
//   const [db, cache] = [new Semaphore(redis, 'team', 'db'), new Semaphore(redis, 'team', 'cache')];
//   await withPermits([[db, 1], [cache, 2]], lease, 10, async (tokens) => { ... });
//   await hb.stop(); await lease.revoke();
//
// Two ioredis facts shape this helper:
// - Timestamps are nanosecond integers above 2^53, so a client must be created with
//   `stringNumbers: true` or they lose precision (rounded to a multiple of 256 ns). Fencing
//   tokens are a counter below 2^53, exact as a Number too, except in a data directory written
//   before they were one, which keeps counting from its clock-sized tokens (about 1.8e18). The
//   helper refuses other clients, and returns timestamps and tokens as BigInt.
// - One ioredis client is one connection, and a parked SEM.ACQUIRE holds every command queued
//   behind it on that connection (as BLPOP does). So the heartbeat runs on its own connection
//   (`client.duplicate()`), and a program that waits on several semaphores at once should give
//   each waiting task its own client.
// - ioredis's `commandTimeout` rejects a command's promise without cancelling it on the server:
//   an acquire could then be granted after the caller gave up. Semaphore.acquire refuses a
//   timeout that is not below the client's commandTimeout.

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

function requireStringNumbers(client) {
  if (!client || typeof client.call !== 'function') {
    throw new TypeError('permitd: expected an ioredis client');
  }
  if (!client.options || client.options.stringNumbers !== true) {
    throw new TypeError('permitd: create the ioredis client with { stringNumbers: true }: ' +
      'timestamps are nanosecond integers above Number.MAX_SAFE_INTEGER');
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
  if (!meta) return [];
  const pairs = meta instanceof Map ? [...meta] : Array.isArray(meta) ? meta : Object.entries(meta);
  if (!pairs.length) return [];
  return ['META', ...pairs.flat()];
}

const leaseId = (lease) => (lease instanceof Lease ? lease.id : String(lease));

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

  static async create(client, ns, processId, ttl, meta) {
    requireStringNumbers(client);
    const sent = performance.now();
    const info = parseEntity(await client.call('LEASE.CREATE', ns, processId, Number(ttl), ...metaArgs(meta)));
    const lease = new Lease(client, ns, str(info.lease_id), ttl, info);
    lease.aliveUntil = sent + Number(ttl) * 1000;
    return lease;
  }

  /** LEASE.REFRESH: expires_at = server now + ttl (default: this lease's ttl). */
  async refresh(ttl, client = this.client) {
    if (ttl !== undefined && ttl !== null) this.ttl = Number(ttl);
    const sent = performance.now();
    this.info = parseEntity(await client.call('LEASE.REFRESH', this.ns, this.id, this.ttl));
    this.aliveUntil = sent + this.ttl * 1000;
    return this.info;
  }

  async get() {
    return parseEntity(await this.client.call('LEASE.GET', this.ns, this.id));
  }

  /** LEASE.REVOKE: releases every hold of the lease and deletes it. */
  async revoke() {
    await this.client.call('LEASE.REVOKE', this.ns, this.id);
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
 * timer stops) when LEASE.REFRESH answers an error (NOTFOUND: expired or revoked), or when
 * connection errors last past the moment the lease is known alive until.
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
  }

  start() {
    if (!this._client) {
      // its own connection, so a parked SEM.ACQUIRE on the main one cannot delay a refresh
      this._client = this.lease.client.duplicate();
      this._client.on('error', () => {}); // connection errors surface through refresh()
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
      await this.lease.refresh(undefined, this._client);
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

  /** Stops the timer (waiting for a refresh in flight) and closes the heartbeat's connection. */
  async stop() {
    this._stopped = true;
    clearTimeout(this._timer);
    if (this._inflight) await this._inflight.catch(() => {});
    this._close();
  }
}

function checkCommandTimeout(client, timeout) {
  const ct = client.options.commandTimeout;
  if (ct && Number(timeout) > 0 && ct <= Number(timeout) * 1000) {
    // ioredis would reject the promise while the acquire is still parked on the server; if it
    // is granted afterwards, the caller would not know it holds the permits.
    throw new RangeError(`permitd: acquire timeout ${timeout} s is not below the client's ` +
      `commandTimeout ${ct} ms; use a client whose commandTimeout exceeds the acquire timeout`);
  }
}

class Semaphore {
  constructor(client, ns, name) {
    requireStringNumbers(client);
    this.client = client;
    this.ns = ns;
    this.name = name;
  }

  /** SEM.ACQUIRE: waits server-side up to `timeout` s (0: do not wait). UNAVAILABLE and
   * TIMED_OUT are results (check `.acquired`); server errors reject. */
  async acquire(lease, weight = 1, timeout = 0, meta = undefined) {
    checkCommandTimeout(this.client, timeout);
    const reply = await this.client.call('SEM.ACQUIRE', this.ns, this.name, leaseId(lease),
      Number(weight), String(timeout), ...metaArgs(meta));
    return parseAcquire(reply);
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
    const args = ['SEM.ACQUIREALL', ns, leaseId(lease), String(timeout)];
    for (const [sem, weight] of parts) args.push(sem.name, Number(weight));
    return parseAcquireAll(await client.call(...args, ...metaArgs(meta)));
  }

  /** SEM.RELEASE: the semaphore (unchanged if the lease held nothing here). */
  async release(lease) {
    return parseEntity(await this.client.call('SEM.RELEASE', this.ns, this.name, leaseId(lease)));
  }

  async get() {
    return parseEntity(await this.client.call('SEM.GET', this.ns, this.name));
  }

  /** One page of SEM.HOLDERS, oldest first: { holders, next_cursor, previous_cursor }. */
  async holders({ limit, cursor } = {}) {
    const args = ['SEM.HOLDERS', this.ns, this.name];
    if (cursor) args.push('CURSOR', cursor);
    if (limit !== undefined) args.push('LIMIT', Number(limit));
    return parsePage(await this.client.call(...args));
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
