"""redis-py (sync) against permitd with plain execute_command, under RESP2 and RESP3.

Checks what a redis-py user sees: reply shapes (flat arrays vs maps), types, errors as
ResponseError with the server's code word, pipelines with and without MULTI/EXEC, blocking
acquires parked server-side, and socket timeouts around them."""

import os
import re
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError
from redis.retry import Retry

from conftest import as_map, make_client, new_name

LEASE_RE = re.compile(r"^ls_[0-9A-Za-z]{28}$")
SEM_FIELDS = ["name", "description", "permits", "active_holds", "active_holders_count", "waiters", "version",
              "created_at", "updated_at", "last_activity_at", "metadata"]


def lease(r, ns, pid="worker", ttl=30):
    return as_map(r.execute_command("LEASE.CREATE", ns, pid, ttl))["lease_id"]


def test_connect_handshake(r, protocol):
    assert r.ping() is True
    hello = as_map(r.execute_command("HELLO", protocol))
    assert hello["proto"] == protocol
    assert hello["server"] and isinstance(hello["version"], str)
    assert hello["mode"] == "cluster" and hello["role"] == "master"
    info = r.info("server")
    assert "redis_version" in info
    client_info = r.execute_command("CLIENT", "INFO")
    assert f"resp={protocol}" in client_info and "lib-name=redis-py" in client_info


def test_redis_py_8_default_protocol_is_resp3():
    c = make_client(protocol=None)
    try:
        assert "resp=3" in c.execute_command("CLIENT", "INFO")
        assert isinstance(c.execute_command("NS.LIST", "LIMIT", 1), dict)
    finally:
        c.close()


def test_entity_replies_shape(r, protocol, ns):
    raw = r.execute_command("SEM.CREATE", ns, "pool", 3, "DESC", "db pool", "META", "owner", "team-a")
    if protocol == 2:
        assert isinstance(raw, list)
        assert raw[0::2] == SEM_FIELDS  # field order as the spec lists them
    else:
        assert isinstance(raw, dict)
        assert list(raw) == SEM_FIELDS
    sem = as_map(raw)
    assert sem["name"] == "pool" and sem["description"] == "db pool"
    assert sem["permits"] == 3 and sem["active_holds"] == 0 and sem["active_holders_count"] == 0
    assert sem["version"] == 1
    assert isinstance(sem["created_at"], int) and sem["created_at"] > 1_600_000_000 * 10**9
    assert sem["created_at"] == sem["updated_at"] == sem["last_activity_at"]
    assert as_map(sem["metadata"]) == {"owner": "team-a"}

    nsinfo = as_map(r.execute_command("NS.GET", ns))
    assert nsinfo["name"] == ns and nsinfo["description"] == "redis-compat python"
    assert as_map(nsinfo["metadata"]) == {}

    l = as_map(r.execute_command("LEASE.CREATE", ns, "worker-1", 30, "META", "host", "h1"))
    assert LEASE_RE.match(l["lease_id"])
    assert l["process_id"] == "worker-1"
    assert 29 * 10**9 <= l["expires_at"] - l["created_at"] <= 31 * 10**9
    assert as_map(l["metadata"]) == {"host": "h1"}


def test_bytes_replies_without_decode(protocol, ns):
    c = make_client(protocol, decode_responses=False)
    try:
        c.execute_command("SEM.CREATE", ns, "b", 1)
        lid = as_map(c.execute_command("LEASE.CREATE", ns, b"bin\r\n\x00id", 30))
        assert lid[b"process_id"] == b"bin\r\n\x00id"  # binary-safe
        res = as_map(c.execute_command("SEM.ACQUIRE", ns, "b", lid[b"lease_id"], 1, 0, "META", b"k", b"\x00\xff"))
        assert res[b"outcome"] == b"ACQUIRE_OUTCOME_ACQUIRED"
        holders = as_map(c.execute_command("SEM.HOLDERS", ns, "b"))[b"holders"]
        assert as_map(as_map(holders[0])[b"metadata"]) == {b"k": b"\x00\xff"}
    finally:
        c.close()


def test_acquire_outcomes_and_fencing(r, ns):
    r.execute_command("SEM.CREATE", ns, "s", 3)
    a, b = lease(r, ns, "a"), lease(r, ns, "b")

    got = as_map(r.execute_command("SEM.ACQUIRE", ns, "s", a, 2, 0, "META", "job", "1"))
    assert got["outcome"] == "ACQUIRE_OUTCOME_ACQUIRED"
    assert isinstance(got["fencing_token"], int) and got["fencing_token"] > 0
    sem = as_map(got["semaphore"])
    assert sem["active_holds"] == 2 and sem["active_holders_count"] == 1

    # not available now, timeout 0: a reply (not an error) without a fencing token
    un = as_map(r.execute_command("SEM.ACQUIRE", ns, "s", b, 2, 0))
    assert un["outcome"] == "ACQUIRE_OUTCOME_UNAVAILABLE"
    assert "fencing_token" not in un
    assert as_map(un["semaphore"])["active_holds"] == 2

    # a decimal timeout waits that long, then TIMED_OUT
    t0 = time.monotonic()
    to = as_map(r.execute_command("SEM.ACQUIRE", ns, "s", b, 2, 0.3))
    elapsed = time.monotonic() - t0
    assert to["outcome"] == "ACQUIRE_OUTCOME_TIMED_OUT"
    assert 0.28 <= elapsed < 4.0

    # re-acquire keeps the token and replaces weight and metadata
    again = as_map(r.execute_command("SEM.ACQUIRE", ns, "s", a, 1, 0))
    assert again["outcome"] == "ACQUIRE_OUTCOME_ACQUIRED"
    assert again["fencing_token"] == got["fencing_token"]
    assert as_map(again["semaphore"])["active_holds"] == 1

    nxt = as_map(r.execute_command("SEM.ACQUIRE", ns, "s", b, 2, 0))
    assert nxt["outcome"] == "ACQUIRE_OUTCOME_ACQUIRED"
    assert nxt["fencing_token"] > got["fencing_token"]

    page = as_map(r.execute_command("SEM.HOLDERS", ns, "s"))
    holders = [as_map(h) for h in page["holders"]]
    assert [h["lease_id"] for h in holders] == [a, b]  # oldest first
    assert [h["weight"] for h in holders] == [1, 2]
    assert [h["process_id"] for h in holders] == ["a", "b"]
    assert as_map(holders[0]["metadata"]) == {}  # re-acquire without META cleared it
    assert page["next_cursor"] == "" and page["previous_cursor"] == ""

    rel = as_map(r.execute_command("SEM.RELEASE", ns, "s", a))
    assert rel["active_holds"] == 2 and rel["active_holders_count"] == 1


def test_errors_are_response_errors_with_code(r, ns):
    r.execute_command("SEM.CREATE", ns, "s", 2)
    a = lease(r, ns)
    with pytest.raises(ResponseError, match=r"^INVALIDARG weight exceeds semaphore permits$"):
        r.execute_command("SEM.ACQUIRE", ns, "s", a, 3, 5)
    with pytest.raises(ResponseError, match=r"^NOTFOUND"):
        r.execute_command("SEM.ACQUIRE", ns, "s", "ls_" + "x" * 28, 1, 0)
    with pytest.raises(ResponseError, match=r"^NOTFOUND"):
        r.execute_command("SEM.GET", ns, "missing")
    with pytest.raises(ResponseError, match=r"^ALREADYEXISTS"):
        r.execute_command("SEM.CREATE", ns, "s", 2)
    # redis-py strips the generic "ERR " code word from the message, as for Redis itself
    with pytest.raises(ResponseError, match=r"^wrong number of arguments for 'sem.acquire' command$"):
        r.execute_command("SEM.ACQUIRE", ns, "s")
    with pytest.raises(ResponseError, match=r"^value is not an integer or out of range$"):
        r.execute_command("SEM.ACQUIRE", ns, "s", a, "two", 0)
    with pytest.raises(ResponseError, match=r"^timeout is not a float or out of range$"):
        r.execute_command("SEM.ACQUIRE", ns, "s", a, 1, "soon")
    with pytest.raises(ResponseError, match=r"^INVALIDARG"):
        r.execute_command("SEM.ACQUIRE", ns, "s", a, 0, 0)
    # nothing moved
    assert as_map(r.execute_command("SEM.GET", ns, "s"))["active_holds"] == 0


def test_transaction_pipeline_one_namespace(r, ns):
    r.execute_command("SEM.CREATE", ns, "s", 1)
    a, b = lease(r, ns, "a"), lease(r, ns, "b")
    with r.pipeline(transaction=True) as p:
        p.execute_command("SEM.ACQUIRE", ns, "s", a, 1, 0)
        # inside MULTI an acquire never waits: behaves as timeout 0
        p.execute_command("SEM.ACQUIRE", ns, "s", b, 1, 10)
        p.execute_command("SEM.GET", ns, "s")
        t0 = time.monotonic()
        res = p.execute()
    assert time.monotonic() - t0 < 5.0
    assert as_map(res[0])["outcome"] == "ACQUIRE_OUTCOME_ACQUIRED"
    assert as_map(res[1])["outcome"] == "ACQUIRE_OUTCOME_UNAVAILABLE"
    assert as_map(res[2])["active_holds"] == 1

    # an error reply inside EXEC does not abort the others (Redis semantics)
    with r.pipeline(transaction=True) as p:
        p.execute_command("SEM.RELEASE", ns, "s", a)
        p.execute_command("SEM.GET", ns, "nope")
        p.execute_command("SEM.ACQUIRE", ns, "s", b, 1, 0)
        res = p.execute(raise_on_error=False)
    assert as_map(res[0])["active_holds"] == 0
    assert isinstance(res[1], ResponseError) and str(res[1]).startswith("NOTFOUND")
    assert as_map(res[2])["outcome"] == "ACQUIRE_OUTCOME_ACQUIRED"


def test_transaction_pipeline_cross_namespace_runs_nothing(r, ns, admin):
    other = new_name()
    admin.execute_command("NS.CREATE", other)
    try:
        with r.pipeline(transaction=True) as p:
            p.execute_command("SEM.CREATE", ns, "x", 1)
            p.execute_command("SEM.CREATE", other, "y", 1)
            with pytest.raises(ResponseError, match="CROSSSLOT|same slot"):
                p.execute()
        with pytest.raises(ResponseError, match="^NOTFOUND"):
            r.execute_command("SEM.GET", ns, "x")
        with pytest.raises(ResponseError, match="^NOTFOUND"):
            r.execute_command("SEM.GET", other, "y")
    finally:
        admin.execute_command("NS.DELETE", other)


def test_non_transaction_pipeline_keeps_order(r, ns):
    r.execute_command("SEM.CREATE", ns, "s", 2)
    a, b = lease(r, ns, "a"), lease(r, ns, "b")
    with r.pipeline(transaction=False) as p:
        p.execute_command("SEM.ACQUIRE", ns, "s", a, 2, 0)
        # this one parks server-side and holds the commands behind it, as in Redis
        p.execute_command("SEM.ACQUIRE", ns, "s", b, 1, 0.3)
        p.execute_command("SEM.RELEASE", ns, "s", a)
        p.execute_command("SEM.ACQUIRE", ns, "s", b, 1, 0)
        p.execute_command("SEM.HOLDERS", ns, "s")
        p.execute_command("SEM.GET", ns, "missing")
        p.ping()
        t0 = time.monotonic()
        res = p.execute(raise_on_error=False)
    assert time.monotonic() - t0 >= 0.28
    assert [as_map(x)["outcome"] for x in (res[0], res[1], res[3])] == [
        "ACQUIRE_OUTCOME_ACQUIRED", "ACQUIRE_OUTCOME_TIMED_OUT", "ACQUIRE_OUTCOME_ACQUIRED"]
    assert as_map(res[2])["active_holds"] == 0
    assert [as_map(h)["lease_id"] for h in as_map(res[4])["holders"]] == [b]
    assert isinstance(res[5], ResponseError) and str(res[5]).startswith("NOTFOUND")
    assert res[6] is True


def _parked(r, ns, sem, lid, weight, timeout, client=None):
    """Start SEM.ACQUIRE on its own connection in a thread; returns (thread, box, client id)."""
    return _parked_command(["SEM.ACQUIRE", ns, sem, lid, weight, timeout], timeout, client)


def _parked_command(args, timeout, client=None):
    """Start a blocking acquire (`args`) on its own connection in a thread, as _parked does."""
    c = client or make_client(2, socket_timeout=timeout + 10, single_connection_client=True)
    cid = c.client_id()
    box = {}

    def run():
        t0 = time.monotonic()
        try:
            box["reply"] = as_map(c.execute_command(*args))
        except Exception as e:  # noqa: BLE001 - reported to the test
            box["error"] = e
        box["elapsed"] = time.monotonic() - t0
        if client is None:
            c.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box, cid


def _is_blocked(r, cid, cmd="sem.acquire"):
    """CLIENT LIST shows a parked client with flags=b and cmd=sem.acquire, as Redis does."""
    for line in r.execute_command("CLIENT", "LIST").splitlines():
        fields = dict(kv.split("=", 1) for kv in line.split(" ") if "=" in kv)
        if fields.get("id") == str(cid):
            return "b" in fields.get("flags", "") and fields.get("cmd") == cmd
    return False


def _is_connected(r, cid):
    return any(line.startswith(f"id={cid} ") for line in r.execute_command("CLIENT", "LIST").splitlines())


def _wait_for(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_parked_acquire_released_from_another_thread(r, ns):
    r.execute_command("SEM.CREATE", ns, "s", 2)
    a, b = lease(r, ns, "a"), lease(r, ns, "b")
    assert as_map(r.execute_command("SEM.ACQUIRE", ns, "s", a, 2, 0))["outcome"] == "ACQUIRE_OUTCOME_ACQUIRED"
    t, box, cid = _parked(r, ns, "s", b, 1, 10)
    assert _wait_for(lambda: _is_blocked(r, cid))
    # INFO counts it (other suites may park clients on the same server at the same time)
    assert r.info("clients")["blocked_clients"] >= 1
    assert r.info()["waiters"] >= 1
    time.sleep(0.2)
    released_at = time.monotonic()
    r.execute_command("SEM.RELEASE", ns, "s", a)
    t.join(10)
    assert not t.is_alive() and "error" not in box, box
    assert box["reply"]["outcome"] == "ACQUIRE_OUTCOME_ACQUIRED"
    assert isinstance(box["reply"]["fencing_token"], int)
    # woken by the release, not by polling or the timeout
    assert time.monotonic() - released_at < 3.0  # the waiter's timeout is 10 s
    assert 0.2 <= box["elapsed"] < 8
    assert as_map(r.execute_command("SEM.GET", ns, "s"))["active_holds"] == 1


def test_parked_acquireall_is_woken_by_a_release_on_the_last_missing_semaphore(r, ns):
    r.execute_command("SEM.CREATE", ns, "a", 1)
    r.execute_command("SEM.CREATE", ns, "b", 2)
    h, w = lease(r, ns, "holder"), lease(r, ns, "waiter")
    r.execute_command("SEM.ACQUIRE", ns, "a", h, 1, 0)
    r.execute_command("SEM.ACQUIRE", ns, "b", h, 2, 0)
    t, box, cid = _parked_command(["SEM.ACQUIREALL", ns, w, 10, "a", 1, "b", 2, "META", "job", "j1"], 10)
    assert _wait_for(lambda: _is_blocked(r, cid, "sem.acquireall"))
    r.execute_command("SEM.RELEASE", ns, "a", h)
    time.sleep(0.3)
    assert t.is_alive(), box  # b is still taken: nothing yet, and a is not held meanwhile
    assert as_map(r.execute_command("SEM.GET", ns, "a"))["active_holds"] == 0
    released_at = time.monotonic()
    r.execute_command("SEM.RELEASE", ns, "b", h)
    t.join(10)
    assert not t.is_alive() and "error" not in box, box
    assert box["reply"]["outcome"] == "ACQUIRE_OUTCOME_ACQUIRED"
    holds = [as_map(x) for x in box["reply"]["holds"]]
    assert [as_map(x["semaphore"])["name"] for x in holds] == ["a", "b"]
    assert all(isinstance(x["fencing_token"], int) for x in holds)
    # woken by the release, not by polling or the timeout (SEM.ACQUIRE's bound)
    assert time.monotonic() - released_at < 3.0
    for sem, weight in (("a", 1), ("b", 2)):
        holder = as_map(as_map(r.execute_command("SEM.HOLDERS", ns, sem))["holders"][0])
        assert holder["lease_id"] == w and holder["weight"] == weight
        assert as_map(holder["metadata"]) == {"job": "j1"}


def test_parked_waiters_are_served_fifo(r, ns):
    r.execute_command("SEM.CREATE", ns, "s", 2)
    holder = lease(r, ns, "holder")
    r.execute_command("SEM.ACQUIRE", ns, "s", holder, 2, 0)
    heavy, light = lease(r, ns, "heavy"), lease(r, ns, "light")
    t1, box1, cid1 = _parked(r, ns, "s", heavy, 2, 10)
    assert _wait_for(lambda: _is_blocked(r, cid1))
    t2, box2, cid2 = _parked(r, ns, "s", light, 1, 10)
    assert _wait_for(lambda: _is_blocked(r, cid2))
    # a non-blocking acquire does not jump the queue even though a permit would fit later
    probe = lease(r, ns, "probe")
    assert as_map(r.execute_command("SEM.ACQUIRE", ns, "s", probe, 1, 0))["outcome"] == "ACQUIRE_OUTCOME_UNAVAILABLE"
    r.execute_command("SEM.RELEASE", ns, "s", holder)
    t1.join(10)
    assert box1["reply"]["outcome"] == "ACQUIRE_OUTCOME_ACQUIRED"
    time.sleep(0.2)
    assert t2.is_alive()  # light waits behind heavy, which now holds everything
    r.execute_command("SEM.RELEASE", ns, "s", heavy)
    t2.join(10)
    assert box2["reply"]["outcome"] == "ACQUIRE_OUTCOME_ACQUIRED"
    assert box2["reply"]["fencing_token"] > box1["reply"]["fencing_token"]


def test_lease_expiry_wakes_parked_acquire(r, ns):
    r.execute_command("SEM.CREATE", ns, "s", 1)
    short = lease(r, ns, "short", ttl=1)
    r.execute_command("SEM.ACQUIRE", ns, "s", short, 1, 0)
    waiter = lease(r, ns, "waiter")
    t0 = time.monotonic()
    got = as_map(r.execute_command("SEM.ACQUIRE", ns, "s", waiter, 1, 10))
    assert got["outcome"] == "ACQUIRE_OUTCOME_ACQUIRED"
    assert 0.5 <= time.monotonic() - t0 < 6.0
    with pytest.raises(ResponseError, match="^NOTFOUND"):
        r.execute_command("LEASE.REFRESH", ns, short, 10)


def test_client_unblock_timeout_and_error(r, ns):
    r.execute_command("SEM.CREATE", ns, "s", 1)
    a, b = lease(r, ns, "a"), lease(r, ns, "b")
    r.execute_command("SEM.ACQUIRE", ns, "s", a, 1, 0)
    parked = make_client(2, socket_timeout=30, single_connection_client=True)
    try:
        cid = parked.client_id()
        t, box, _ = _parked(r, ns, "s", b, 1, 20, client=parked)
        assert _wait_for(lambda: _is_blocked(r, cid))
        assert r.execute_command("CLIENT", "UNBLOCK", cid, "TIMEOUT") == 1
        t.join(5)
        assert box["reply"]["outcome"] == "ACQUIRE_OUTCOME_TIMED_OUT"

        t, box, _ = _parked(r, ns, "s", b, 1, 20, client=parked)
        assert _wait_for(lambda: _is_blocked(r, cid))
        assert r.execute_command("CLIENT", "UNBLOCK", cid, "ERROR") == 1
        t.join(5)
        assert isinstance(box.get("error"), ResponseError)
        assert str(box["error"]) == "UNBLOCKED client unblocked via CLIENT UNBLOCK"
        assert r.execute_command("CLIENT", "UNBLOCK", cid) == 0  # not blocked any more
    finally:
        parked.close()
    assert [as_map(h)["lease_id"] for h in as_map(r.execute_command("SEM.HOLDERS", ns, "s"))["holders"]] == [a]


def test_socket_timeout_above_server_timeout_gets_the_reply(ns, protocol):
    c = make_client(protocol, socket_timeout=6)
    try:
        c.execute_command("SEM.CREATE", ns, "s", 1)
        a, b = lease(c, ns, "a"), lease(c, ns, "b")
        c.execute_command("SEM.ACQUIRE", ns, "s", a, 1, 0)
        t0 = time.monotonic()
        res = as_map(c.execute_command("SEM.ACQUIRE", ns, "s", b, 1, 1.5))
        assert res["outcome"] == "ACQUIRE_OUTCOME_TIMED_OUT"
        assert 1.45 <= time.monotonic() - t0 < 5.0
        assert c.ping() is True  # the connection is still in step
    finally:
        c.close()


def test_socket_timeout_below_server_timeout_drops_the_waiter(r, ns):
    """The pitfall: a client that gives up first closes its connection; the server drops the
    parked waiter, which is never granted."""
    r.execute_command("SEM.CREATE", ns, "s", 1)
    a, b = lease(r, ns, "a"), lease(r, ns, "b")
    r.execute_command("SEM.ACQUIRE", ns, "s", a, 1, 0)
    impatient = make_client(2, socket_timeout=0.5, retry=Retry(NoBackoff(), 0), single_connection_client=True)
    cid = impatient.client_id()
    try:
        with pytest.raises(redis.exceptions.TimeoutError):
            impatient.execute_command("SEM.ACQUIRE", ns, "s", b, 1, 5)
    finally:
        impatient.close()
    assert _wait_for(lambda: not _is_connected(r, cid))
    r.execute_command("SEM.RELEASE", ns, "s", a)
    time.sleep(0.1)
    holders = as_map(r.execute_command("SEM.HOLDERS", ns, "s"))["holders"]
    assert holders == []
    assert as_map(r.execute_command("SEM.GET", ns, "s"))["active_holds"] == 0


def test_lease_lifecycle(r, ns):
    lid = lease(r, ns, "w", ttl=5)
    before = as_map(r.execute_command("LEASE.GET", ns, lid))
    time.sleep(0.05)
    after = as_map(r.execute_command("LEASE.REFRESH", ns, lid, 20))
    assert after["expires_at"] > before["expires_at"]
    assert 19 * 10**9 < after["expires_at"] - before["created_at"] < 22 * 10**9
    leases = as_map(r.execute_command("LEASE.LIST", ns, "PROCESS", "w"))["leases"]
    assert [as_map(l)["lease_id"] for l in leases] == [lid]
    assert r.execute_command("LEASE.REVOKE", ns, lid) in ("OK", True)
    with pytest.raises(ResponseError, match="^NOTFOUND"):
        r.execute_command("LEASE.REVOKE", ns, lid)
    with pytest.raises(ResponseError, match="^NOTFOUND"):
        r.execute_command("LEASE.REFRESH", ns, lid, 10)


@pytest.mark.skipif(not os.environ.get("PERMITD_PASSWORD"), reason="server has no --requirepass (set PERMITD_PASSWORD)")
@pytest.mark.parametrize("proto", [2, 3])
def test_auth_with_requirepass(proto):
    from conftest import HOST, PORT
    # no retries: redis-py's AuthenticationError is a ConnectionError, which it retries by default
    anonymous = redis.Redis(host=HOST, port=PORT, protocol=proto, decode_responses=True, socket_timeout=10,
                            retry=Retry(NoBackoff(), 0))
    wrong = redis.Redis(host=HOST, port=PORT, protocol=proto, password="not-the-password",
                        decode_responses=True, socket_timeout=10, retry=Retry(NoBackoff(), 0))
    try:
        with pytest.raises((redis.exceptions.AuthenticationError, redis.exceptions.ResponseError), match="NOAUTH|Authentication required|already authenticated"):
            anonymous.execute_command("NS.LIST")
        with pytest.raises((redis.exceptions.AuthenticationError, redis.exceptions.ResponseError), match="WRONGPASS|invalid username-password"):
            wrong.ping()
    finally:
        anonymous.close()
        wrong.close()


def test_sem_waiters_lists_parked_clients_in_fifo_order(r, ns):
    r.execute_command("SEM.CREATE", ns, "s", 1)
    holder = lease(r, ns, "holder")
    r.execute_command("SEM.ACQUIRE", ns, "s", holder, 1, 0)
    first, second = lease(r, ns, "first"), lease(r, ns, "second")
    t1, box1, cid1 = _parked(r, ns, "s", first, 1, 20)
    assert _wait_for(lambda: _is_blocked(r, cid1))
    t2, box2, cid2 = _parked(r, ns, "s", second, 1, 20)
    assert _wait_for(lambda: _is_blocked(r, cid2))
    page = as_map(r.execute_command("SEM.WAITERS", ns, "s"))
    waiters = [as_map(w) for w in page["waiters"]]
    assert [(w["lease_id"], w["process_id"], w["client_id"]) for w in waiters] == \
        [(first, "first", cid1), (second, "second", cid2)]
    assert all(w["deadline"] - w["parked_at"] == 20 * 10**9 and w["weight"] == 1 for w in waiters)
    assert as_map(r.execute_command("SEM.GET", ns, "s"))["waiters"] == 2
    # CLIENT UNBLOCK takes the head out; a release then grants the one left
    assert r.execute_command("CLIENT", "UNBLOCK", cid1) == 1
    t1.join(10)
    left = [as_map(w)["lease_id"] for w in as_map(r.execute_command("SEM.WAITERS", ns, "s"))["waiters"]]
    assert left == [second]
    r.execute_command("SEM.RELEASE", ns, "s", holder)
    t2.join(10)
    assert box2["reply"]["outcome"] == "ACQUIRE_OUTCOME_ACQUIRED"
    assert as_map(r.execute_command("SEM.WAITERS", ns, "s"))["waiters"] == []
    assert as_map(r.execute_command("SEM.GET", ns, "s"))["waiters"] == 0


def test_info_cpu_and_slowlog_options_read_with_redis_py(r):
    cpu = r.info("cpu")
    for key in ("used_cpu_sys", "used_cpu_user", "used_cpu_sys_children", "used_cpu_user_children",
                "used_cpu_sys_main_thread", "used_cpu_user_main_thread"):
        assert isinstance(cpu[key], float), (key, cpu)
    config = r.config_get("slowlog-*")
    assert set(config) == {"slowlog-log-slower-than", "slowlog-max-len"}, config
    assert int(r.config_get("latency-monitor-threshold")["latency-monitor-threshold"]) >= 0
    # redis-py's SLOWLOG GET parser takes the entries as Redis's
    assert isinstance(r.slowlog_get(1), list)
    assert isinstance(r.slowlog_len(), int)
