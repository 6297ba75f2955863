"""The helpers' retry rules for cluster mode (permitd_client's docstring, "Cluster mode").

Nothing real answers MOVED / CLUSTERDOWN / TRYAGAIN / LEADERCHANGED yet, so each test runs a
real redis-py client (sync and asyncio, plain and RedisCluster) over real sockets against
FakeNode: a scripted permitd cluster node on 127.0.0.1 that answers the connection handshake,
CLUSTER SLOTS and COMMAND as permitd does, the SPEC section 10 errors a test scripts, and
replies of the real server's shapes (RESP2 flat arrays, RESP3 maps). It records every namespace
command it receives, so the tests assert what was re-sent. No permitd is needed.

The plain clients are built with redis-py's own retries off (`retry=Retry(NoBackoff(), 0)`, as
the module docstring advises), so that every re-send seen here is the helper's; two tests show
what redis-py re-sends by itself (a default plain client on a lost connection, RedisCluster on
TRYAGAIN and MOVED)."""

import asyncio
import contextlib
import inspect
import socket
import threading
import time
from collections import defaultdict, deque
from typing import Any, NamedTuple

import pytest
import pytest_asyncio
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import ClusterDownError, ResponseError
from redis.retry import Retry

from permitd_client import (ACQUIRED, TIMED_OUT, UNAVAILABLE, AsyncLease, AsyncNamespace, AsyncSemaphore,
                            Lease, LeaseLost, Namespace, NotLeader, RetryPolicy, Semaphore)

pytestmark = pytest.mark.asyncio

NS = "shop"
LEASE_ID = "ls_" + "a" * 28
T0 = 1_796_140_708_974_148_768  # a server timestamp (ns)
POLICY = RetryPolicy(budget=1.0)  # short: the tests that run it out stay within a few seconds

TRYAGAIN = "TRYAGAIN new leader not ready yet"
CLUSTERDOWN = "CLUSTERDOWN no leader"
LEADERCHANGED = "LEADERCHANGED outcome unknown"
LEASE_NOTFOUND = f"NOTFOUND lease not found or expired in namespace '{NS}'"
SEM_EXISTS = f"ALREADYEXISTS semaphore 'db' already exists in namespace '{NS}'"


# --- the fake node ----------------------------------------------------------------------------


class Err(str):
    """An error reply."""


class Simple(str):
    """A simple-string reply (+OK)."""


class Slow(NamedTuple):
    """Answer `then` after `seconds` (an acquire that waited, a slow leader)."""

    seconds: float
    then: Any


DROP = object()  # close the connection instead of answering
OK = Simple("OK")


def encode(value, proto: int) -> bytes:
    """`value` in RESP: dict = a map (RESP3 map, RESP2 flat array, as permitd answers)."""
    if isinstance(value, Err):
        return b"-%s\r\n" % value.encode()
    if isinstance(value, Simple):
        return b"+%s\r\n" % value.encode()
    if isinstance(value, int):
        return b":%d\r\n" % value
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, bytes):
        return b"$%d\r\n%s\r\n" % (len(value), value)
    if isinstance(value, dict):
        items = [x for pair in value.items() for x in pair]
        head = b"%%%d\r\n" % len(value) if proto == 3 else b"*%d\r\n" % len(items)
        return head + b"".join(encode(x, proto) for x in items)
    return b"*%d\r\n" % len(value) + b"".join(encode(x, proto) for x in value)


def read_command(f):
    line = f.readline()
    if not line:
        return None
    assert line.startswith(b"*"), line
    args = []
    for _ in range(int(line[1:])):
        size = int(f.readline()[1:])
        args.append(f.read(size + 2)[:-2].decode())
    return args


def command_entry(name: str, arity: int, write: bool) -> list:
    """A COMMAND entry as permitd gives it (Redis 7's ten fields; the key is the namespace)."""
    key_spec = {"flags": [Simple("RW"), Simple("UPDATE")],
                "begin_search": {"type": "index", "spec": {"index": 1}},
                "find_keys": {"type": "range", "spec": {"lastkey": 0, "keystep": 1, "limit": 0}}}
    flags = [Simple("write"), Simple("denyoom")] if write else [Simple("readonly")]
    return [name, arity, flags, 1, 1, 1, [Simple("@write" if write else "@read"), Simple("@semaphore")],
            [], [key_spec], []]


COMMANDS = [command_entry(*c) for c in (
    ("sem.acquire", -6, True), ("sem.acquireall", -6, True), ("sem.release", 4, True),
    ("sem.get", 3, False), ("sem.create", -4, True), ("sem.delete", 3, True), ("sem.holders", -3, False),
    ("lease.create", -4, True), ("lease.refresh", 4, True), ("lease.get", 3, False),
    ("lease.revoke", 3, True), ("ns.create", -2, True), ("ns.get", 2, False), ("ns.delete", 2, True))]


class FakeNode:
    """A permitd cluster node that says what it is told. `script(command, *actions)` queues the
    answers to that command's next calls; once they are spent, `defaults[command]` answers.
    An action is a reply, Err(...), DROP, or Slow(seconds, action). CLUSTER SLOTS names this
    node as the owner of every slot."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.received = []  # [command, args...] of every namespace command, in order
        self.scripts = defaultdict(deque)
        self.defaults = {}
        self.lock = threading.Lock()
        self.socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    def script(self, command: str, *actions) -> None:
        with self.lock:
            self.scripts[command].extend(actions)

    def left(self, command: str) -> int:
        with self.lock:
            return len(self.scripts[command])

    def sent(self, command: str) -> list:
        with self.lock:
            return [args for args in self.received if args[0] == command]

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            for sock in self.socks:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.socks.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock) -> None:
        proto = 2
        with sock, sock.makefile("rb") as f:
            try:
                while (args := read_command(f)) is not None:
                    name = args[0].upper()
                    if name == "HELLO":
                        proto = int(args[1]) if len(args) > 1 else proto
                        action = {"server": "permitd", "version": "7.0.0", "proto": proto, "id": 1,
                                  "mode": "cluster", "role": "master", "modules": []}
                    elif name in ("CLIENT", "AUTH", "READONLY", "READWRITE"):
                        action = OK
                    elif name == "PING":
                        action = Simple("PONG")
                    elif name == "CLUSTER" and args[1].upper() == "SLOTS":
                        action = [[0, 16383, ["127.0.0.1", self.port, "f" * 40, {}]]]
                    elif name == "COMMAND" and len(args) == 1:
                        action = COMMANDS
                    else:
                        action = self._next(name, args)
                    while isinstance(action, Slow):
                        time.sleep(action.seconds)
                        action = action.then
                    if action is DROP:
                        sock.shutdown(socket.SHUT_RDWR)
                        return
                    sock.sendall(encode(action, proto))
            except OSError:
                return

    def _next(self, name: str, args: list):
        with self.lock:
            self.received.append([name] + args[1:])
            if self.scripts[name]:
                return self.scripts[name].popleft()
        answer = self.defaults.get(name, Err(f"ERR the fake node has no answer for {name}"))
        return answer(args) if callable(answer) else answer


# --- replies in the real server's shapes ------------------------------------------------------


def semaphore(name="db", permits=2, holds=0, description="", meta=None) -> dict:
    return {"name": name, "description": description, "permits": permits, "active_holds": holds,
            "active_holders_count": 1 if holds else 0, "waiters": 0, "version": 1, "created_at": T0,
            "updated_at": T0, "last_activity_at": T0, "metadata": meta or {}}


def acquired(token: int, weight=1) -> dict:
    return {"outcome": ACQUIRED, "semaphore": semaphore(holds=weight), "fencing_token": token}


def not_acquired(outcome: str) -> dict:
    return {"outcome": outcome, "semaphore": semaphore(holds=2)}


def lease_reply(ttl=3) -> dict:
    return {"lease_id": LEASE_ID, "process_id": "worker", "created_at": T0, "expires_at": T0 + ttl * 10**9,
            "metadata": {}}


def moved_to(node: FakeNode) -> Err:
    return Err(f"MOVED {key_slot(NS.encode())} {node.address}")


# --- clients ------------------------------------------------------------------------------------

KINDS = ["redis-resp2", "cluster-resp3", "asyncio-resp3", "asyncio-cluster-resp2"]


def client_for(kind: str, node: FakeNode):
    kw = {"host": "127.0.0.1", "port": node.port, "decode_responses": True, "socket_timeout": 10,
          "protocol": 2 if kind.endswith("resp2") else 3}
    cluster = "cluster" in kind
    if not cluster:
        kw["retry"] = Retry(NoBackoff(), 0)  # redis-py's own re-sends off
    if kind.startswith("asyncio"):
        return AsyncRedisCluster(**kw) if cluster else aioredis.Redis(**kw)
    return RedisCluster(**kw) if cluster else redis.Redis(**kw)


async def close(client) -> None:
    await done(client.aclose() if hasattr(client, "aclose") else client.close())


async def done(value):
    """The value of a helper call, sync (a value) or asyncio (an awaitable)."""
    return await value if inspect.isawaitable(value) else value


class Kit:
    """One client kind against one FakeNode, and the helper classes that go with it."""

    def __init__(self, kind: str, node: FakeNode):
        self.kind = kind
        self.node = node
        self.cluster = "cluster" in kind
        self.aio = kind.startswith("asyncio")
        self.client = client_for(kind, node)

    def sem(self, name="db", retry=POLICY):
        return (AsyncSemaphore if self.aio else Semaphore)(self.client, NS, name, retry)

    def lease(self, ttl=30, retry=POLICY):
        return (AsyncLease if self.aio else Lease)(self.client, NS, LEASE_ID, ttl, retry=retry)

    def namespace(self, retry=POLICY):
        return (AsyncNamespace if self.aio else Namespace)(self.client, NS, retry)


@contextlib.asynccontextmanager
async def running(kind: str):
    node = FakeNode()
    k = Kit(kind, node)
    try:
        yield k
    finally:
        await close(k.client)
        node.close()


@pytest_asyncio.fixture(params=KINDS)
async def kit(request):
    async with running(request.param) as k:
        yield k


@pytest_asyncio.fixture(params=[k for k in KINDS if "cluster" in k])
async def cluster_kit(request):
    async with running(request.param) as k:
        yield k


def timeouts(node: FakeNode) -> list:
    """The timeouts of the SEM.ACQUIREs `node` received, in order."""
    return [float(args[5]) for args in node.sent("SEM.ACQUIRE")]


# --- not executed: MOVED / TRYAGAIN / CLUSTERDOWN -------------------------------------------------


async def test_tryagain_then_success(kit):
    kit.node.script("SEM.ACQUIRE", Slow(0.3, Err(TRYAGAIN)), acquired(11))
    result = await done(kit.sem().acquire(kit.lease(), 1, timeout=5))
    assert result.acquired and result.fencing_token == 11
    first, again = timeouts(kit.node)
    assert first == 5
    if kit.cluster:
        # RedisCluster re-sends a TRYAGAIN itself, at once, with the original arguments
        assert again == 5
    else:
        assert 3 < again <= 4.75, again  # the helper's re-send: what is left of the 5 s


async def test_tryagain_past_rediscluster_own_tries_resends_the_time_left(cluster_kit):
    # RedisCluster tries 16 times, then raises "TTL exhausted"; the helper goes on
    node = cluster_kit.node
    node.script("SEM.ACQUIRE", *[Slow(0.02, Err(TRYAGAIN))] * 16, acquired(12))
    result = await done(cluster_kit.sem().acquire(cluster_kit.lease(), 1, timeout=5))
    assert result.fencing_token == 12
    sent = timeouts(node)
    assert len(sent) == 17 and sent[:16] == [5] * 16
    assert 3 < sent[16] < 5, sent[16]


async def test_clusterdown_a_few_times_then_success(kit):
    kit.node.script("SEM.ACQUIRE", *[Err(CLUSTERDOWN)] * 3, acquired(13))
    t0 = time.monotonic()
    result = await done(kit.sem().acquire(kit.lease(), 2, timeout=4))
    assert result.acquired and result.fencing_token == 13
    assert time.monotonic() - t0 < 3
    sent = timeouts(kit.node)
    assert len(sent) == 4 and sent[0] == 4
    assert all(b <= a for a, b in zip(sent, sent[1:])) and sent[-1] < 4, sent


async def test_the_deadline_spent_on_clusterdown_raises_in_bounded_time(kit):
    kit.node.defaults["SEM.ACQUIRE"] = Err(CLUSTERDOWN)
    t0 = time.monotonic()
    with pytest.raises(ClusterDownError, match="no leader"):
        await done(kit.sem().acquire(kit.lease(), 1, timeout=1))
    elapsed = time.monotonic() - t0
    assert 0.9 <= elapsed < 4, elapsed  # gives up at the deadline: nothing ran, nothing to settle
    sent = timeouts(kit.node)
    assert len(sent) >= 3 and sent[0] == 1
    assert all(b < a for a, b in zip(sent, sent[1:])), sent


async def test_a_command_other_than_an_acquire_gives_up_after_the_budget(kit):
    kit.node.defaults["SEM.GET"] = Err(CLUSTERDOWN)
    t0 = time.monotonic()
    with pytest.raises(ClusterDownError):
        await done(kit.sem().get())
    assert 0.9 <= time.monotonic() - t0 < 4
    assert len(kit.node.sent("SEM.GET")) >= 3


async def test_moved(kit):
    leader = FakeNode()
    try:
        kit.node.script("SEM.ACQUIRE", moved_to(leader))
        leader.script("SEM.ACQUIRE", acquired(14))
        if kit.cluster:
            # RedisCluster follows the MOVED to the leader itself
            result = await done(kit.sem().acquire(kit.lease(), 1, timeout=2))
            assert result.fencing_token == 14 and timeouts(leader) == [2]
        else:
            with pytest.raises(NotLeader, match="RedisCluster") as raised:
                await done(kit.sem().acquire(kit.lease(), 1, timeout=2))
            assert raised.value.leader == leader.address and leader.address in str(raised.value)
            assert isinstance(raised.value, ResponseError)
            assert len(kit.node.sent("SEM.ACQUIRE")) == 1 and leader.sent("SEM.ACQUIRE") == []
    finally:
        leader.close()


async def test_rediscluster_follows_a_parked_acquires_moved_with_the_whole_timeout(cluster_kit):
    # what the module docstring warns about: an acquire parked on a leader that steps down
    leader = FakeNode()
    try:
        cluster_kit.node.script("SEM.ACQUIRE", Slow(0.5, moved_to(leader)))
        leader.script("SEM.ACQUIRE", acquired(15))
        result = await done(cluster_kit.sem().acquire(cluster_kit.lease(), 1, timeout=2))
        assert result.fencing_token == 15
        assert timeouts(leader) == [2]  # the original timeout, not the 1.5 s left
    finally:
        leader.close()


async def test_no_retry_policy_sends_once(kit):
    kit.node.defaults["SEM.ACQUIRE"] = Err(CLUSTERDOWN)
    if kit.cluster:
        kit.node.script("SEM.ACQUIRE", *[Err(CLUSTERDOWN)] * 3, acquired(16))
        # retry=None leaves it all to the client: RedisCluster re-sends (up to 10 times) the
        # original arguments
        result = await done(kit.sem(retry=None).acquire(kit.lease(), 1, timeout=4))
        assert result.fencing_token == 16 and timeouts(kit.node) == [4] * 4
    else:
        with pytest.raises(ClusterDownError):
            await done(kit.sem(retry=None).acquire(kit.lease(), 1, timeout=4))
        assert len(kit.node.sent("SEM.ACQUIRE")) == 1


# --- outcome unknown: LEADERCHANGED / a lost connection -------------------------------------------


async def test_leaderchanged_on_acquire_resends_the_same_lease_weight_and_meta(kit):
    kit.node.script("SEM.ACQUIRE", Err(LEADERCHANGED), acquired(17, weight=2))
    result = await done(kit.sem().acquire(kit.lease(), 2, timeout=3, meta={"job": "42"}))
    assert result.acquired and result.fencing_token == 17
    first, again = kit.node.sent("SEM.ACQUIRE")
    assert first[:5] == again[:5] == ["SEM.ACQUIRE", NS, "db", LEASE_ID, "2"]
    assert first[6:] == again[6:] == ["META", "job", "42"]
    assert float(again[5]) <= 3


async def test_an_unknown_outcome_is_settled_past_the_deadline_with_timeout_0(kit):
    kit.node.script("SEM.ACQUIRE", Slow(0.5, Err(LEADERCHANGED)), not_acquired(UNAVAILABLE))
    result = await done(kit.sem().acquire(kit.lease(), 1, timeout=0.3))
    # the re-send at the deadline asked "now or never": its "not available now" is a timeout
    assert not result.acquired and result.outcome == TIMED_OUT
    assert timeouts(kit.node) == [0.3, 0]


async def test_a_dropped_connection_after_the_acquire_was_sent(kit):
    kit.node.script("SEM.ACQUIRE", Slow(0.3, DROP), acquired(18))
    result = await done(kit.sem().acquire(kit.lease(), 1, timeout=5))
    assert result.acquired and result.fencing_token == 18
    first, again = timeouts(kit.node)
    assert first == 5 and 3 < again <= 4.75, again
    assert kit.node.sent("SEM.ACQUIRE")[0][:5] == kit.node.sent("SEM.ACQUIRE")[1][:5]


async def test_a_default_plain_client_re_sends_on_a_dropped_connection_itself():
    # redis-py's own retry (10 re-sends by default) acts before the helper sees anything: the
    # re-send is safe (same lease and weight: the same token), but carries the whole timeout
    node = FakeNode()
    client = redis.Redis(host="127.0.0.1", port=node.port, decode_responses=True, socket_timeout=10)
    try:
        node.script("SEM.ACQUIRE", Slow(0.3, DROP), acquired(19))
        assert Semaphore(client, NS, "db").acquire(LEASE_ID, 1, timeout=5).fencing_token == 19
        assert timeouts(node) == [5, 5]
    finally:
        client.close()
        node.close()


async def test_acquire_all_resends_the_same_weights_with_the_time_left(kit):
    kit.node.script("SEM.ACQUIREALL", Err(LEADERCHANGED), Slow(0.3, Err(CLUSTERDOWN)),
                    {"outcome": ACQUIRED, "holds": [{"semaphore": semaphore("a"), "fencing_token": 20},
                                                    {"semaphore": semaphore("b"), "fencing_token": 21}]})
    sems = [(kit.sem("a"), 1), (kit.sem("b"), 2)]
    result = await done((AsyncSemaphore if kit.aio else Semaphore).acquire_all(kit.lease(), sems, timeout=5))
    assert result.acquired and result.fencing_tokens == [20, 21]
    sent = kit.node.sent("SEM.ACQUIREALL")
    assert len(sent) == 3 and all(args[4:] == ["a", "1", "b", "2"] for args in sent)
    first, _, last = (float(args[3]) for args in sent)
    assert first == 5 and last <= 4.75


async def test_leaderchanged_on_revoke_then_notfound_is_done(kit):
    kit.node.script("LEASE.REVOKE", Err(LEADERCHANGED), Err(LEASE_NOTFOUND))
    assert await done(kit.lease().revoke()) is None
    assert len(kit.node.sent("LEASE.REVOKE")) == 2


async def test_notfound_on_a_first_revoke_still_raises(kit):
    # after MOVED / TRYAGAIN / CLUSTERDOWN nothing had run: NOTFOUND is the answer
    kit.node.script("LEASE.REVOKE", Err(CLUSTERDOWN), Err(LEASE_NOTFOUND))
    with pytest.raises(ResponseError, match="^NOTFOUND"):
        await done(kit.lease().revoke())


async def test_alreadyexists_after_leaderchanged_on_create_with_the_same_settings_is_done(kit):
    meta = {"owner": "ops"}
    kit.node.script("SEM.CREATE", Err(LEADERCHANGED), Err(SEM_EXISTS))
    kit.node.defaults["SEM.GET"] = semaphore(permits=3, description="checkout", meta=meta)
    created = await done(kit.sem().create(3, description="checkout", meta=meta))
    assert created["permits"] == 3 and created["metadata"] == meta
    assert kit.node.sent("SEM.CREATE")[0] == ["SEM.CREATE", NS, "db", "3", "DESC", "checkout", "META", "owner", "ops"]
    assert len(kit.node.sent("SEM.GET")) == 1


async def test_alreadyexists_after_leaderchanged_on_create_with_other_settings_raises(kit):
    kit.node.script("SEM.CREATE", Err(LEADERCHANGED), Err(SEM_EXISTS))
    kit.node.defaults["SEM.GET"] = semaphore(permits=2)
    with pytest.raises(ResponseError, match="^ALREADYEXISTS"):
        await done(kit.sem().create(3))
    assert len(kit.node.sent("SEM.GET")) == 1


async def test_alreadyexists_on_a_first_create_raises_without_a_get(kit):
    kit.node.script("NS.CREATE", Err(f"ALREADYEXISTS namespace '{NS}' already exists"))
    with pytest.raises(ResponseError, match="^ALREADYEXISTS"):
        await done(kit.namespace().create())
    assert kit.node.sent("NS.GET") == []


async def test_namespace_create_after_a_dropped_connection_checks_with_a_get(kit):
    kit.node.script("NS.CREATE", DROP, Err(f"ALREADYEXISTS namespace '{NS}' already exists"))
    kit.node.defaults["NS.GET"] = {"name": NS, "description": "", "metadata": {}, "version": 1,
                                   "created_at": T0, "updated_at": T0}
    assert (await done(kit.namespace().create()))["name"] == NS


# --- heartbeats ---------------------------------------------------------------------------------


async def test_the_heartbeat_beats_through_clusterdown_and_a_dropped_connection(kit):
    node = kit.node
    node.defaults["LEASE.REFRESH"] = lease_reply()
    # the first refresh works (the lease is known alive for 3 s), then a failover
    node.script("LEASE.REFRESH", lease_reply(), Err(CLUSTERDOWN), Err(CLUSTERDOWN), DROP, Err(TRYAGAIN))
    lost = []
    hb = kit.lease(ttl=3).heartbeat(fraction=0.2, on_lost=lost.append)
    try:
        deadline = time.monotonic() + 5
        while (node.left("LEASE.REFRESH") or hb.refreshes < 2) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert node.left("LEASE.REFRESH") == 0 and hb.refreshes >= 2
        assert not hb.lost and hb.error is None and lost == []
    finally:
        await done(hb.stop())


async def test_the_heartbeat_reports_notfound_at_once(kit):
    kit.node.script("LEASE.REFRESH", Err(LEASE_NOTFOUND))
    hb = kit.lease(ttl=30).heartbeat(fraction=0.01)
    try:
        assert await done(hb.wait_lost(3))
        assert isinstance(hb.error, LeaseLost) and "NOTFOUND" in str(hb.error)
        assert len(kit.node.sent("LEASE.REFRESH")) == 1
    finally:
        await done(hb.stop())


async def test_the_heartbeat_reports_a_lease_it_could_not_refresh_in_time(kit):
    kit.node.script("LEASE.REFRESH", lease_reply(ttl=1))
    kit.node.defaults["LEASE.REFRESH"] = Err(CLUSTERDOWN)
    t0 = time.monotonic()
    hb = kit.lease(ttl=1).heartbeat(fraction=0.5)
    try:
        assert await done(hb.wait_lost(4))
        assert "before it expired" in str(hb.error) and isinstance(hb.error.cause, ClusterDownError)
        # known alive until about 1.5 s (the refresh at 0.5 s, ttl 1 s)
        assert 1.3 <= time.monotonic() - t0 < 4
        assert len(kit.node.sent("LEASE.REFRESH")) >= 3
    finally:
        await done(hb.stop())
