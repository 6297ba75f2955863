'use strict';
// ioredis Cluster against permitd: `new Redis.Cluster([{ host, port }])` with nothing else
// configured, one whole session (session.js) each for ioredis 5 and ioredis 6; and once with
// redisOptions.stringNumbers, the way to read nanosecond timestamps exactly.
const { describe, it } = require('node:test');
const { Redis5, Redis6 } = require('./common');
const { HOST, PORT, PASSWORD } = require('./util');
const { runSession } = require('./session');

const READY_TIMEOUT_MS = 10000;

/** Waits for the cluster client's first topology (CLUSTER SLOTS) and connection. */
function ready(c) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(
      `ioredis Cluster not ready after ${READY_TIMEOUT_MS} ms (status ${c.status})`)), READY_TIMEOUT_MS);
    c.once('ready', () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

/** A pipeline's or EXEC's [[err, reply], ...] as replies; the first error is thrown. */
async function replies(batch, cmds) {
  const res = await cmds.reduce((b, args) => b.call(...args), batch).exec();
  for (const [err] of res) if (err) throw err;
  return res.map(([, reply]) => reply);
}

function adapter(Redis, resp, redisOptions = {}) {
  return {
    resp,
    numbers: redisOptions.stringNumbers ? 'string' : 'number',
    crossSlot: /^CROSSSLOT /,
    async connect() {
      const options = { ...redisOptions, ...(PASSWORD ? { password: PASSWORD } : {}) };
      const c = new Redis.Cluster([{ host: HOST, port: PORT }],
        Object.keys(options).length ? { redisOptions: options } : undefined);
      c.on('error', () => {});
      try {
        await ready(c);
      } catch (err) {
        c.disconnect();
        throw err;
      }
      return {
        call: (args) => c.call(...args),
        multi: (cmds) => replies(c.multi(), cmds),
        pipeline: (cmds) => replies(c.pipeline(), cmds),
        close: () => c.disconnect(),
      };
    },
  };
}

describe('ioredis Cluster', () => {
  // ioredis 5 speaks RESP2 only; ioredis 6 sends HELLO 3 by default
  it('ioredis 5 Cluster (RESP2)', (t) => runSession(t, adapter(Redis5, 2), 'ioc'));
  it('ioredis 6 Cluster (RESP3)', (t) => runSession(t, adapter(Redis6, 3), 'ioc'));
  it('ioredis 6 Cluster (RESP3, redisOptions.stringNumbers)', (t) =>
    runSession(t, adapter(Redis6, 3, { stringNumbers: true }), 'ioc'));
});
