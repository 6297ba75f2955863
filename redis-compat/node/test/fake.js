'use strict';
// A scripted fake permitd node for the retry tests (retry.test.js): a real RESP2/RESP3 server on
// 127.0.0.1 that answers what a cluster node answers per SPEC §10 when a test scripts it to
// (MOVED, TRYAGAIN, CLUSTERDOWN, LEADERCHANGED, a dropped connection), and otherwise runs the
// commands on a small in-memory state with the reply shapes of the real permitd (field names
// and order copied from what target/debug/permitd answers). It needs no running server: the
// cluster mode it stands for is not wired into the real one yet.
//
//   const node = await new FakeNode().start();
//   node.script('SEM.ACQUIRE', 'TRYAGAIN', 'LEADERCHANGED'); // the next two SEM.ACQUIREs
//   node.during('LEASE.REFRESH', 900, 'CLUSTERDOWN');        // every one for 900 ms
//   node.always('SEM.GET', 'CLUSTERDOWN');
//   node.sent('SEM.ACQUIRE')  // [{ name, args, at }] as received
//
// Actions: 'TRYAGAIN', 'CLUSTERDOWN', { moved: 'host:port' } (nothing runs); 'LEADERCHANGED'
// (runs, then answers the error instead of the reply); 'DROP' (runs, then closes the connection
// without a reply); 'DROP_UNRUN' (closes it, nothing runs); { delay: ms, then: action } (as a
// parked acquire answered at step-down).
const net = require('node:net');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const nowNs = () => BigInt(Date.now()) * 1000000n;

/** Redis Cluster's key slot (CRC16/XMODEM mod 16384), of the namespace. */
function keySlot(key) {
  let crc = 0;
  for (const byte of Buffer.from(key)) {
    crc ^= byte << 8;
    for (let i = 0; i < 8; i++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc % 16384;
}

// Reply values: string (bulk), number / bigint (integer), null, Array, { map: [[k, v], ...] },
// { simple: 'OK' }, { error: 'CODE text' }, { verbatim: text }.
function encode(v, proto) {
  if (v === null) return proto === 3 ? '_\r\n' : '$-1\r\n';
  if (typeof v === 'number' || typeof v === 'bigint') return `:${v}\r\n`;
  if (typeof v === 'string') return `$${Buffer.byteLength(v)}\r\n${v}\r\n`;
  if (Array.isArray(v)) return `*${v.length}\r\n${v.map((x) => encode(x, proto)).join('')}`;
  if (v.simple !== undefined) return `+${v.simple}\r\n`;
  if (v.error !== undefined) return `-${v.error}\r\n`;
  if (v.map) {
    const body = v.map.map(([k, x]) => encode(k, proto) + encode(x, proto)).join('');
    return proto === 3 ? `%${v.map.length}\r\n${body}` : `*${v.map.length * 2}\r\n${body}`;
  }
  throw new TypeError(`cannot encode ${v}`);
}

/** Complete RESP arrays of bulk strings at the start of `buf`: [requests, bytes used]. */
function parseRequests(buf) {
  const out = [];
  let pos = 0;
  for (;;) {
    const start = pos;
    const line = () => {
      const end = buf.indexOf('\r\n', pos);
      if (end < 0) return null;
      const text = buf.toString('latin1', pos, end);
      pos = end + 2;
      return text;
    };
    const head = line();
    if (head === null) return [out, start];
    const count = Number(head.slice(1));
    const args = [];
    for (let i = 0; i < count; i++) {
      const len = line();
      if (len === null) return [out, start];
      const n = Number(len.slice(1));
      if (buf.length < pos + n + 2) return [out, start];
      args.push(buf.toString('utf8', pos, pos + n));
      pos += n + 2;
    }
    out.push(args);
  }
}

const err = (text) => ({ error: text });
const OK = { simple: 'OK' };

/** Option words after the fixed arguments: DESC text, META k v ... (last). */
function options(rest) {
  const o = { description: '', metadata: [] };
  for (let i = 0; i < rest.length; i++) {
    const word = rest[i].toUpperCase();
    if (word === 'DESC') o.description = rest[++i];
    else if (word === 'META') {
      for (i += 1; i + 1 < rest.length; i += 2) o.metadata.push([rest[i], rest[i + 1]]);
    }
  }
  return o;
}

class FakeNode {
  constructor() {
    this.received = [];
    this.rules = [];
    this.sockets = new Set();
    this.connections = 0;
    // what CLUSTER SLOTS names as the leader (a test moves it to another node)
    this.leader = () => this.address;
    this.namespaces = new Map();
    this.semaphores = new Map();
    this.leases = new Map();
    this.expired = new Set(); // leases that were used after their expiry
    this.hwm = 0;
    this.leaseSeq = 0;
  }

  async start() {
    this.server = net.createServer((sock) => this._serve(sock));
    await new Promise((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.port = this.server.address().port;
    this.address = `127.0.0.1:${this.port}`;
    return this;
  }

  async stop() {
    for (const s of this.sockets) s.destroy();
    await new Promise((resolve) => this.server.close(resolve));
  }

  /** The next SEM.ACQUIREs (or whatever `name`) get these actions, one each. */
  script(name, ...actions) {
    for (const action of actions) this.rules.push({ name, action, count: 1 });
  }

  /** Every `name` command in the next `ms` gets `action`. */
  during(name, ms, action) {
    this.rules.push({ name, action, until: performance.now() + ms });
  }

  always(name, action) {
    this.rules.push({ name, action, until: Infinity });
  }

  sent(name) {
    return this.received.filter((r) => r.name === name);
  }

  _rule(name) {
    const now = performance.now();
    const rule = this.rules.find((r) => r.name === name && (r.count > 0 || r.until > now));
    if (rule && rule.count) rule.count -= 1;
    return rule && rule.action;
  }

  _serve(sock) {
    this.sockets.add(sock);
    this.connections += 1;
    const conn = { proto: 2, sock };
    let buf = Buffer.alloc(0);
    let chain = Promise.resolve();
    sock.on('close', () => this.sockets.delete(sock));
    sock.on('error', () => {});
    sock.on('data', (data) => {
      buf = Buffer.concat([buf, data]);
      const [requests, used] = parseRequests(buf);
      buf = buf.subarray(used);
      // one at a time per connection, as permitd runs them (a parked acquire holds the rest)
      for (const args of requests) chain = chain.then(() => this._answer(conn, args));
    });
  }

  async _answer(conn, args) {
    const name = args[0].toUpperCase();
    if (/^(NS|SEM|LEASE)\./.test(name)) this.received.push({ name, args: args.slice(1), at: performance.now() });
    let action = this._rule(name);
    if (action && action.delay) {
      await sleep(action.delay);
      action = action.then;
    }
    let reply;
    if (action === 'TRYAGAIN') reply = err('TRYAGAIN the new leader is not ready yet');
    else if (action === 'CLUSTERDOWN') reply = err('CLUSTERDOWN no leader');
    else if (action && action.moved) reply = err(`MOVED ${keySlot(args[1] || '')} ${action.moved}`);
    else if (action === 'DROP_UNRUN') reply = undefined;
    else {
      reply = await this._run(conn, name, args.slice(1));
      if (action === 'LEADERCHANGED') reply = err('LEADERCHANGED outcome unknown');
      if (action === 'DROP') reply = undefined;
    }
    if (conn.sock.destroyed) return;
    if (reply === undefined) conn.sock.destroy();
    else conn.sock.write(encode(reply, conn.proto));
  }

  // ---- the state, as permitd answers ----

  _sem(ns, name) {
    return this.semaphores.get(`${ns}\0${name}`);
  }

  _lease(ns, id) {
    const l = this.leases.get(id);
    if (!l || l.ns !== ns) return null;
    if (l.expiresAt < Date.now()) {
      this.expired.add(id);
      return null;
    }
    return l;
  }

  semEntity(s) {
    const held = [...s.holds.values()].reduce((n, h) => n + h.weight, 0);
    return {
      map: [['name', s.name], ['description', s.description], ['permits', s.permits], ['active_holds', held],
        ['active_holders_count', s.holds.size], ['waiters', 0], ['version', 1], ['created_at', s.createdAt],
        ['updated_at', s.createdAt], ['last_activity_at', nowNs()], ['metadata', { map: s.metadata }]],
    };
  }

  leaseEntity(l) {
    return {
      map: [['lease_id', l.id], ['process_id', l.pid], ['created_at', l.createdAt],
        ['expires_at', BigInt(l.expiresAt) * 1000000n], ['metadata', { map: l.metadata }]],
    };
  }

  nsEntity(n) {
    return {
      map: [['name', n.name], ['description', n.description], ['metadata', { map: n.metadata }], ['version', 1],
        ['created_at', n.createdAt], ['updated_at', n.createdAt]],
    };
  }

  /** An acquire reply's `semaphore` and, when acquired, `fencing_token`. */
  holdFields(s, hold) {
    const fields = [['semaphore', this.semEntity(s)]];
    return hold ? [...fields, ['fencing_token', hold.token]] : fields;
  }

  /** The hold `weight` of `lease` on `s` (a re-acquire keeps its token), or null if it does not fit. */
  _take(s, lease, weight) {
    const mine = s.holds.get(lease);
    const held = [...s.holds.values()].reduce((n, h) => n + h.weight, 0) - (mine ? mine.weight : 0);
    if (held + weight > s.permits) return null;
    const hold = { weight, token: mine ? mine.token : ++this.hwm };
    s.holds.set(lease, hold);
    return hold;
  }

  async _run(conn, name, a) {
    switch (name) {
      case 'HELLO': {
        if (a[0]) conn.proto = Number(a[0]);
        return {
          map: [['server', 'permitd'], ['version', '7.0.0'], ['proto', conn.proto], ['id', this.connections],
            ['mode', 'cluster'], ['role', 'master'], ['modules', []]],
        };
      }
      case 'PING': return { simple: 'PONG' };
      case 'INFO': return '# Server\r\nredis_version:7.0.0\r\nredis_mode:cluster\r\n';
      case 'CLUSTER': {
        const sub = (a[0] || '').toUpperCase();
        if (sub === 'SLOTS') {
          const [host, port] = this.leader().split(':');
          return [[0, 16383, [host, Number(port), 'f'.repeat(40)]]];
        }
        if (sub === 'INFO') return 'cluster_state:ok\r\ncluster_slots_assigned:16384\r\ncluster_known_nodes:1\r\n';
        return err(`ERR unknown subcommand '${a[0]}'`);
      }
      case 'NS.CREATE': {
        if (this.namespaces.has(a[0])) return err(`ALREADYEXISTS namespace '${a[0]}' already exists`);
        const n = { name: a[0], ...options(a.slice(1)), createdAt: nowNs() };
        this.namespaces.set(a[0], n);
        return this.nsEntity(n);
      }
      case 'NS.GET': {
        const n = this.namespaces.get(a[0]);
        return n ? this.nsEntity(n) : err(`NOTFOUND namespace '${a[0]}' not found`);
      }
      case 'NS.DELETE':
        this.namespaces.delete(a[0]);
        return OK;
      case 'SEM.CREATE': {
        const [ns, sem, permits] = a;
        if (this._sem(ns, sem)) return err(`ALREADYEXISTS semaphore '${sem}' already exists in namespace '${ns}'`);
        const s = { name: sem, permits: Number(permits), ...options(a.slice(3)), holds: new Map(), createdAt: nowNs() };
        this.semaphores.set(`${ns}\0${sem}`, s);
        return this.semEntity(s);
      }
      case 'SEM.GET': {
        const s = this._sem(a[0], a[1]);
        return s ? this.semEntity(s) : err(`NOTFOUND semaphore '${a[1]}' not found in namespace '${a[0]}'`);
      }
      case 'SEM.DELETE':
        if (!this.namespaces.has(a[0])) return err(`NOTFOUND namespace '${a[0]}' not found`);
        this.semaphores.delete(`${a[0]}\0${a[1]}`);
        return OK;
      case 'SEM.RELEASE': {
        const s = this._sem(a[0], a[1]);
        if (!s) return err(`NOTFOUND semaphore '${a[1]}' not found in namespace '${a[0]}'`);
        s.holds.delete(a[2]);
        return this.semEntity(s);
      }
      case 'SEM.ACQUIRE': {
        const [ns, sem, lease, weight, timeout] = a;
        const s = this._sem(ns, sem);
        if (!s) return err(`NOTFOUND semaphore '${sem}' not found in namespace '${ns}'`);
        if (!this._lease(ns, lease)) return err(`NOTFOUND lease not found or expired in namespace '${ns}'`);
        const hold = this._take(s, lease, Number(weight));
        if (hold) return { map: [['outcome', 'ACQUIRE_OUTCOME_ACQUIRED'], ...this.holdFields(s, hold)] };
        if (Number(timeout) === 0) return { map: [['outcome', 'ACQUIRE_OUTCOME_UNAVAILABLE'], ...this.holdFields(s)] };
        await sleep(Number(timeout) * 1000); // parked; nothing in these tests frees permits meanwhile
        return { map: [['outcome', 'ACQUIRE_OUTCOME_TIMED_OUT'], ...this.holdFields(s)] };
      }
      case 'SEM.ACQUIREALL': {
        const [ns, lease, timeout, ...rest] = a;
        if (!this._lease(ns, lease)) return err(`NOTFOUND lease not found or expired in namespace '${ns}'`);
        const parts = [];
        for (let i = 0; i + 1 < rest.length && rest[i].toUpperCase() !== 'META'; i += 2) {
          const s = this._sem(ns, rest[i]);
          if (!s) return err(`NOTFOUND semaphore '${rest[i]}' not found in namespace '${ns}'`);
          parts.push([s, Number(rest[i + 1])]);
        }
        const holds = parts.map(([s, w]) => this._take(s, lease, w));
        if (holds.every(Boolean)) {
          return {
            map: [['outcome', 'ACQUIRE_OUTCOME_ACQUIRED'],
              ['holds', parts.map(([s], i) => ({ map: this.holdFields(s, holds[i]) }))]],
          };
        }
        const outcome = Number(timeout) === 0 ? 'ACQUIRE_OUTCOME_UNAVAILABLE' : 'ACQUIRE_OUTCOME_TIMED_OUT';
        if (Number(timeout) > 0) await sleep(Number(timeout) * 1000);
        return { map: [['outcome', outcome], ['holds', parts.map(([s]) => ({ map: this.holdFields(s) }))]] };
      }
      case 'LEASE.CREATE': {
        const [ns, pid, ttl] = a;
        this.leaseSeq += 1;
        const l = {
          id: `ls_${String(this.leaseSeq).padStart(28, '0')}`, ns, pid, ttl: Number(ttl),
          metadata: options(a.slice(3)).metadata, createdAt: nowNs(), expiresAt: Date.now() + Number(ttl) * 1000,
        };
        this.leases.set(l.id, l);
        return this.leaseEntity(l);
      }
      case 'LEASE.GET':
      case 'LEASE.REFRESH':
      case 'LEASE.REVOKE': {
        const l = this._lease(a[0], a[1]);
        if (!l) return err(`NOTFOUND lease not found or expired in namespace '${a[0]}'`);
        if (name === 'LEASE.REVOKE') {
          this.leases.delete(l.id);
          for (const s of this.semaphores.values()) s.holds.delete(l.id);
          return OK;
        }
        if (name === 'LEASE.REFRESH') l.expiresAt = Date.now() + Number(a[2]) * 1000;
        return this.leaseEntity(l);
      }
      default:
        return OK; // CLIENT SETNAME / SETINFO, SELECT, READONLY: what a client sends on connect
    }
  }
}

module.exports = { FakeNode, keySlot };
