#!/usr/bin/env bash
# redis-compat/node-redis/run.sh PORT: one whole permitd session per node-redis setup (4.7.1 on
# RESP2; 5.9.0 on RESP2, RESP3, and RESP3 with a String typeMapping for integers; createClient
# and createCluster) with node's built-in test runner, against a permitd already listening on
# 127.0.0.1:PORT. The session itself is ../node/test/session.js. Installs the locked
# dependencies with `npm ci` (again only when package-lock.json changed).
set -euo pipefail
PORT=${1:?usage: run.sh PORT}
cd "$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=../lib.sh
. ../lib.sh
node_test "$PORT"
