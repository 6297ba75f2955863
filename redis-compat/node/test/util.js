'use strict';
// What every JavaScript suite shares, whatever its client library (so it requires none): the
// server address from PERMITD_PORT (and PERMITD_HOST, default 127.0.0.1), fresh names, reply
// shapes and polling. redis-compat/node (ioredis) and redis-compat/node-redis both use it.
const crypto = require('node:crypto');

const HOST = process.env.PERMITD_HOST || '127.0.0.1';
const PORT = Number(process.env.PERMITD_PORT || 6379);
const PASSWORD = process.env.PERMITD_PASSWORD || undefined;

function newName(prefix = 'js') {
  return `${prefix}-${crypto.randomBytes(6).toString('hex')}`;
}

/** RESP2 flat array or RESP3 object/Map -> plain object. */
function asMap(reply) {
  if (reply instanceof Map) return Object.fromEntries(reply);
  if (Array.isArray(reply)) {
    if (reply.length % 2) throw new Error(`odd-length map reply: ${JSON.stringify(reply)}`);
    const o = {};
    for (let i = 0; i < reply.length; i += 2) o[reply[i]] = reply[i + 1];
    return o;
  }
  if (reply && typeof reply === 'object') return reply;
  throw new Error(`not a map reply: ${reply}`);
}

async function waitFor(pred, timeoutMs = 5000) {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    if (await pred()) return true;
    await new Promise((r) => setTimeout(r, 20));
  }
  return false;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

module.exports = { HOST, PORT, PASSWORD, newName, asMap, waitFor, sleep };
