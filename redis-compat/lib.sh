# redis-compat/lib.sh: what the suites' run.sh scripts share (sourced, not run).

# Runs a command as root: directly when already root, else through sudo.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        "$@"
    fi
}

# apt_install PKG[=VERSION]...: installs the Debian packages not installed yet (apt-get update
# first, once per run of the calling script). With =VERSION, the installed version (without its
# epoch and Debian revision) must start with VERSION: the suites pin what they were written
# and checked against, and say so when a Debian release brings another version.
APT_UPDATED=""
apt_install() {
    local missing=() spec pkg want have
    for spec in "$@"; do
        pkg=${spec%%=*}
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$pkg")
        fi
    done
    if [ "${#missing[@]}" -ne 0 ]; then
        echo "==> apt-get install ${missing[*]}"
        if [ -z "$APT_UPDATED" ]; then
            as_root apt-get update -q >/dev/null
            APT_UPDATED=1
        fi
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
    fi
    for spec in "$@"; do
        [ "$spec" = "${spec%%=*}" ] && continue
        pkg=${spec%%=*}
        want=${spec#*=}
        have=$(dpkg-query -W -f='${Version}' "$pkg")
        echo "$pkg $have"
        have=${have#*:}
        case "$have" in
        "$want"*) ;;
        *)
            echo "$pkg is $have here; this suite is pinned to $want (update the pin and docs/clients.md)" >&2
            return 1
            ;;
        esac
    done
}

# npm_ci: installs the locked node_modules of the current folder with `npm ci`, again only when
# package-lock.json changed since the last install.
npm_ci() {
    local stamp=node_modules/.package-lock.sha256 want
    want=$(sha256sum package-lock.json | cut -d' ' -f1)
    if [ ! -d node_modules ] || [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
        echo "==> npm ci in $(basename "$(pwd)")"
        npm ci --no-audit --no-fund --loglevel=error
        echo "$want" > "$stamp"
    fi
}

# node_test PORT [FILE...]: installs the locked node_modules of the current folder, then runs
# the test files named (default: every test/*.test.js) with node's test runner against
# 127.0.0.1:PORT, one file at a time (the tests measure waits, and a fresh machine has 2 cores).
node_test() {
    npm_ci
    export PERMITD_HOST=${PERMITD_HOST:-127.0.0.1}
    export PERMITD_PORT=$1
    shift
    if [ "$#" -eq 0 ]; then
        set -- test/*.test.js
    fi
    exec node --test --test-concurrency=1 --test-reporter=spec "$@"
}
