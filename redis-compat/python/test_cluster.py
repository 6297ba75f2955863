"""redis-py RedisCluster against permitd: `RedisCluster(host, port)` and nothing else (redis-py 8
speaks RESP3 by default), and the same with `protocol=2`, each running one whole session.

The steps run in order on one session per protocol: create, lease, an acquire parked on a
second client and woken by a release, holders, a pipeline, a transaction with two acquires
whose tokens must differ as Python ints, a transaction across two namespaces, INFO, and every
token below 2^53 last, so that a server handing out larger tokens still gets the rest run."""

import threading
import time

import pytest
from redis.cluster import RedisCluster
from redis.exceptions import CrossSlotTransactionError, ResponseError

from conftest import HOST, PASSWORD, PORT, new_name
from permitd_client import ACQUIRED, UNAVAILABLE, parse_acquire, parse_entity, parse_page

# Below redis-py's default socket_timeout (5 s), which RedisCluster(host, port) keeps.
PARK_TIMEOUT = 3
TWO_53 = 2**53


def cluster(protocol):
    kw = {} if protocol is None else {"protocol": protocol}
    if PASSWORD:
        kw["password"] = PASSWORD
    return RedisCluster(host=HOST, port=PORT, **kw)


def text(value):
    return value.decode() if isinstance(value, bytes) else value


class Session:
    def __init__(self, protocol):
        self.protocol = protocol
        self.main = cluster(protocol)
        self.waiter_client = cluster(protocol)
        self.ns = new_name("pyc")
        self.other = new_name("pyc")
        self.tokens = []

    def call(self, *args):
        return self.main.execute_command(*args)

    def token(self, result, what):
        assert result.outcome == ACQUIRED, f"{what}: {result.outcome}"
        assert isinstance(result.fencing_token, int), f"{what}: {result.fencing_token!r}"
        self.tokens.append((what, result.fencing_token))
        return result.fencing_token

    def close(self):
        for ns in (self.ns, self.other):
            try:
                self.call("NS.DELETE", ns)
            except ResponseError:
                pass
        self.main.close()
        self.waiter_client.close()


@pytest.fixture(scope="class", params=[None, 2], ids=["default-resp3", "protocol2"])
def s(request):
    session = Session(request.param)
    yield session
    session.close()


class TestRedisClusterSession:
    def test_connects_with_the_address_only(self, s):
        info = text(s.main.execute_command("CLIENT", "INFO", target_nodes=RedisCluster.RANDOM))
        assert f"resp={s.protocol or 3} " in info
        assert len(s.main.get_nodes()) == 1

    def test_create(self, s):
        ns = parse_entity(s.call("NS.CREATE", s.ns, "DESC", "redis-compat RedisCluster"))
        assert text(ns["name"]) == s.ns and ns["version"] == 1
        s.call("NS.CREATE", s.other)
        for sem in ("pool", "a", "b"):
            created = parse_entity(s.call("SEM.CREATE", s.ns, sem, 1))
            assert created["permits"] == 1 and created["active_holds"] == 0
        lease = parse_entity(s.call("LEASE.CREATE", s.ns, "holder", 30))
        assert lease["expires_at"] - lease["created_at"] == 30 * 10**9  # Python ints: exact
        s.holder = text(lease["lease_id"])
        s.waiter = text(parse_entity(s.call("LEASE.CREATE", s.ns, "waiter", 30))["lease_id"])

    def test_parked_acquire_woken_by_release_on_another_connection(self, s):
        first = s.token(parse_acquire(s.call("SEM.ACQUIRE", s.ns, "pool", s.holder, 1, 0)), "first acquire")
        box = {}

        def park():
            t0 = time.monotonic()
            try:
                box["reply"] = s.waiter_client.execute_command("SEM.ACQUIRE", s.ns, "pool", s.waiter, 1, PARK_TIMEOUT)
            except Exception as e:  # noqa: BLE001 - reported below
                box["error"] = e
            box["elapsed"] = time.monotonic() - t0

        thread = threading.Thread(target=park, daemon=True)
        thread.start()
        deadline = time.monotonic() + 5
        while not any(" flags=b " in line and " cmd=sem.acquire " in line
                      for line in text(s.call("CLIENT", "LIST")).splitlines()):
            assert time.monotonic() < deadline, "CLIENT LIST never showed the acquire parked"
            time.sleep(0.02)
        time.sleep(0.2)
        released_at = time.monotonic()
        assert text(parse_entity(s.call("SEM.RELEASE", s.ns, "pool", s.holder))["name"]) == "pool"
        thread.join(PARK_TIMEOUT + 5)
        assert "error" not in box, box
        woken = time.monotonic() - released_at
        assert woken < 2, f"woken {woken:.2f} s after the release"
        assert box["elapsed"] >= 0.2
        s.parked_token = s.token(parse_acquire(box["reply"]), "woken acquire")
        assert s.parked_token > first

    def test_holders(self, s):
        page = parse_page(s.call("SEM.HOLDERS", s.ns, "pool"))
        [holder] = page["holders"]
        assert text(holder["lease_id"]) == s.waiter and text(holder["process_id"]) == "waiter"
        assert holder["weight"] == 1 and holder["fencing_token"] == s.parked_token
        assert page["next_cursor"] == ""

    def test_pipeline(self, s):
        with s.main.pipeline() as p:
            p.execute_command("LEASE.REFRESH", s.ns, s.holder, 30)
            p.execute_command("SEM.ACQUIRE", s.ns, "pool", s.holder, 1, 0)
            p.execute_command("SEM.RELEASE", s.ns, "pool", s.waiter)
            p.execute_command("SEM.ACQUIRE", s.ns, "pool", s.holder, 1, 0)
            p.execute_command("SEM.HOLDERS", s.ns, "pool")
            res = p.execute()
        assert text(parse_entity(res[0])["lease_id"]) == s.holder
        assert parse_acquire(res[1]).outcome == UNAVAILABLE
        assert parse_entity(res[2])["active_holds"] == 0
        assert s.token(parse_acquire(res[3]), "pipelined acquire") > s.parked_token
        assert [text(h["lease_id"]) for h in parse_page(res[4])["holders"]] == [s.holder]

    def test_transaction_tokens_differ(self, s):
        with s.main.pipeline(transaction=True) as p:
            p.execute_command("SEM.ACQUIRE", s.ns, "a", s.holder, 1, 0)
            p.execute_command("SEM.ACQUIRE", s.ns, "b", s.holder, 1, 0)
            p.execute_command("SEM.GET", s.ns, "a")
            res = p.execute()
        ta = s.token(parse_acquire(res[0]), "MULTI token a")
        tb = s.token(parse_acquire(res[1]), "MULTI token b")
        assert ta != tb, "two acquires in one MULTI got the same token"
        assert parse_entity(res[2])["active_holds"] == 1

    def test_transaction_across_namespaces_is_refused_by_the_client(self, s):
        # redis-py computes each command's slot from the key positions COMMAND gave it and refuses
        # the transaction itself, before sending anything
        with s.main.pipeline(transaction=True) as p:
            p.execute_command("SEM.CREATE", s.ns, "x", 1)
            p.execute_command("SEM.CREATE", s.other, "y", 1)
            with pytest.raises(CrossSlotTransactionError, match="same slot"):
                p.execute()
        for ns, sem in ((s.ns, "x"), (s.other, "y")):
            with pytest.raises(ResponseError, match="^NOTFOUND"):
                s.call("SEM.GET", ns, sem)

    def test_info(self, s):
        info = s.main.info()
        assert "redis_version" in info and info["namespaces"] >= 2 and "blocked_clients" in info

    def test_every_token_below_2_53(self, s):
        assert len(s.tokens) >= 5
        for what, token in s.tokens:
            assert 0 < token < TWO_53, f"{what}: {token} is not below 2^53"
