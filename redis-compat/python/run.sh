#!/usr/bin/env bash
# redis-compat/python/run.sh PORT [PYTEST ARGS...]: runs the redis-py suite (sync + asyncio, RESP2 +
# RESP3) against a permitd already listening on 127.0.0.1:PORT, or what the pytest arguments select;
# test_cluster_failover.py starts a 3-node cluster of its own from PERMITD_BIN (skipped when that
# is unset). Creates .venv beside this file and installs the pinned requirements.txt into it
# (again only when requirements.txt changed).
set -euo pipefail
PORT=${1:?usage: run.sh PORT}
cd "$(dirname "${BASH_SOURCE[0]}")"

PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null || true)" != "$want" ]; then
    echo "==> creating $VENV and installing requirements.txt"
    rm -rf "$VENV"
    if ! "$PY" -m venv "$VENV" 2>/dev/null; then
        # Debian's python3 needs python3-venv for ensurepip
        echo "==> python3 -m venv failed; installing python3-venv" >&2
        if command -v apt-get >/dev/null 2>&1; then
            apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null
        fi
        rm -rf "$VENV"
        "$PY" -m venv "$VENV"
    fi
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-input -r requirements.txt
    echo "$want" > "$STAMP"
fi

export PERMITD_HOST=${PERMITD_HOST:-127.0.0.1}
export PERMITD_PORT=$PORT
exec "$VENV/bin/python" -m pytest "${@:2}"
