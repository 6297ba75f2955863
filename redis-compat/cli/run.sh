#!/usr/bin/env bash
# redis-compat/cli/run.sh PORT: checks redis-cli and redis-benchmark (Redis 7 tools, unchanged)
# against a permitd already listening on 127.0.0.1:PORT.
#   - one-shot commands, raw and formatted, under RESP2 and RESP3 (-3), errors, -x, -r;
#   - a script of commands through stdin (`redis-cli < file`), diffed against expected/;
#   - MULTI/EXEC typed into redis-cli (SEM.ACQUIRE and SEM.ACQUIREALL never wait there),
#     CROSSSLOT across namespaces;
#   - COMMAND DOCS / INFO / GETKEYS for SEM.ACQUIRE (what redis-cli's hints use);
#   - a parked SEM.ACQUIRE in one redis-cli woken by SEM.RELEASE from another;
#   - redis-benchmark with custom SEM.* / LEASE.* command lines (plain, -P 16, -3, and three
#     at once on one semaphore), each completing with a nonzero rps, then the server state
#     checked for consistency.
# Installs redis-tools from Debian if redis-cli or redis-benchmark is missing.
# Prints "ok - ..." / "FAIL - ..." per check and "N passed, M failed" last; exits non-zero on
# any failure. Set UPDATE_EXPECTED=1 to rewrite expected/ from the current server.
set -uo pipefail
PORT=${1:?usage: run.sh PORT}
HOST=${PERMITD_HOST:-127.0.0.1}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
EXPECTED=$HERE/expected

if ! command -v redis-cli >/dev/null 2>&1 || ! command -v redis-benchmark >/dev/null 2>&1; then
    echo "==> installing redis-tools (redis-cli, redis-benchmark)"
    if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO=sudo; fi
    $SUDO apt-get update -q >/dev/null
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-tools >/dev/null
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/permitd-rc-cli-XXXXXX")
BG_PIDS=()
cleanup() {
    for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    if [ -n "${NS:-}" ]; then cli NS.DELETE "$NS" >/dev/null 2>&1 || true; fi
    if [ -n "${NS2:-}" ]; then cli NS.DELETE "$NS2" >/dev/null 2>&1 || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

# PERMITD_PASSWORD: for a server started with --requirepass
AUTH_ARGS=()
if [ -n "${PERMITD_PASSWORD:-}" ]; then AUTH_ARGS=(-a "$PERMITD_PASSWORD"); fi
cli() { timeout 60 redis-cli -h "$HOST" -p "$PORT" "${AUTH_ARGS[@]}" --no-auth-warning "$@"; }
bench() { timeout 300 redis-benchmark -h "$HOST" -p "$PORT" "${AUTH_ARGS[@]}" "$@"; }

PASSED=0
FAILED=0
OUT=""
check() {
    local name=$1
    shift
    OUT=""
    if "$@"; then
        PASSED=$((PASSED + 1))
        echo "ok - $name"
    else
        FAILED=$((FAILED + 1))
        echo "FAIL - $name"
        if [ -n "$OUT" ]; then printf '%s\n' "$OUT" | head -n 60 | sed 's/^/    | /'; fi
    fi
}
# fail with a message (kept in OUT for the report)
no() { OUT="${OUT:+$OUT
}$*"; return 1; }

# The line after the first line equal to $1 (raw output puts a field's value on the next line).
value_after() { awk -v k="$1" 'found { print; exit } $0 == k { found = 1 }'; }
# Every line after a line equal to $1.
values_after() { awk -v k="$1" 'found { print; found = 0; next } $0 == k { found = 1 }'; }
# Here-strings, not pipes: grep -q stops at the first match, and under pipefail the printf it
# left writing a long output (COMMAND INFO) failed with SIGPIPE, now and then, on a loaded CI.
has_line() { grep -qxF -- "$2" <<<"$1"; }
has() { grep -qF -- "$2" <<<"$1"; }
has_re() { grep -Eq -- "$2" <<<"$1"; }

# Replaces what changes from run to run, so outputs can be diffed: lease ids, namespace names,
# nanosecond timestamps (19-digit integers) and fencing tokens (a counter that depends on what
# ran before on the server: the integer after a fencing_token field name, on its line in
# redis-cli's formatted RESP3 maps, on the next line otherwise).
normalize() {
    sed -E \
        -e "s/${L1:-@@}/<lease-1>/g" -e "s/${L2:-@@}/<lease-2>/g" \
        -e "s/${NS:-@@}/<ns>/g" -e "s/${NS2:-@@}/<ns2>/g" \
        -e 's/ls_[0-9A-Za-z]{28}/<lease>/g' \
        -e 's/(^|[^0-9])1[0-9]{18}([^0-9]|$)/\1<ns-time>\2/g' |
        awk '
            token { sub(/[0-9]+$/, "<token>"); token = 0 }
            /fencing_token" => \(integer\) [0-9]+$/ { sub(/[0-9]+$/, "<token>") }
            /fencing_token"?$/ { token = 1 }
            { print }'
}

# Diffs stdin (normalized) against expected/$1 (or rewrites it with UPDATE_EXPECTED=1).
matches_expected() {
    local name=$1 got
    got=$(normalize)
    if [ "${UPDATE_EXPECTED:-0}" = 1 ]; then
        printf '%s\n' "$got" > "$EXPECTED/$name"
        echo "   (rewrote expected/$name)"
        return 0
    fi
    OUT=$(diff -u "$EXPECTED/$name" <(printf '%s\n' "$got")) || return 1
}

# INFO field value (raw INFO lines end in \r)
info_field() { cli INFO "$1" | tr -d '\r' | awk -F: -v k="$2" '$1 == k { print $2; exit }'; }

SUFFIX="$$-$RANDOM"
NS="rc-cli-$SUFFIX"
NS2="rc-cli2-$SUFFIX"
L1=""
L2=""

# --- one-shot commands ------------------------------------------------------------------------

check_ping() {
    OUT=$(cli PING) && [ "$OUT" = PONG ] || return 1
    OUT=$(cli ECHO "hello there") && [ "$OUT" = "hello there" ]
}

check_oneshot_resp2_raw() {
    OUT=$(cli NS.CREATE "$NS" DESC "redis-cli suite" META owner cli team "a b") || return 1
    has_line "$OUT" name && [ "$(printf '%s\n' "$OUT" | value_after name)" = "$NS" ] &&
        [ "$(printf '%s\n' "$OUT" | value_after description)" = "redis-cli suite" ] &&
        [ "$(printf '%s\n' "$OUT" | value_after version)" = 1 ] &&
        [ "$(printf '%s\n' "$OUT" | value_after metadata)" = owner ] &&
        [[ "$(printf '%s\n' "$OUT" | value_after created_at)" =~ ^1[0-9]{18}$ ]] || return 1
    OUT=$(cli LEASE.CREATE "$NS" worker-1 120) || return 1
    L1=$(printf '%s\n' "$OUT" | value_after lease_id)
    [[ "$L1" =~ ^ls_[0-9A-Za-z]{28}$ ]] || no "bad lease id: $L1" || return 1
    OUT=$(cli LEASE.CREATE "$NS" worker-2 120 META host "h 2") || return 1
    L2=$(printf '%s\n' "$OUT" | value_after lease_id)
    [[ "$L2" =~ ^ls_[0-9A-Za-z]{28}$ ]] && [ "$L1" != "$L2" ] &&
        [ "$(printf '%s\n' "$OUT" | value_after process_id)" = worker-2 ]
}

check_oneshot_resp2_formatted() {
    OUT=$(cli --no-raw SEM.CREATE "$NS" fmt 2 DESC "formatted") || return 1
    has_line "$OUT" ' 1) "name"' && has_line "$OUT" ' 2) "fmt"' &&
        has_line "$OUT" ' 5) "permits"' && has_line "$OUT" ' 6) (integer) 2' &&
        has_line "$OUT" '22) (empty array)'
}

check_oneshot_resp3_formatted() {
    OUT=$(cli -3 --no-raw SEM.GET "$NS" fmt) || return 1
    # redis-cli right-aligns the "N#" indexes of a map with 11 fields
    has_re "$OUT" '^ 1# "name" => "fmt"$' && has_re "$OUT" '^ 3# "permits" => \(integer\) 2$' &&
        has_re "$OUT" '^ 4# "active_holds" => \(integer\) 0$' &&
        has_re "$OUT" '^ 6# "waiters" => \(integer\) 0$' &&
        has_re "$OUT" '^11# "metadata" => \(empty hash\)$' || return 1
    OUT=$(cli -3 --no-raw HELLO 3) || return 1
    has_re "$OUT" '^ *[0-9]+# "proto" => \(integer\) 3$' && has_re "$OUT" '^ *[0-9]+# "server" => "'
}

check_oneshot_resp3_raw() {
    # raw RESP3 maps: one "key value" pair a line
    OUT=$(cli -3 NS.GET "$NS") || return 1
    has_line "$OUT" "name $NS" && has_line "$OUT" "description redis-cli suite" &&
        has_line "$OUT" "version 1" && grep -Eq '^created_at 1[0-9]{18}$' <<<"$OUT"
}

check_errors() {
    OUT=$(cli --no-raw SEM.GET "$NS" missing) || return 1
    [ "$OUT" = "(error) NOTFOUND semaphore 'missing' not found in namespace '$NS'" ] || return 1
    OUT=$(cli SEM.GET "$NS" missing) || return 1
    [[ "$OUT" == "NOTFOUND "* ]] || return 1
    OUT=$(cli --no-raw SEM.ACQUIRE "$NS" fmt) || return 1
    [ "$OUT" = "(error) ERR wrong number of arguments for 'sem.acquire' command" ] || return 1
    OUT=$(cli --no-raw -3 SEM.ACQUIRE "$NS" fmt "$L1" 3 0) || return 1
    [ "$OUT" = "(error) INVALIDARG weight exceeds semaphore permits" ] || return 1
    OUT=$(cli --no-raw SEM.CREATE "$NS" fmt 2) || return 1
    [[ "$OUT" == "(error) ALREADYEXISTS "* ]] || return 1
    OUT=$(cli --no-raw LEASE.CREATE "$NS" w ten) || return 1
    [ "$OUT" = "(error) ERR value is not an integer or out of range" ] || return 1
    OUT=$(cli --no-raw SELECT 3) || return 1
    [[ "$OUT" == "(error) ERR "* ]] || return 1
    OUT=$(cli -n 0 --no-raw PING) && [ "$OUT" = PONG ]
}

check_x_stdin_arg() {
    # -x: the last argument from stdin, binary-safe (a newline inside the description)
    OUT=$(printf 'line one\nline two' | cli -x --no-raw SEM.UPDATE "$NS" fmt 2 VERSION 1 DESC) || return 1
    has_line "$OUT" ' 4) "line one\nline two"' && has_line "$OUT" ' 6) (integer) 2' &&
        has_line "$OUT" '14) (integer) 2' || return 1
    OUT=$(cli --no-raw SEM.GET "$NS" fmt) && has_line "$OUT" ' 4) "line one\nline two"'
}

check_repeat() {
    OUT=$(cli -r 3 -i 0.05 SEM.GET "$NS" fmt) || return 1
    [ "$(grep -cx fmt <<<"$OUT")" -eq 3 ]
}

# --- scripts through stdin --------------------------------------------------------------------

write_session_script() {
    cat <<SCRIPT
SEM.CREATE $NS pool 3 DESC "two words" META owner cli
SEM.ACQUIRE $NS pool $L1 2 0 META job "first job"
SEM.ACQUIRE $NS pool $L2 2 0
SEM.ACQUIRE $NS pool $L2 2 0.2
SEM.ACQUIRE $NS pool $L2 4 0
sem.acquire $NS pool $L1 1 0
SEM.HOLDERS $NS pool
SEM.RELEASE $NS pool $L1
SEM.ACQUIRE $NS pool $L2 2 0
SEM.RELEASE $NS pool $L1
SEM.HOLDERS $NS pool LIMIT 1
SEM.ACQUIRE $NS pool
NOSUCH.COMMAND x
SEM.GET $NS missing
LEASE.GET $NS ls_0000000000000000000000000000
SEM.CREATE $NS pool2 1
SEM.ACQUIREALL $NS $L1 0 pool2 1 pool 1 META job both
SEM.ACQUIREALL $NS $L1 0.1 pool 1 pool2 1
SEM.ACQUIREALL $NS $L2 0.1 pool2 1 pool 1
SEM.ACQUIREALL $NS $L2 0 pool 1 pool 1
SEM.ACQUIREALL $NS $L2 0 pool 9
SEM.HOLDERS $NS pool2
SEM.DELETE $NS pool2
SEM.DELETE $NS pool
SEM.GET $NS pool
SCRIPT
}

check_script_resp2() {
    cli SEM.DELETE "$NS" pool >/dev/null
    write_session_script > "$WORK/session.txt"
    cli < "$WORK/session.txt" > "$WORK/session-resp2.out" 2>&1 || { OUT=$(cat "$WORK/session-resp2.out"); return 1; }
    matches_expected session-resp2.txt < "$WORK/session-resp2.out"
}

check_script_resp3() {
    cli SEM.DELETE "$NS" pool >/dev/null
    write_session_script > "$WORK/session.txt"
    cli -3 --no-raw < "$WORK/session.txt" > "$WORK/session-resp3.out" 2>&1 || { OUT=$(cat "$WORK/session-resp3.out"); return 1; }
    matches_expected session-resp3.txt < "$WORK/session-resp3.out"
}

check_script_transactions() {
    cli NS.CREATE "$NS2" >/dev/null || return 1
    cat > "$WORK/tx.txt" <<SCRIPT
SEM.CREATE $NS tx 1
MULTI
SEM.ACQUIRE $NS tx $L1 1 0
SEM.ACQUIRE $NS tx $L2 1 10
SEM.GET $NS nope
EXEC
MULTI
SEM.RELEASE $NS tx $L1
SEM.GET $NS2 tx
EXEC
MULTI
SEM.ACQUIREALL $NS $L2 10 tx 1
EXEC
MULTI
SEM.ACQUIRE $NS tx
EXEC
MULTI
MULTI
DISCARD
SEM.HOLDERS $NS tx
SCRIPT
    local t0 t1
    t0=$(date +%s%N)
    cli --no-raw < "$WORK/tx.txt" > "$WORK/tx.out" 2>&1 || { OUT=$(cat "$WORK/tx.out"); return 1; }
    t1=$(date +%s%N)
    # SEM.ACQUIRE ... 10 and SEM.ACQUIREALL ... 10 inside MULTI answer at once (as timeout 0)
    [ $(((t1 - t0) / 1000000)) -lt 5000 ] || no "the transaction waited $(((t1 - t0) / 1000000)) ms" || return 1
    matches_expected transactions.txt < "$WORK/tx.out"
}

# --- COMMAND / INFO ---------------------------------------------------------------------------

check_command_docs() {
    OUT=$(cli COMMAND DOCS sem.acquire) || return 1
    has_line "$OUT" sem.acquire && has_line "$OUT" summary &&
        [ -n "$(printf '%s\n' "$OUT" | value_after summary)" ] && has_line "$OUT" arguments || return 1
    local names
    names=$(printf '%s\n' "$OUT" | values_after name | tr '\n' ' ')
    [[ "$names" == *"namespace semaphore lease weight timeout"* ]] || no "argument names: $names" || return 1
    OUT=$(cli --no-raw COMMAND DOCS sem.acquire) && has "$OUT" '"summary"' && has "$OUT" '"arguments"'
}

check_command_info() {
    OUT=$(cli --no-raw COMMAND INFO sem.acquire) || return 1
    has_re "$OUT" '^1\) +1\) "sem.acquire"$' && has_re "$OUT" '^ +2\) \(integer\) -6$' &&
        has_re "$OUT" '^ +3\) 1\) write$' && has_re "$OUT" '^ +2\) denyoom$' &&
        has_re "$OUT" '^ +3\) blocking$' &&
        has_re "$OUT" '^ +4\) \(integer\) 1$' || return 1
    OUT=$(cli COMMAND GETKEYS SEM.ACQUIRE "$NS" pool "$L1" 1 0) && [ "$OUT" = "$NS" ] || return 1
    OUT=$(cli COMMAND COUNT) && [ "$OUT" -gt 20 ] || return 1
    OUT=$(cli COMMAND LIST) && has_line "$OUT" sem.acquire && has_line "$OUT" lease.refresh
}

check_info() {
    OUT=$(cli INFO | tr -d '\r') || return 1
    has_line "$OUT" '# Server' && grep -q '^redis_version:' <<<"$OUT" &&
        has_line "$OUT" '# Semaphores' && grep -Eq '^namespaces:[0-9]+$' <<<"$OUT" &&
        grep -Eq '^waiters:[0-9]+$' <<<"$OUT" &&
        grep -Eq '^blocked_clients:[0-9]+$' <<<"$OUT" &&
        grep -Eq '^acquire_acquired:[0-9]+$' <<<"$OUT" &&
        has_line "$OUT" 'loading:0' || return 1
    OUT=$(cli --no-raw CONFIG GET save) && has "$OUT" '"save"' || return 1
    OUT=$(cli CONFIG GET port) && [ "$(printf '%s\n' "$OUT" | value_after port)" = "$PORT" ]
}

check_stat_mode() {
    # redis-cli --stat polls INFO (memory, clients, blocked, requests, connections)
    OUT=$(timeout 3 stdbuf -o0 redis-cli -h "$HOST" -p "$PORT" "${AUTH_ARGS[@]}" --no-auth-warning --stat -i 0.5 2>&1)
    grep -q 'keys *mem *clients *blocked *requests *connections' <<<"$OUT" &&
        grep -Eq '^[0-9]+ +[0-9.]+[KMG]? +[0-9]+ +[0-9]+ +[0-9]+ \(\+[0-9]+\) +[0-9]+' <<<"$OUT"
}

# --- blocking -----------------------------------------------------------------------------------

check_parked_acquire() {
    cli SEM.CREATE "$NS" park 1 >/dev/null || return 1
    cli SEM.ACQUIRE "$NS" park "$L1" 1 0 >/dev/null || return 1
    local t0 t1 pid id line
    t0=$(date +%s%N)
    cli SEM.ACQUIRE "$NS" park "$L2" 1 10 > "$WORK/parked.out" 2>&1 &
    pid=$!
    BG_PIDS+=("$pid")
    for _ in $(seq 1 100); do
        line=$(cli CLIENT LIST | grep ' cmd=sem.acquire ' | grep ' flags=b ' | head -n 1)
        [ -n "$line" ] && break
        sleep 0.05
    done
    [ -n "$line" ] || no "no client shows flags=b cmd=sem.acquire" || return 1
    [ "$(info_field clients blocked_clients)" -ge 1 ] || no "blocked_clients is 0" || return 1
    sleep 0.2
    kill -0 "$pid" 2>/dev/null || no "the parked redis-cli returned early: $(cat "$WORK/parked.out")" || return 1
    cli SEM.RELEASE "$NS" park "$L1" >/dev/null || return 1
    wait "$pid" || return 1
    t1=$(date +%s%N)
    OUT=$(cat "$WORK/parked.out")
    [ "$(printf '%s\n' "$OUT" | value_after outcome)" = ACQUIRE_OUTCOME_ACQUIRED ] &&
        [ $(((t1 - t0) / 1000000)) -lt 5000 ] || return 1
    OUT=$(cli SEM.HOLDERS "$NS" park) && [ "$(printf '%s\n' "$OUT" | value_after lease_id)" = "$L2" ]
}

# --- redis-benchmark --------------------------------------------------------------------------

# Runs redis-benchmark --csv with the given arguments; checks it finished with a rps > 0.
bench_ok() {
    local out rps
    out=$(bench --csv "$@" 2>&1) || { OUT="redis-benchmark $*: exit $?
$out"; return 1; }
    rps=$(printf '%s\n' "$out" | awk -F'","' 'NR == 2 { print $2 }')
    OUT="${OUT:+$OUT
}redis-benchmark $*: rps=$rps"
    awk -v r="${rps:-0}" 'BEGIN { exit !(r + 0 > 0) }' || no "$out" || return 1
    echo "   redis-benchmark ${*:1:4}...: ${rps} requests per second"
}

sum_stats() {
    local a u t
    a=$(info_field stats acquire_acquired)
    u=$(info_field stats acquire_unavailable)
    t=$(info_field stats acquire_timed_out)
    echo $((a + u + t))
}

check_bench_reads() {
    cli SEM.CREATE "$NS" bench 4 >/dev/null || return 1
    local before after
    before=$(cli SEM.GET "$NS" bench | value_after last_activity_at)
    bench_ok -c 10 -n 2000 SEM.GET "$NS" bench || return 1
    bench_ok -3 -c 10 -n 2000 SEM.HOLDERS "$NS" bench || return 1
    after=$(cli SEM.GET "$NS" bench | value_after last_activity_at)
    # reads never move last_activity_at
    [ "$before" = "$after" ] || no "last_activity_at moved from $before to $after"
}

check_bench_acquire_refresh() {
    local first token stats0 stats1 holders lease_exp holder_exp
    first=$(cli SEM.ACQUIRE "$NS" bench "$L1" 1 0) || return 1
    token=$(printf '%s\n' "$first" | value_after fencing_token)
    stats0=$(sum_stats)
    bench_ok -c 10 -n 2000 SEM.ACQUIRE "$NS" bench "$L1" 1 0 || return 1
    bench_ok -c 10 -n 2000 -P 16 SEM.ACQUIRE "$NS" bench "$L1" 1 0 || return 1
    bench_ok -c 10 -n 2000 LEASE.REFRESH "$NS" "$L1" 120 || return 1
    stats1=$(sum_stats)
    # every acquire was counted, and re-acquires kept the one hold and its token
    [ $((stats1 - stats0)) -eq 4000 ] || no "acquire counters moved by $((stats1 - stats0)), not 4000" || return 1
    holders=$(cli SEM.HOLDERS "$NS" bench)
    OUT=$holders
    [ "$(printf '%s\n' "$holders" | values_after lease_id | tr '\n' ' ')" = "$L1 " ] &&
        [ "$(printf '%s\n' "$holders" | value_after weight)" = 1 ] &&
        [ "$(printf '%s\n' "$holders" | value_after fencing_token)" = "$token" ] || return 1
    lease_exp=$(cli LEASE.GET "$NS" "$L1" | value_after expires_at)
    holder_exp=$(printf '%s\n' "$holders" | value_after expires_at)
    [ "$lease_exp" = "$holder_exp" ] || no "holder expires_at $holder_exp != lease expires_at $lease_exp" || return 1
    [ "$(cli SEM.GET "$NS" bench | value_after active_holds)" = 1 ]
}

check_bench_contention() {
    # three benchmarks at once on one semaphore of 3 permits: two leases acquiring weight 2,
    # one releasing; afterwards the state must add up
    cli SEM.CREATE "$NS" contended 3 >/dev/null || return 1
    local stats0 stats1 p1 p2 p3 rc=0 sem holders sumw count
    stats0=$(sum_stats)
    bench --csv -c 5 -n 1500 SEM.ACQUIRE "$NS" contended "$L1" 2 0 > "$WORK/b1.csv" 2>&1 &
    p1=$!
    bench --csv -c 5 -n 1500 SEM.ACQUIRE "$NS" contended "$L2" 2 0 > "$WORK/b2.csv" 2>&1 &
    p2=$!
    bench --csv -c 5 -n 1500 SEM.RELEASE "$NS" contended "$L1" > "$WORK/b3.csv" 2>&1 &
    p3=$!
    BG_PIDS+=("$p1" "$p2" "$p3")
    wait "$p1" || rc=1
    wait "$p2" || rc=1
    wait "$p3" || rc=1
    OUT=$(cat "$WORK"/b?.csv)
    [ "$rc" -eq 0 ] || return 1
    for f in "$WORK"/b1.csv "$WORK"/b2.csv "$WORK"/b3.csv; do
        awk -F'","' 'NR == 2 { exit !($2 + 0 > 0) } END { if (NR < 2) exit 1 }' "$f" || no "no rps in $f" || return 1
    done
    stats1=$(sum_stats)
    [ $((stats1 - stats0)) -eq 3000 ] || no "acquire counters moved by $((stats1 - stats0)), not 3000" || return 1
    sem=$(cli SEM.GET "$NS" contended)
    holders=$(cli SEM.HOLDERS "$NS" contended)
    sumw=$(printf '%s\n' "$holders" | values_after weight | awk '{ s += $1 } END { print s + 0 }')
    count=$(printf '%s\n' "$holders" | values_after lease_id | grep -c . || true)
    OUT="$sem
$holders"
    [ "$(printf '%s\n' "$sem" | value_after active_holds)" = "$sumw" ] &&
        [ "$(printf '%s\n' "$sem" | value_after active_holders_count)" = "$count" ] &&
        [ "$sumw" -le 3 ] && [ "$count" -ge 1 ] || return 1
    # and it still works: release both, then all 3 permits are free
    cli SEM.RELEASE "$NS" contended "$L1" >/dev/null && cli SEM.RELEASE "$NS" contended "$L2" >/dev/null &&
        [ "$(cli SEM.GET "$NS" contended | value_after active_holds)" = 0 ] &&
        [ "$(cli SEM.ACQUIRE "$NS" contended "$L1" 3 0 | value_after outcome)" = ACQUIRE_OUTCOME_ACQUIRED ]
}

check_after_benchmarks() {
    OUT=$(cli PING) && [ "$OUT" = PONG ] || return 1
    # the benchmark connections are gone
    local n
    for _ in $(seq 1 50); do
        n=$(info_field clients connected_clients)
        [ "$n" -le 5 ] && return 0
        sleep 0.1
    done
    no "connected_clients is still $n"
}

check "redis-cli PING and ECHO" check_ping
check "one-shot RESP2 raw: NS.CREATE, LEASE.CREATE" check_oneshot_resp2_raw
check "one-shot RESP2 formatted (--no-raw): SEM.CREATE" check_oneshot_resp2_formatted
check "one-shot RESP3 formatted (-3 --no-raw): SEM.GET, HELLO 3" check_oneshot_resp3_formatted
check "one-shot RESP3 raw (-3): NS.GET" check_oneshot_resp3_raw
check "errors shown as (error) CODE ..." check_errors
check "-x: last argument from stdin, binary-safe" check_x_stdin_arg
check "-r 3: repeated command" check_repeat
check "script via stdin (RESP2 raw) matches expected/session-resp2.txt" check_script_resp2
check "script via stdin (-3 --no-raw) matches expected/session-resp3.txt" check_script_resp3
check "MULTI/EXEC via stdin matches expected/transactions.txt" check_script_transactions
check "COMMAND DOCS sem.acquire: summary and arguments" check_command_docs
check "COMMAND INFO / GETKEYS / COUNT / LIST" check_command_info
check "INFO sections and CONFIG GET" check_info
check "redis-cli --stat reads INFO" check_stat_mode
check "a parked SEM.ACQUIRE is woken by SEM.RELEASE from another redis-cli" check_parked_acquire
check "redis-benchmark SEM.GET / -3 SEM.HOLDERS: rps > 0, reads move nothing" check_bench_reads
check "redis-benchmark SEM.ACQUIRE ... 0 (plain, -P 16) and LEASE.REFRESH: rps > 0, state consistent" check_bench_acquire_refresh
check "three redis-benchmarks at once on one semaphore: state adds up" check_bench_contention
check "server healthy after the benchmarks" check_after_benchmarks

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
