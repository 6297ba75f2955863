#!/usr/bin/env python3
"""Writes the committed seed corpus of the fuzz targets (fuzz/corpus/<target>/).

Input formats (see fuzz/src/lib.rs):
  request_parser: [flags, chunk seed, bytes...]   flags bit 0: unauthenticated, bits 1-2: limits
  command_parser: [limits, command, words separated by 0xFF]   command 0xFF: the first word names it
  engine:         [limits, operation bytes...]

Deterministic: running it again rewrites the same files. Usage: python3 fuzz/make_seeds.py
"""

import hashlib
import os
import random
import shutil

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, items):
    d = os.path.join(ROOT, target)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for data in items:
        name = "seed-" + hashlib.sha1(data).hexdigest()[:16]
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    print(f"{target}: {len(items)} seeds")


def mb(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else a.encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


LEASE = b"ls_" + b"0123456789abcdefABCDEFghijkl"


def cursor(kind, direction, key):
    """A cursor as the server encodes it (engine/page.rs): hex(payload) + FNV-1a check."""
    payload = kind + direction + key
    h = 0xCBF29CE484222325
    for b in b"permitd-cursor-v1" + payload:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return (payload.hex() + "%016x" % h).encode()


def request_parser_seeds():
    streams = [
        (0, mb("PING")),
        (0, mb("SEM.ACQUIRE", "ns", "s", LEASE, "1", "0.25", "META", "k", "v") + mb("PING")),
        (0, mb("NS.CREATE", "ns") + mb("SEM.CREATE", "ns", "s", "3") + b"PING\r\n"),
        (0, b"PING\r\n\r\nset 'a b' \"c\\x41\\n\"\r\n"),
        (0, b"ECHO \"abc\r\n"),
        (0, b"ECHO 'it\\'s' \"q\\\"x\\ty\"\n"),
        (0, b"*1\r\n+PING\r\n"),
        (0, b"*1\r\n$-5\r\n"),
        (0, b"*1\r\n$1000000000000\r\n"),
        (0, b"*1000000000\r\n"),
        (0, b"*abc\r\n"),
        (0, b"*1\r\n$01\r\n"),
        (0, b"*0\r\n*-1\r\n*1\r\n$4\r\nPING\r\n"),
        (0, b"*3\r\n$3\r\nSET\r\n$1\r\nk"),
        (0, b"*2\r\n$4\r\nECHO\r\n$5\r\nhe\r\nl\r\n"),
        (1, b"*11\r\n"),
        (1, b"*1\r\n$16385\r\n"),
        (1, mb("AUTH", "pw") + mb("PING")),
        (2, mb("ECHO", "0123456789abcdef") + mb("ECHO", "0123456789abcdefg")),
        (2, mb(*["x"] * 9)),
        (4, mb("PING") + mb("")),
        (6, mb("CLIENT", "KILL", "ID") + mb("A", "B", "C", "D")),
        (6, b"*2\r\n$1025\r\n"),
        (0, b"   \t  PING   hello\t\r\n"),
        (0, b"\r\n\n\r\r\n"),
    ]
    out = []
    for i, (flags, s) in enumerate(streams):
        out.append(bytes([flags, i * 17 % 256]) + s)
    return out


def command_parser_seeds():
    L = LEASE.decode()
    hc = cursor(b"h", b"n", (5).to_bytes(8, "big")).decode()
    lc = cursor(b"l", b"p", (3).to_bytes(8, "big")).decode()
    sc = cursor(b"s", b"n", b"s1").decode()
    nc = cursor(b"n", b"p", b"ns9").decode()
    commands = [
        ["NS.CREATE", "ns", "DESC", "hello", "META", "a", "1", "b", "2"],
        ["NS.GET", "ns"],
        ["NS.LIST", "CURSOR", nc, "LIMIT", "10"],
        ["NS.UPDATE", "ns", "VERSION", "1", "DESC", "x", "META", "k", "v"],
        ["NS.DELETE", "ns"],
        ["SEM.CREATE", "ns", "s", "3", "DESC", "d", "META", "k", "v"],
        ["SEM.GET", "ns", "s"],
        ["SEM.LIST", "ns", "LIMIT", "250", "CURSOR", sc],
        ["SEM.UPDATE", "ns", "s", "5", "VERSION", "2", "DESC", "d"],
        ["SEM.UPDATE", "ns", "s", "5", "desc", "d"],
        ["SEM.DELETE", "ns", "s"],
        ["SEM.ACQUIRE", "ns", "s", L, "2", "0.25", "META", "k", "v"],
        ["sem.acquire", "ns", "s", L, "1", "1e2"],
        ["SEM.ACQUIRE", "ns", "s", "ls_short", "1", "-0"],
        ["SEM.ACQUIRE", "ns", "s", L, "0", "inf"],
        ["SEM.RELEASE", "ns", "s", L],
        ["SEM.HOLDERS", "ns", "s", "CURSOR", hc, "LIMIT", "2"],
        ["LEASE.CREATE", "ns", "worker\r\n\x00", "10", "META", "k", "v", "k", "w"],
        ["LEASE.CREATE", "ns", "p", "301"],
        ["LEASE.GET", "ns", L],
        ["LEASE.LIST", "ns", "PROCESS", "p", "CURSOR", lc, "LIMIT", "5"],
        ["LEASE.REFRESH", "ns", L, "30"],
        ["LEASE.REVOKE", "ns", L],
        ["PING", "hi"],
        ["ECHO", "x"],
        ["HELLO", "3", "AUTH", "default", "pw", "SETNAME", "conn"],
        ["HELLO", "4"],
        ["AUTH", "user", "pw"],
        ["SELECT", "0"],
        ["CLIENT", "KILL", "ID", "5", "SKIPME", "no"],
        ["CLIENT", "KILL", "127.0.0.1:5000"],
        ["CLIENT", "UNBLOCK", "3", "ERROR"],
        ["CLIENT", "LIST", "ID", "1", "2"],
        ["CLIENT", "SETNAME", "name"],
        ["CLIENT", "SETINFO", "LIB-NAME", "redis-py"],
        ["CLIENT", "TRACKING", "on"],
        ["CONFIG", "GET", "*max*"],
        ["COMMAND", "GETKEYS", "SEM.ACQUIRE", "ns", "s", L, "1", "0"],
        ["COMMAND", "DOCS", "sem.acquire"],
        ["INFO", "clients", "semaphores"],
        ["SHUTDOWN", "NOSAVE"],
        ["MULTI"],
        ["EXEC"],
        ["nosuchcommand", "a", "b"],
    ]
    out = []
    for i, words in enumerate(commands):
        sel = i % 3 | (0x10 if i % 2 else 0)
        data = b"\xff".join(w.encode("latin-1") for w in words)
        out.append(bytes([sel, 0xFF]) + data)
    # A few through the table index (the command words come from the table).
    for cmd in range(0, 60, 7):
        out.append(bytes([cmd % 3, cmd]) + b"ns\xffs\xff" + LEASE + b"\xff1\xff0")
    return out


def engine_seeds():
    rng = random.Random(20240611)
    out = []
    for i in range(40):
        n = rng.choice([8, 24, 64, 128, 256, 512])
        out.append(bytes([i % 12]) + bytes(rng.randrange(256) for _ in range(n)))
    # Hand-made scenarios. Each step is [op, namespace, operands...]; op % 16:
    #   0 time [jump, advance?]   1-2 lease create [ttl, process]   3 refresh [lease, ttl]
    #   4 revoke [lease]   5-9 acquire [sem, lease, weight, timeout, may_wait, meta]
    #   10 release [sem, lease]   11 update [sem, permits, stale?]   12 create [sem, permits]
    #   13 [sem, <64 delete else paged holders, limit]   14 [<24 ns delete else ns create]
    #   15 cancel [how, waiter]
    # Operand bytes index small tables (see Harness::step / Harness::acquire): weight idx
    # 0->1 3->2 5->3; timeout idx 0->0 7->5 s; jump idx 8->2 s 9->5 s 11->301 s; a lease byte
    # b < 0xC0 picks live lease b % count in creation order. Limits 11: all quotas large.
    lease = [1, 0, 9, 0]
    out.append(bytes(
        [11] + lease * 4 +
        [5, 0, 0, 0, 3, 0, 200, 0] +   # L0 takes 2 of s0 (3 permits)
        [5, 0, 0, 1, 5, 7, 200, 0] +   # L1 wants 3: parks
        [5, 0, 0, 2, 0, 7, 200, 1] +   # L2 wants 1: parks behind L1 though 1 is free
        [5, 0, 0, 3, 0, 0, 200, 0] +   # L3, timeout 0: UNAVAILABLE (no queue jumping)
        [5, 0, 0, 0, 0, 0, 200, 2] +   # L0 re-acquires 1: frees 1, L1 still does not fit
        [10, 0, 0, 0] +                # L0 releases: L1 granted, L2 still waits
        [5, 0, 2, 0, 0, 0, 200, 0] + [5, 0, 2, 1, 0, 0, 200, 0] +
        [5, 0, 2, 2, 0, 0, 200, 0] + [5, 0, 2, 3, 0, 0, 200, 0] +  # four holders of s2
        [13, 0, 2, 200, 0] +           # SEM.HOLDERS s2, LIMIT 1, page by page
        [0, 0, 8, 0] + [0, 0, 9, 0] +  # +2 s, +5 s: L2 times out
        [0, 0, 9, 1] + [5, 0, 1, 0, 0, 0, 200, 0]  # +5 s without advance: leases die
    ))
    out.append(bytes(
        [11] + lease * 5 +
        [5, 0, 1, 0, 0, 0, 200, 0] +   # L0 holds s1 (1 permit)
        [5, 0, 1, 1, 0, 7, 200, 0] +   # L1, L2, L3 park on s1
        [5, 0, 1, 2, 0, 7, 200, 0] +
        [5, 0, 1, 3, 0, 7, 200, 0] +
        [5, 0, 0, 0, 0, 0, 200, 0] +   # L0 holds 1 of s0
        [5, 0, 0, 4, 5, 7, 200, 0] +   # L4 wants 3 of s0: parks
        [15, 0, 0, 0] +                # L1's client goes away
        [15, 0, 2, 0] +                # CLIENT UNBLOCK L2 ERROR
        [11, 0, 0, 1, 200] +           # s0 down to 2 permits: L4 (3) ends INVALIDARG
        [4, 0, 3] +                    # revoke L3: its parked acquire ends NOTFOUND
        [5, 0, 1, 3, 0, 7, 200, 0] +   # L4 (now live lease 3) parks on s1
        [13, 0, 1, 0] +                # SEM.DELETE s1: L4 ends NOTFOUND
        [12, 0, 1, 0] +                # s1 again, 1 permit
        [5, 0, 1, 0, 0, 0, 200, 0] +   # L0 holds it
        [5, 0, 1, 2, 0, 7, 200, 0] +   # another parks
        [15, 0, 1, 0] +                # CLIENT UNBLOCK TIMEOUT
        [5, 0, 1, 2, 0, 7, 200, 0] +   # parks again
        [14, 0, 0] + [14, 0, 200] +    # NS.DELETE: it ends NOTFOUND; NS.CREATE
        [0, 0, 11, 0]
    ))
    return out


if __name__ == "__main__":
    write("request_parser", request_parser_seeds())
    write("command_parser", command_parser_seeds())
    write("engine", engine_seeds())
