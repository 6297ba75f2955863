'use strict';
// Shared setup of the ioredis tests (the server address and the helpers every JavaScript suite
// uses are in util.js). Every test works in a namespace of its own, so the suite can run again
// and again against the same server.
const Redis6 = require('ioredis');
const Redis5 = require('ioredis5');
const { HOST, PORT, PASSWORD, newName, asMap, waitFor, sleep } = require('./util');

// The client setups the suite runs under. ioredis 5 speaks RESP2 only; ioredis 6 sends
// HELLO 3 on connect by default and maps RESP3 replies to RESP2 shapes ("legacy") unless
// replyMapping is "resp3" (maps become plain objects).
const SETUPS = [
  { name: 'ioredis5 (RESP2)', Redis: Redis5, options: {}, proto: 2 },
  { name: 'ioredis6 (RESP3, legacy mapping)', Redis: Redis6, options: {}, proto: 3 },
  { name: 'ioredis6 (RESP3, resp3 mapping)', Redis: Redis6, options: { replyMapping: 'resp3' }, proto: 3 },
  { name: 'ioredis6 (protocol 2)', Redis: Redis6, options: { protocol: 2 }, proto: 2 },
];

const clients = new Set();

/** A connected client (stringNumbers by default: nanosecond integers exceed 2^53). */
async function connect(setup, extra = {}) {
  const c = new setup.Redis({
    host: HOST, port: PORT, password: PASSWORD, stringNumbers: true, lazyConnect: true,
    maxRetriesPerRequest: 0, ...setup.options, ...extra,
  });
  c.on('error', () => {});
  clients.add(c);
  await c.connect();
  return c;
}

async function closeAll() {
  for (const c of clients) {
    c.disconnect();
  }
  clients.clear();
}

async function newNamespace(c, prefix) {
  const ns = newName(prefix);
  await c.call('NS.CREATE', ns, 'DESC', 'redis-compat node');
  return ns;
}

async function newLease(c, ns, pid = 'w', ttl = 30) {
  return asMap(await c.call('LEASE.CREATE', ns, pid, ttl)).lease_id;
}

/** INFO field as a number. */
async function infoNumber(c, section, field) {
  const text = String(await c.info(section));
  const m = text.match(new RegExp(`^${field}:(\\d+)`, 'm'));
  if (!m) throw new Error(`no ${field} in INFO ${section}`);
  return Number(m[1]);
}

module.exports = {
  HOST, PORT, SETUPS, Redis5, Redis6, connect, closeAll, newName, asMap, newNamespace, newLease,
  waitFor, infoNumber, sleep,
};
