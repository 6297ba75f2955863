#!/usr/bin/env bash
# redis-compat/go-redis/run.sh PORT: builds session.go with Debian's Go toolchain against
# Debian's go-redis v5 (golang-go and golang-gopkg-redis.v5-dev, installed if missing; GOPATH
# mode, nothing fetched) and runs that session against a permitd already listening on
# 127.0.0.1:PORT. Measured on a 2-core machine: the install about 45 s once, the cold build
# under 10 s. The program prints "ok - ..." per step and "N passed, M failed".
set -euo pipefail
PORT=${1:?usage: run.sh PORT}
cd "$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=../lib.sh
. ../lib.sh
apt_install golang-go=1.19 golang-gopkg-redis.v5-dev=5.2.9

WORK=$(mktemp -d "${TMPDIR:-/tmp}/permitd-rc-go-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)
GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS='' GOENV=off GOCACHE="$WORK/cache" \
    timeout 300 go build -o "$WORK/session" session.go
echo "$(go version): built in $(($(date +%s) - start)) s"
timeout 90 "$WORK/session" "${PERMITD_HOST:-127.0.0.1}:$PORT"
