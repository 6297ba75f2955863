#!/usr/bin/env bash
# redis-compat/hiredis/run.sh PORT: builds session.c with cc against Debian's libhiredis
# (libhiredis-dev, installed if missing) and runs that whole session against a permitd already
# listening on 127.0.0.1:PORT. The program prints "ok - ..." per step and "N passed, M failed".
set -euo pipefail
PORT=${1:?usage: run.sh PORT}
cd "$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=../lib.sh
. ../lib.sh
apt_install libhiredis-dev=0.14.1
command -v cc >/dev/null 2>&1 || apt_install gcc

WORK=$(mktemp -d "${TMPDIR:-/tmp}/permitd-rc-hiredis-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cc -std=gnu11 -Wall -Wextra -Werror -O1 -o "$WORK/session" session.c -lhiredis
timeout 60 "$WORK/session" "${PERMITD_HOST:-127.0.0.1}" "$PORT"
