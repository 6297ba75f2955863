'use strict';
// node-redis 4 and 5 against permitd: one whole session (../../node/test/session.js) per setup,
// with plain createClient and with createCluster given the single server as its root node.
const { describe, it } = require('node:test');
const redis4 = require('redis4');
const redis5 = require('redis5');
const { HOST, PORT, PASSWORD } = require('../../node/test/util');
const { runSession, routingKey } = require('../../node/test/session');

// node-redis sends every argument as a string or a Buffer; the session passes numbers too.
const strings = (args) => args.map(String);
// Every command goes to the namespace's master (isReadonly false): a hold is read back from
// the node that granted it.
const READONLY = false;

// node-redis 4 has no RESP option at all (its decoder is RESP2 only); node-redis 5 speaks RESP2
// unless given `RESP: 3`. Both turn every integer into a JS Number, unless node-redis 5 is
// given a typeMapping for NUMBER.
const PLAIN = [
  { name: 'node-redis 4 createClient (RESP2)', lib: redis4, options: {}, resp: 2 },
  { name: 'node-redis 5 createClient (RESP2)', lib: redis5, options: {}, resp: 2 },
  { name: 'node-redis 5 createClient (RESP3)', lib: redis5, options: { RESP: 3 }, resp: 3 },
  {
    name: 'node-redis 5 createClient (RESP3, typeMapping NUMBER: String)',
    lib: redis5,
    options: { RESP: 3, commandOptions: { typeMapping: { [redis5.RESP_TYPES.NUMBER]: String } } },
    resp: 3,
    numbers: 'string',
    // node-redis 5 decodes EXEC's reply without the client's typeMapping
    execNumbers: 'number',
  },
];
const CLUSTER = [
  { name: 'node-redis 4 createCluster (RESP2)', lib: redis4, options: {}, resp: 2 },
  { name: 'node-redis 5 createCluster (RESP2)', lib: redis5, options: {}, resp: 2 },
  { name: 'node-redis 5 createCluster (RESP3)', lib: redis5, options: { RESP: 3 }, resp: 3 },
];

const close = (lib, c) => (lib === redis4 ? c.disconnect() : c.destroy());

function plainAdapter(setup) {
  return {
    resp: setup.resp,
    numbers: setup.numbers || 'number',
    execNumbers: setup.execNumbers,
    crossSlot: /^CROSSSLOT /,
    async connect() {
      const c = setup.lib.createClient({ socket: { host: HOST, port: PORT }, password: PASSWORD, ...setup.options });
      c.on('error', () => {});
      await c.connect();
      const batch = (cmds) => cmds.reduce((m, args) => m.addCommand(strings(args)), c.multi());
      return {
        call: (args) => c.sendCommand(strings(args)),
        multi: (cmds) => batch(cmds).exec(),
        pipeline: (cmds) => batch(cmds).execAsPipeline(),
        close: () => close(setup.lib, c),
      };
    },
  };
}

function clusterAdapter(setup) {
  // node-redis 4's cluster multi takes (firstKey, args), node-redis 5's (firstKey, isReadonly, args)
  const add = setup.lib === redis4
    ? (m, args) => m.addCommand(routingKey(args), strings(args))
    : (m, args) => m.addCommand(routingKey(args), READONLY, strings(args));
  return {
    resp: setup.resp,
    numbers: 'number',
    // node-redis sends the whole MULTI to the node of its first key: the server refuses it
    crossSlot: /^CROSSSLOT /,
    async connect() {
      const c = setup.lib.createCluster({
        rootNodes: [{ socket: { host: HOST, port: PORT } }],
        defaults: PASSWORD ? { password: PASSWORD } : undefined,
        ...setup.options,
      });
      c.on('error', () => {});
      await c.connect();
      const batch = (cmds) => cmds.reduce(add, c.multi(routingKey(cmds[0])));
      return {
        call: (args) => c.sendCommand(routingKey(args), READONLY, strings(args)),
        multi: (cmds) => batch(cmds).exec(),
        pipeline: (cmds) => batch(cmds).execAsPipeline(),
        close: () => close(setup.lib, c),
      };
    },
  };
}

describe('node-redis createClient', () => {
  for (const setup of PLAIN) {
    it(setup.name, (t) => runSession(t, plainAdapter(setup), 'nr'));
  }
});

describe('node-redis createCluster', () => {
  for (const setup of CLUSTER) {
    it(setup.name, (t) => runSession(t, clusterAdapter(setup), 'nrc'));
  }
});
