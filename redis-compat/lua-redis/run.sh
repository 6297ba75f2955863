#!/usr/bin/env bash
# redis-compat/lua-redis/run.sh PORT: runs session.lua on Debian's Lua 5.1 and lua-redis
# (lua5.1, lua-redis and its lua-socket, installed if missing) against a permitd already
# listening on 127.0.0.1:PORT. The script prints "ok - ..." per step and "N passed, M failed".
set -euo pipefail
PORT=${1:?usage: run.sh PORT}
cd "$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=../lib.sh
. ../lib.sh
apt_install lua5.1=5.1.5 lua-redis=2.0.5
timeout 60 lua5.1 session.lua "${PERMITD_HOST:-127.0.0.1}" "$PORT"
