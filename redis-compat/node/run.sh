#!/usr/bin/env bash
# redis-compat/node/run.sh PORT [TEST FILE...]: runs the ioredis suite (ioredis 5 on RESP2,
# ioredis 6 on RESP3, plain and Cluster, and the permitd.js helper) with node's built-in test
# runner against a permitd already listening on 127.0.0.1:PORT, or only the test files named;
# test/retry.test.js runs the helper's cluster-mode retries against scripted fake nodes of its
# own (test/fake.js) instead, and test/cluster_failover.test.js starts a 3-node cluster of its
# own from PERMITD_BIN (skipped when that is unset). Installs the locked dependencies with
# `npm ci` (again only when package-lock.json changed).
set -euo pipefail
PORT=${1:?usage: run.sh PORT}
cd "$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=../lib.sh
. ../lib.sh
node_test "$PORT" "${@:2}"
