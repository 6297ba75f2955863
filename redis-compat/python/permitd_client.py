"""permitd_client: a thin helper for permitd on top of redis-py (sync and asyncio).

Everything here is a wrapper around one server command, plus a lease heartbeat. The server does
the waiting (SEM.ACQUIRE blocks server-side up to `timeout`, FIFO), the expiry, the fencing
tokens and the bookkeeping; this module never queues or polls, and re-sends a command only in
the cases of "Cluster mode" below.

    import redis
    from permitd_client import Lease, Semaphore

    r = redis.Redis(port=6379, decode_responses=True, socket_timeout=60)
    lease = Lease.create(r, "team", "worker-1", ttl=30)
    with lease.heartbeat(on_lost=lambda err: print("lease lost:", err)) as hb:
        with Semaphore(r, "team", "db").hold(lease, weight=2, timeout=10) as token:
            ...  # do the work; pass `token` to the storage as a fencing token
        db, cache = Semaphore(r, "team", "db"), Semaphore(r, "team", "cache")
        with Semaphore.hold_all(lease, [(db, 1), (cache, 2)], timeout=10) as tokens:
            ...  # both held (SEM.ACQUIREALL: all or none); tokens in the order asked
    lease.revoke()

Replies are normalised to dicts whatever the protocol (RESP2 flat arrays or RESP3 maps). Field
names are str; other values are left as redis-py returns them (str with decode_responses=True,
bytes otherwise). Integers (timestamps, fencing tokens) are Python ints, exact at any size.

A blocking SEM.ACQUIRE keeps its connection busy for up to `timeout` seconds, so the client's
socket_timeout must be larger than any acquire timeout: redis-py 8.1 defaults to
socket_timeout=5 s and *retries* a timed-out command (10 times), re-sending the acquire each
time. The helpers refuse such a call with ValueError before sending anything.

Cluster mode (SPEC section 10). MOVED (a follower), CLUSTERDOWN (no leader known) and TRYAGAIN
(a new leader not ready yet) answer a command that did not run; LEADERCHANGED, a lost connection
and a read timeout after sending leave its outcome unknown. On a single node only the last two
can happen (a restart). Lease, Semaphore and Namespace take `retry=`, a RetryPolicy (None: send
once and raise whatever comes, as the client does), and their commands follow these rules:

- Did not run: re-sent after a pause (50 ms, doubling up to 500 ms). An acquire keeps its own
  deadline, its first send plus its timeout: a re-send carries what is left of it (in ms, rounded
  down), and at the deadline the helper gives up, raising the last error. Other commands give up
  `budget` seconds (default 5) after their first send.
- Outcome unknown: re-sent the same way. SEM.ACQUIRE / SEM.ACQUIREALL go again with the same
  lease, weights and META, so a try that was granted answers ACQUIRED with its fencing token; such
  an acquire is settled for up to `budget` seconds past its deadline, re-sent with timeout 0 (a
  "not available now" answer is then reported as TIMED_OUT). If it still gets no answer it raises,
  and the lease may hold the permits: release them or revoke the lease. SEM.RELEASE and
  LEASE.REFRESH are re-sent as they are. NOTFOUND to a re-sent LEASE.REVOKE, SEM.DELETE or
  NS.DELETE means done. ALREADYEXISTS to a re-sent SEM.CREATE / NS.CREATE is checked with a GET:
  the same settings (permits, description, metadata) mean done, others raise the ALREADYEXISTS.
  A re-sent LEASE.CREATE may leave the first try's lease behind: it holds nothing and dies at its
  TTL.
- A heartbeat keeps beating through a failover: those errors are retried until the moment the
  lease is known to be alive until. Only an error reply to the refresh (NOTFOUND: expired or
  revoked), or reaching that moment without a refresh, reports the lease lost.
- MOVED on a plain redis.Redis / redis.asyncio.Redis raises NotLeader, naming the leader: a plain
  client talks to one node and re-sending there cannot help. Use redis.cluster.RedisCluster (or
  redis.asyncio.cluster.RedisCluster) with the nodes' addresses.

What redis-py 8.1 does below the helper. RedisCluster follows MOVED and TRYAGAIN itself, re-sending
the original arguments (at most 16 tries; TRYAGAIN pauses 50 ms from the 8th on), and by default
also re-sends on CLUSTERDOWN (after 0.25 s and a CLUSTER SLOTS refresh) and on a connection error,
10 times. The helpers route their commands to the namespace's node themselves (`target_nodes`),
which turns those last two off, so that such errors reach the rules above and re-sent acquires
carry the time left. A MOVED is still followed with the original timeout: that costs nothing for a
command that did not run, but an acquire parked on a leader that steps down (answered MOVED, SPEC
section 10) waits its whole timeout again on the new leader, up to about twice its timeout in all.
A plain client re-sends on a connection error itself (its `retry`, 10 times by default), with the
original arguments, before the helper sees the error. That is safe for every command here, but a
LEASE.REVOKE or *.CREATE re-sent that way answers NOTFOUND / ALREADYEXISTS that the helper cannot
tell from a first answer, and an acquire re-sent that way waits its whole timeout again: build the
client with `retry=Retry(NoBackoff(), 0)` (redis.retry, redis.backoff) to leave re-sends to the
helper.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Optional, Union

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import AuthenticationError, ClusterError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError, MovedError, RedisClusterException, ResponseError
from redis.exceptions import SlotNotCoveredError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import TryAgainError

__all__ = [
    "ACQUIRED",
    "UNAVAILABLE",
    "TIMED_OUT",
    "PermitdError",
    "NotAcquired",
    "NotAcquiredAll",
    "LeaseLost",
    "NotLeader",
    "RetryPolicy",
    "DEFAULT_RETRY",
    "AcquireResult",
    "AcquireAllResult",
    "Namespace",
    "Lease",
    "Semaphore",
    "Heartbeat",
    "AsyncNamespace",
    "AsyncLease",
    "AsyncSemaphore",
    "AsyncHeartbeat",
    "to_map",
    "parse_entity",
    "parse_page",
    "parse_acquire",
    "parse_acquire_all",
    "is_notfound",
]

ACQUIRED = "ACQUIRE_OUTCOME_ACQUIRED"
UNAVAILABLE = "ACQUIRE_OUTCOME_UNAVAILABLE"
TIMED_OUT = "ACQUIRE_OUTCOME_TIMED_OUT"

_ENTITY_LISTS = ("namespaces", "semaphores", "holders", "leases")


# --- errors -----------------------------------------------------------------------------------


class PermitdError(Exception):
    """Base class of the errors this helper raises itself (server errors stay ResponseError)."""


class NotAcquired(PermitdError):
    """`hold()` did not get its permits: the outcome was UNAVAILABLE or TIMED_OUT."""

    def __init__(self, result: "AcquireResult", ns: str, sem: str, weight: int, timeout: float):
        self.result = result
        self.outcome = result.outcome
        self.semaphore = result.semaphore
        holds = result.semaphore.get("active_holds")
        permits = result.semaphore.get("permits")
        super().__init__(
            f"permits not acquired on {ns}/{sem}: {result.outcome} "
            f"(weight {weight}, timeout {timeout} s; {holds} of {permits} permits held)"
        )


class NotAcquiredAll(NotAcquired):
    """`hold_all()` did not get its permits (UNAVAILABLE or TIMED_OUT): it holds none of them."""

    def __init__(self, result: "AcquireAllResult", ns: str, parts: list, timeout: float):
        self.result = result
        self.outcome = result.outcome
        self.semaphores = [h["semaphore"] for h in result.holds]
        self.semaphore = self.semaphores[0]
        state = ", ".join(
            f"{s.get('name')} {w} of {s.get('permits') - s.get('active_holds')} free"
            for s, (_, w) in zip(self.semaphores, parts)
        )
        PermitdError.__init__(
            self, f"permits not acquired in {ns}: {result.outcome} (timeout {timeout} s; {state})"
        )


class LeaseLost(PermitdError):
    """The lease is gone (expired, revoked, or could not be refreshed before its expiry)."""

    def __init__(self, message: str, cause: Optional[BaseException] = None):
        super().__init__(message)
        self.cause = cause


class NotLeader(PermitdError, ResponseError):
    """MOVED on a plain (single-node) client: the node is a cluster follower. `leader` is the
    "host:port" it named, `cause` the MovedError."""

    def __init__(self, moved: MovedError):
        host, port = moved.node_addr
        self.leader = f"{host}:{port}"
        self.cause = moved
        super().__init__(
            f"this permitd node is not the cluster leader (MOVED {moved}); a plain redis.Redis or "
            f"redis.asyncio.Redis talks to one node and cannot follow it: use "
            f"redis.cluster.RedisCluster (or redis.asyncio.cluster.RedisCluster) with the nodes' "
            f"addresses, or connect to the leader at {self.leader}"
        )


def is_notfound(err: BaseException) -> bool:
    """True for a server `NOTFOUND ...` error reply."""
    return isinstance(err, ResponseError) and str(err).startswith("NOTFOUND")


# --- reply normalisation ---------------------------------------------------------------------


def _s(value: Any) -> Any:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, (bytes, bytearray)) else value


def to_map(reply: Any, decode_keys: bool = True) -> dict:
    """A RESP3 map (dict) or a RESP2 flat array [k, v, k, v, ...] as a dict."""
    key = _s if decode_keys else (lambda k: k)
    if isinstance(reply, Mapping):
        return {key(k): v for k, v in reply.items()}
    if isinstance(reply, (list, tuple)):
        if len(reply) % 2:
            raise ValueError(f"not a map reply (odd length {len(reply)}): {reply!r}")
        return {key(reply[i]): reply[i + 1] for i in range(0, len(reply), 2)}
    raise ValueError(f"not a map reply: {reply!r}")


def parse_entity(reply: Any) -> dict:
    """A namespace / semaphore / lease / holder reply as a dict; `metadata` as a dict too."""
    entity = to_map(reply)
    if "metadata" in entity:
        entity["metadata"] = to_map(entity["metadata"], decode_keys=False)
    return entity


def parse_page(reply: Any) -> dict:
    """A page reply (NS.LIST, SEM.LIST, SEM.HOLDERS, LEASE.LIST) with its items parsed."""
    page = to_map(reply)
    for name in _ENTITY_LISTS:
        if name in page:
            page[name] = [parse_entity(item) for item in page[name]]
    for name in ("next_cursor", "previous_cursor"):
        if name in page:
            page[name] = _s(page[name])
    return page


@dataclass
class AcquireResult:
    """The reply of SEM.ACQUIRE. Truthy when the permits were acquired."""

    outcome: str
    semaphore: dict
    fencing_token: Optional[int] = None
    raw: Any = field(default=None, repr=False)

    @property
    def acquired(self) -> bool:
        return self.outcome == ACQUIRED

    def __bool__(self) -> bool:
        return self.acquired


def parse_acquire(reply: Any) -> AcquireResult:
    m = to_map(reply)
    return AcquireResult(
        outcome=_s(m["outcome"]),
        semaphore=parse_entity(m["semaphore"]),
        fencing_token=m.get("fencing_token"),
        raw=reply,
    )


@dataclass
class AcquireAllResult:
    """The reply of SEM.ACQUIREALL. Truthy when every permit was acquired."""

    outcome: str
    holds: list  # [{"semaphore": dict, "fencing_token": int | None}], in the order asked
    raw: Any = field(default=None, repr=False)

    @property
    def acquired(self) -> bool:
        return self.outcome == ACQUIRED

    @property
    def fencing_tokens(self) -> list:
        return [h["fencing_token"] for h in self.holds]

    def __bool__(self) -> bool:
        return self.acquired


def parse_acquire_all(reply: Any) -> AcquireAllResult:
    m = to_map(reply)
    holds = []
    for h in m["holds"]:
        h = to_map(h)
        holds.append({"semaphore": parse_entity(h["semaphore"]), "fencing_token": h.get("fencing_token")})
    return AcquireAllResult(outcome=_s(m["outcome"]), holds=holds, raw=reply)


# --- shared argument building ----------------------------------------------------------------


def _lease_id(lease: Union["Lease", "AsyncLease", str, bytes]) -> str:
    if isinstance(lease, (Lease, AsyncLease)):
        return lease.id
    return _s(lease)


def _pairs(meta: Optional[Union[Mapping, Iterable]]) -> list:
    if not meta:
        return []
    return list(meta.items() if isinstance(meta, Mapping) else meta)


def _meta_args(meta: Optional[Union[Mapping, Iterable]]) -> list:
    pairs = _pairs(meta)
    if not pairs:
        return []
    args: list = ["META"]
    for k, v in pairs:
        args += [k, v]
    return args


def _socket_timeout(client: Any) -> Optional[float]:
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    return kwargs.get("socket_timeout")


def _check_timeout(client: Any, timeout: float) -> None:
    """Refuse a blocking acquire that the client would cut short (and maybe re-send)."""
    st = _socket_timeout(client)
    if timeout and st is not None and st <= timeout:
        raise ValueError(
            f"acquire timeout {timeout} s is not below the client's socket_timeout {st} s: the "
            f"client would drop the connection (and redis-py may re-send the acquire) before the "
            f"server answers; create the client with socket_timeout > the largest acquire timeout "
            f"(plus a margin), or socket_timeout=None"
        )


# where the timeout is in the arguments of SEM.ACQUIRE and SEM.ACQUIREALL (re-sends replace it)
_ACQUIRE_TIMEOUT_AT = 5
_ACQUIRE_ALL_TIMEOUT_AT = 3


def _acquire_args(ns, sem, lease, weight, timeout, meta) -> list:
    return ["SEM.ACQUIRE", ns, sem, _lease_id(lease), int(weight), timeout] + _meta_args(meta)


def _acquire_all_args(lease, parts, timeout, meta) -> tuple:
    """(client, ns, args) of SEM.ACQUIREALL over `parts`, (Semaphore, weight) pairs of one
    client and namespace."""
    if not parts:
        raise ValueError("acquire_all needs at least one (semaphore, weight)")
    client, ns = parts[0][0].client, parts[0][0].ns
    if any(sem.client is not client or sem.ns != ns for sem, _ in parts):
        raise ValueError("acquire_all: every semaphore must share one client and namespace")
    args: list = ["SEM.ACQUIREALL", ns, _lease_id(lease), timeout]
    for sem, weight in parts:
        args += [sem.name, int(weight)]
    return client, ns, args + _meta_args(meta)


def _release_error(sems: list, lease, body_failed: bool, release: Callable) -> None:
    """Releases `lease`'s hold on each of `sems` (all of them, whatever fails) with
    `release(sem)`; then, unless the body failed, raises what went wrong: LeaseLost when a hold
    was lost before its release (NOTFOUND), else the server's error."""
    first: Optional[BaseException] = None
    for sem in sems:
        try:
            release(sem)
        except ResponseError as err:
            first = first or err
    if first is None or body_failed:
        return
    if is_notfound(first):
        where = ", ".join(f"{sem.ns}/{sem.name}" for sem in sems)
        raise LeaseLost(f"the hold on {where} was lost before release: {first}", first) from first
    raise first


def _timed(result, timeout):
    """An AcquireResult / AcquireAllResult as the caller asked it: an acquire re-sent at its
    deadline carries timeout 0, so an UNAVAILABLE answer there means the wait timed out."""
    if result.outcome == UNAVAILABLE and (_seconds(timeout) or 0) > 0:
        result.outcome = TIMED_OUT
    return result


def _seconds(timeout) -> Optional[float]:
    """An acquire timeout in seconds, or None if the server would refuse it (it says why)."""
    try:
        seconds = float(timeout)
    except (TypeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _create(client, command: list, get: list, permits: Optional[int], description, meta) -> tuple:
    """(args, check) of a *.CREATE: `command` with its DESC and META, and the _Check that settles
    an ALREADYEXISTS after an unknown outcome: `get` answers the same permits, description and
    metadata (compared as the client encodes them)."""
    pairs = _pairs(meta)
    args = command + (["DESC", description] if description is not None else []) + _meta_args(pairs)
    encode = client.get_encoder().encode

    def settings(permits, description, pairs) -> tuple:
        return permits, encode(description), {encode(k): encode(v) for k, v in pairs}

    want = settings(permits, description or "", pairs)

    def same(reply) -> bool:
        found = parse_entity(reply)
        have = None if permits is None else found.get("permits")
        return settings(have, found.get("description", ""), found.get("metadata", {}).items()) == want

    return args, _Check(get, same)


# --- retries (module docstring, "Cluster mode") ----------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How long the helpers retry. `budget`: seconds after its first send that a command other
    than an acquire is retried, and past its deadline that an acquire whose outcome became
    unknown is settled. Pauses between tries grow from `backoff`, doubling, to `max_backoff`."""

    budget: float = 5.0
    backoff: float = 0.05
    max_backoff: float = 0.5

    def pauses(self) -> Iterator[float]:
        pause = self.backoff
        while True:
            yield pause
            pause = min(2 * pause, self.max_backoff)


DEFAULT_RETRY = RetryPolicy()

_NOT_RUN = "did not run"
_UNKNOWN = "outcome unknown"
_LOST = (RedisConnectionError, RedisTimeoutError, OSError)


def _failure(err: BaseException) -> Optional[str]:
    """_NOT_RUN for an error saying the command did not run (TRYAGAIN, CLUSTERDOWN, a MOVED that
    reached us from a cluster client, RedisCluster's "TTL exhausted" after too many of those, no
    node known for the slot), _UNKNOWN when it may have run (LEADERCHANGED, a lost connection, a
    read timeout), None for an answer (any other error reply) and for local errors."""
    if isinstance(err, (TryAgainError, ClusterError, MovedError, SlotNotCoveredError)):
        return _NOT_RUN
    if isinstance(err, ResponseError):
        return _UNKNOWN if str(err).startswith("LEADERCHANGED") else None
    if isinstance(err, (AuthenticationError, MaxConnectionsError)):
        return None
    if isinstance(err, _LOST):
        return _UNKNOWN
    # RedisCluster, refreshing its slot map after a lost connection, reached no node
    if isinstance(err, RedisClusterException) and isinstance(err.__cause__ or err.__context__, _LOST):
        return _UNKNOWN
    return None


def _is_cluster(client: Any) -> bool:
    return isinstance(client, (RedisCluster, AsyncRedisCluster))


def _time_left(deadline: float) -> str:
    """The time left until `deadline` as an acquire timeout: whole milliseconds, rounded down."""
    ms = math.floor(max(0.0, deadline - time.monotonic()) * 1000)
    return f"{ms // 1000}.{ms % 1000:03d}"


class _Pause(NamedTuple):
    """A step of a _plan: wait `seconds` before the next try (`error`: the last try's)."""

    seconds: float
    error: Exception


class _Check(NamedTuple):
    """How a *.CREATE settles an ALREADYEXISTS after an unknown outcome: send `args` (a GET);
    done if `same(reply)`, else the ALREADYEXISTS stands."""

    args: list
    same: Callable[[Any], bool]


def _plan(client, args: list, retry: RetryPolicy, timeout_at: Optional[int] = None,
          until: Optional[float] = None, gone_ok: bool = False, check: Optional[_Check] = None):
    """The retry rules for one command, shared by the sync and asyncio drivers (_call, _acall):
    a generator that yields what to send next (an argument list) or a _Pause, is sent each reply
    or thrown each error, and returns the reply.

    timeout_at: where an acquire's timeout is in `args` (re-sends carry the time left; a
        timeout the server refuses is sent as it is);
    until: the monotonic time to give up at, instead of the policy's (a heartbeat's refresh);
    gone_ok: NOTFOUND after an unknown outcome means done (LEASE.REVOKE, *.DELETE);
    check: settles ALREADYEXISTS after an unknown outcome (*.CREATE)."""
    start = time.monotonic()
    seconds = None if timeout_at is None else _seconds(args[timeout_at])
    deadline = None if seconds is None else start + seconds
    pauses = retry.pauses()
    unknown = False
    refused: Optional[Exception] = None  # the ALREADYEXISTS that `check` is settling
    sending = args
    while True:
        try:
            reply = yield sending
        except Exception as err:  # noqa: BLE001 - sorted below; the rest is raised again
            error = err
        else:
            if refused is None or check.same(reply):
                return reply
            raise refused
        if isinstance(error, MovedError) and not _is_cluster(client):
            raise NotLeader(error) from error
        failure = _failure(error)
        if failure is None:
            if unknown and gone_ok and is_notfound(error):
                return None
            if unknown and check is not None and refused is None and str(error).startswith("ALREADYEXISTS"):
                refused, sending = error, check.args
                continue
            raise error
        unknown = unknown or failure is _UNKNOWN
        if until is not None:
            end = until
        elif deadline is None:
            end = start + retry.budget
        else:
            end = deadline + retry.budget if unknown else deadline
        left = end - time.monotonic()
        if left <= 0:
            raise error
        yield _Pause(min(next(pauses), left), error)
        if deadline is not None:
            sending = args[:timeout_at] + [_time_left(deadline)] + args[timeout_at + 1:]


def _send(client, args: list):
    """One try on a sync client; a cluster client is given the namespace's node (module
    docstring: this keeps RedisCluster's own re-sends on CLUSTERDOWN and lost connections off)."""
    if isinstance(client, RedisCluster):
        return client.execute_command(*args, target_nodes=client.get_node_from_key(args[1]))
    return client.execute_command(*args)


def _call(client, retry: Optional[RetryPolicy], args: list, pause: Callable[[float], Any] = time.sleep,
          **rules):
    """Runs `args` on a sync client under `retry` (None: one send). A true `pause(seconds)`
    stops the retries, raising the last error (a heartbeat's stop). `rules`: see _plan."""
    if retry is None:
        return client.execute_command(*args)
    plan = _plan(client, args, retry, **rules)
    step = next(plan)
    try:
        while True:
            if isinstance(step, _Pause):
                if pause(step.seconds):
                    raise step.error
                step = next(plan)
                continue
            try:
                reply = _send(client, step)
            except Exception as err:  # noqa: BLE001 - the plan decides
                step = plan.throw(err)
            else:
                step = plan.send(reply)
    except StopIteration as done:
        return done.value


async def _asend(client, args: list):
    """_send for asyncio clients (the cluster client first refreshes a slot map it dropped)."""
    if isinstance(client, AsyncRedisCluster):
        node = (await client.initialize()).get_node_from_key(args[1])
        return await client.execute_command(*args, target_nodes=node)
    return await client.execute_command(*args)


async def _acall(client, retry: Optional[RetryPolicy], args: list, **rules):
    """_call for asyncio clients (a heartbeat stops by cancelling its task)."""
    if retry is None:
        return await client.execute_command(*args)
    plan = _plan(client, args, retry, **rules)
    step = next(plan)
    try:
        while True:
            if isinstance(step, _Pause):
                await asyncio.sleep(step.seconds)
                step = next(plan)
                continue
            try:
                reply = await _asend(client, step)
            except Exception as err:  # noqa: BLE001 - the plan decides
                step = plan.throw(err)
            else:
                step = plan.send(reply)
    except StopIteration as done:
        return done.value


def _lost_by(lease, err: Exception) -> Optional[LeaseLost]:
    """What a failed heartbeat refresh means: None to keep beating (a cluster error or a lost
    connection while the lease is known alive), else the LeaseLost to report. Errors that are no
    answer from the server at all are raised again."""
    if isinstance(err, NotLeader) or _failure(err) is not None:
        if time.monotonic() < lease._alive_until:
            return None
        return LeaseLost(f"lease could not be refreshed before it expired: {err}", err)
    if isinstance(err, ResponseError):
        return LeaseLost(f"lease refresh failed: {err}", err)
    raise err


# --- sync ------------------------------------------------------------------------------------


class Namespace:
    """A namespace (NS.CREATE / NS.GET / NS.DELETE). `retry`: see "Cluster mode"."""

    def __init__(self, client: Any, name: str, retry: Optional[RetryPolicy] = DEFAULT_RETRY):
        self.client = client
        self.name = name
        self.retry = retry

    def create(self, description: Optional[str] = None, meta=None) -> dict:
        """NS.CREATE (ALREADYEXISTS if it exists)."""
        args, check = _create(self.client, ["NS.CREATE", self.name], ["NS.GET", self.name], None, description, meta)
        return parse_entity(_call(self.client, self.retry, args, check=check))

    def get(self) -> dict:
        return parse_entity(_call(self.client, self.retry, ["NS.GET", self.name]))

    def delete(self) -> None:
        """NS.DELETE: deletes the namespace and everything in it (also when it did not exist)."""
        _call(self.client, self.retry, ["NS.DELETE", self.name], gone_ok=True)


class Lease:
    """A server-side lease (LEASE.* commands). `id` is the lease id, a capability: keep it secret.
    `retry`: see "Cluster mode"."""

    def __init__(self, client: Any, ns: str, lease_id: str, ttl: int, info: Optional[dict] = None,
                 retry: Optional[RetryPolicy] = DEFAULT_RETRY):
        self.client = client
        self.ns = ns
        self.id = _s(lease_id)
        self.ttl = int(ttl)
        self.info = info or {}
        self.retry = retry
        # Monotonic time before which the lease is known alive: the server set its expiry to
        # (its receipt time + ttl), and we sent the command after `sent`.
        self._alive_until = time.monotonic()

    @classmethod
    def create(cls, client, ns: str, process_id: str, ttl: int, meta=None,
               retry: Optional[RetryPolicy] = DEFAULT_RETRY) -> "Lease":
        """LEASE.CREATE (a re-sent one may leave an orphan lease: see "Cluster mode")."""
        sent = time.monotonic()
        reply = parse_entity(_call(client, retry, ["LEASE.CREATE", ns, process_id, int(ttl)] + _meta_args(meta)))
        lease = cls(client, ns, reply["lease_id"], ttl, reply, retry)
        lease._alive_until = sent + int(ttl)
        return lease

    def refresh(self, ttl: Optional[int] = None) -> dict:
        """LEASE.REFRESH: expires_at = server now + ttl (default: the lease's ttl)."""
        return self._refresh(ttl)

    def _refresh(self, ttl: Optional[int] = None, **rules) -> dict:
        if ttl is not None:
            self.ttl = int(ttl)
        sent = time.monotonic()
        self.info = parse_entity(_call(self.client, self.retry, ["LEASE.REFRESH", self.ns, self.id, self.ttl], **rules))
        self._alive_until = sent + self.ttl
        return self.info

    def get(self) -> dict:
        return parse_entity(_call(self.client, self.retry, ["LEASE.GET", self.ns, self.id]))

    def revoke(self) -> None:
        """LEASE.REVOKE: releases every hold of the lease and deletes it."""
        _call(self.client, self.retry, ["LEASE.REVOKE", self.ns, self.id], gone_ok=True)

    def heartbeat(self, fraction: float = 1 / 3, on_lost: Optional[Callable[[BaseException], Any]] = None,
                  start: bool = True) -> "Heartbeat":
        hb = Heartbeat(self, fraction=fraction, on_lost=on_lost)
        if start:
            hb.start()
        return hb

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"Lease(ns={self.ns!r}, ttl={self.ttl})"  # the id is a capability: not shown


class Heartbeat:
    """Refreshes a lease every `fraction * ttl` seconds on a daemon thread.

    The lease is reported lost (the `lost` flag is set, `error` holds why, `on_lost(error)` is
    called once, from the heartbeat thread, and the thread stops) when LEASE.REFRESH answers
    NOTFOUND (expired or revoked) or any other error reply, or when connection errors or a
    cluster's failover (MOVED, CLUSTERDOWN, TRYAGAIN, LEADERCHANGED: retried meanwhile, see
    "Cluster mode") last past the moment the lease is known to be alive until. Use as a context
    manager or start()/stop().
    """

    def __init__(self, lease: Lease, fraction: float = 1 / 3,
                 on_lost: Optional[Callable[[BaseException], Any]] = None):
        if not 0 < fraction < 1:
            raise ValueError("fraction must be between 0 and 1")
        self.lease = lease
        self.interval = lease.ttl * fraction
        self.on_lost = on_lost
        self.error: Optional[BaseException] = None
        self.refreshes = 0
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"permitd-heartbeat-{lease.ns}", daemon=True)

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        return self._lost.wait(timeout)

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> "Heartbeat":
        if not self._thread.is_alive() and not self._stop.is_set() and self._thread.ident is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _report(self, err: BaseException) -> None:
        self.error = err
        self._lost.set()
        if self.on_lost is not None:
            self.on_lost(err)

    def _run(self) -> None:
        # fixed rate: a slow refresh (e.g. a slow disk under --fsync always) does not push the
        # next one back
        next_at = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            # after a very slow refresh: one at once, then the regular rate (no backlog)
            next_at = max(next_at, time.monotonic()) + self.interval
            try:
                self.lease._refresh(until=self.lease._alive_until, pause=self._stop.wait)
                self.refreshes += 1
            except Exception as err:  # noqa: BLE001 - _lost_by raises what is not ours
                if self._stop.is_set():
                    return
                lost = _lost_by(self.lease, err)
                if lost is not None:
                    self._report(lost)
                    return


class Semaphore:
    """One semaphore of a namespace: SEM.ACQUIRE / SEM.RELEASE / SEM.GET / SEM.HOLDERS, and
    SEM.CREATE / SEM.DELETE. `retry`: see "Cluster mode"."""

    def __init__(self, client: Any, ns: str, name: str, retry: Optional[RetryPolicy] = DEFAULT_RETRY):
        self.client = client
        self.ns = ns
        self.name = name
        self.retry = retry

    def create(self, permits: int, description: Optional[str] = None, meta=None) -> dict:
        """SEM.CREATE (ALREADYEXISTS if it exists)."""
        args, check = _create(self.client, ["SEM.CREATE", self.ns, self.name, int(permits)],
                              ["SEM.GET", self.ns, self.name], int(permits), description, meta)
        return parse_entity(_call(self.client, self.retry, args, check=check))

    def delete(self) -> None:
        """SEM.DELETE (also when the semaphore did not exist)."""
        _call(self.client, self.retry, ["SEM.DELETE", self.ns, self.name], gone_ok=True)

    def acquire(self, lease, weight: int = 1, timeout: float = 0, meta=None) -> AcquireResult:
        """SEM.ACQUIRE: waits server-side up to `timeout` s (0: don't wait). Never raises for
        UNAVAILABLE / TIMED_OUT (check `.acquired`); server errors raise ResponseError."""
        _check_timeout(self.client, timeout)
        args = _acquire_args(self.ns, self.name, lease, weight, timeout, meta)
        return _timed(parse_acquire(_call(self.client, self.retry, args, timeout_at=_ACQUIRE_TIMEOUT_AT)), timeout)

    def release(self, lease) -> dict:
        """SEM.RELEASE: returns the semaphore (unchanged if the lease held nothing here)."""
        return parse_entity(_call(self.client, self.retry, ["SEM.RELEASE", self.ns, self.name, _lease_id(lease)]))

    def get(self) -> dict:
        return parse_entity(_call(self.client, self.retry, ["SEM.GET", self.ns, self.name]))

    def holders(self, limit: Optional[int] = None, cursor: Optional[str] = None) -> dict:
        """One page of SEM.HOLDERS (oldest first): {'holders': [...], 'next_cursor': ...}."""
        args: list = ["SEM.HOLDERS", self.ns, self.name]
        if cursor:
            args += ["CURSOR", cursor]
        if limit is not None:
            args += ["LIMIT", int(limit)]
        return parse_page(_call(self.client, self.retry, args))

    @contextlib.contextmanager
    def hold(self, lease, weight: int = 1, timeout: float = 0, meta=None):
        """`with sem.hold(lease, 2, 5) as token:` acquires (raising NotAcquired if the outcome is
        not ACQUIRED), yields the fencing token, and always releases on exit. If the lease died
        meanwhile, exit raises LeaseLost (unless the body already raised)."""
        result = self.acquire(lease, weight, timeout, meta)
        if not result.acquired:
            raise NotAcquired(result, self.ns, self.name, weight, timeout)
        with _releasing([self], lease):
            yield result.fencing_token

    @staticmethod
    def acquire_all(lease, parts, timeout: float = 0, meta=None) -> AcquireAllResult:
        """SEM.ACQUIREALL over `parts`, (Semaphore, weight) pairs of one client and namespace:
        every weight or none, waiting server-side up to `timeout` s in FIFO order across the
        semaphores. META goes to every hold. Never raises for UNAVAILABLE / TIMED_OUT. Retried
        under the first semaphore's `retry`."""
        client, _, args = _acquire_all_args(lease, parts, timeout, meta)
        _check_timeout(client, timeout)
        reply = _call(client, parts[0][0].retry, args, timeout_at=_ACQUIRE_ALL_TIMEOUT_AT)
        return _timed(parse_acquire_all(reply), timeout)

    @staticmethod
    @contextlib.contextmanager
    def hold_all(lease, parts, timeout: float = 0, meta=None):
        """`with Semaphore.hold_all(lease, [(a, 1), (b, 2)], 5) as tokens:` acquires all of them
        (raising NotAcquiredAll, holding none, if the outcome is not ACQUIRED), yields their
        fencing tokens in the order asked, and releases every one on exit (LeaseLost as hold())."""
        result = Semaphore.acquire_all(lease, parts, timeout, meta)
        if not result.acquired:
            raise NotAcquiredAll(result, parts[0][0].ns, list(parts), timeout)
        with _releasing([sem for sem, _ in parts], lease):
            yield result.fencing_tokens


@contextlib.contextmanager
def _releasing(sems: list, lease):
    """Runs the body, then releases `lease` on each of `sems` (see _release_error)."""
    body_failed = False
    try:
        yield
    except BaseException:
        body_failed = True
        raise
    finally:
        _release_error(sems, lease, body_failed, lambda sem: sem.release(lease))


# --- asyncio ---------------------------------------------------------------------------------


class AsyncNamespace:
    """Namespace for redis.asyncio clients (same methods, awaitable)."""

    def __init__(self, client: Any, name: str, retry: Optional[RetryPolicy] = DEFAULT_RETRY):
        self.client = client
        self.name = name
        self.retry = retry

    async def create(self, description: Optional[str] = None, meta=None) -> dict:
        args, check = _create(self.client, ["NS.CREATE", self.name], ["NS.GET", self.name], None, description, meta)
        return parse_entity(await _acall(self.client, self.retry, args, check=check))

    async def get(self) -> dict:
        return parse_entity(await _acall(self.client, self.retry, ["NS.GET", self.name]))

    async def delete(self) -> None:
        await _acall(self.client, self.retry, ["NS.DELETE", self.name], gone_ok=True)


class AsyncLease:
    """Lease for redis.asyncio clients (same methods, awaitable)."""

    def __init__(self, client: Any, ns: str, lease_id: str, ttl: int, info: Optional[dict] = None,
                 retry: Optional[RetryPolicy] = DEFAULT_RETRY):
        self.client = client
        self.ns = ns
        self.id = _s(lease_id)
        self.ttl = int(ttl)
        self.info = info or {}
        self.retry = retry
        self._alive_until = time.monotonic()

    @classmethod
    async def create(cls, client, ns: str, process_id: str, ttl: int, meta=None,
                     retry: Optional[RetryPolicy] = DEFAULT_RETRY) -> "AsyncLease":
        sent = time.monotonic()
        reply = parse_entity(await _acall(client, retry, ["LEASE.CREATE", ns, process_id, int(ttl)] + _meta_args(meta)))
        lease = cls(client, ns, reply["lease_id"], ttl, reply, retry)
        lease._alive_until = sent + int(ttl)
        return lease

    async def refresh(self, ttl: Optional[int] = None) -> dict:
        return await self._refresh(ttl)

    async def _refresh(self, ttl: Optional[int] = None, **rules) -> dict:
        if ttl is not None:
            self.ttl = int(ttl)
        sent = time.monotonic()
        reply = await _acall(self.client, self.retry, ["LEASE.REFRESH", self.ns, self.id, self.ttl], **rules)
        self.info = parse_entity(reply)
        self._alive_until = sent + self.ttl
        return self.info

    async def get(self) -> dict:
        return parse_entity(await _acall(self.client, self.retry, ["LEASE.GET", self.ns, self.id]))

    async def revoke(self) -> None:
        await _acall(self.client, self.retry, ["LEASE.REVOKE", self.ns, self.id], gone_ok=True)

    def heartbeat(self, fraction: float = 1 / 3, on_lost: Optional[Callable[[BaseException], Any]] = None,
                  start: bool = True) -> "AsyncHeartbeat":
        hb = AsyncHeartbeat(self, fraction=fraction, on_lost=on_lost)
        if start:
            hb.start()
        return hb

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"AsyncLease(ns={self.ns!r}, ttl={self.ttl})"  # the id is a capability: not shown


class AsyncHeartbeat:
    """Refreshes a lease every `fraction * ttl` seconds in an asyncio task. Same loss rules as
    Heartbeat; `on_lost(error)` may be a plain function or a coroutine function.
    Use `async with lease.heartbeat(...)` or start()/await stop()."""

    def __init__(self, lease: AsyncLease, fraction: float = 1 / 3,
                 on_lost: Optional[Callable[[BaseException], Any]] = None):
        if not 0 < fraction < 1:
            raise ValueError("fraction must be between 0 and 1")
        self.lease = lease
        self.interval = lease.ttl * fraction
        self.on_lost = on_lost
        self.error: Optional[BaseException] = None
        self.refreshes = 0
        self._lost = asyncio.Event()
        self._task: Optional[asyncio.Task] = None

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    async def wait_lost(self, timeout: Optional[float] = None) -> bool:
        if self._lost.is_set():
            return True
        try:
            await asyncio.wait_for(self._lost.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    def start(self) -> "AsyncHeartbeat":
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"permitd-heartbeat-{self.lease.ns}")
        return self

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> "AsyncHeartbeat":
        return self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def _report(self, err: BaseException) -> None:
        self.error = err
        self._lost.set()
        if self.on_lost is not None:
            res = self.on_lost(err)
            if asyncio.iscoroutine(res):
                await res

    async def _run(self) -> None:
        next_at = time.monotonic() + self.interval
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at, time.monotonic()) + self.interval
            try:
                await self.lease._refresh(until=self.lease._alive_until)
                self.refreshes += 1
            except Exception as err:  # noqa: BLE001 - _lost_by raises what is not ours
                lost = _lost_by(self.lease, err)
                if lost is not None:
                    await self._report(lost)
                    return


class AsyncSemaphore:
    """Semaphore for redis.asyncio clients (same methods, awaitable; `async with sem.hold(...)`)."""

    def __init__(self, client: Any, ns: str, name: str, retry: Optional[RetryPolicy] = DEFAULT_RETRY):
        self.client = client
        self.ns = ns
        self.name = name
        self.retry = retry

    async def create(self, permits: int, description: Optional[str] = None, meta=None) -> dict:
        args, check = _create(self.client, ["SEM.CREATE", self.ns, self.name, int(permits)],
                              ["SEM.GET", self.ns, self.name], int(permits), description, meta)
        return parse_entity(await _acall(self.client, self.retry, args, check=check))

    async def delete(self) -> None:
        await _acall(self.client, self.retry, ["SEM.DELETE", self.ns, self.name], gone_ok=True)

    async def acquire(self, lease, weight: int = 1, timeout: float = 0, meta=None) -> AcquireResult:
        _check_timeout(self.client, timeout)
        args = _acquire_args(self.ns, self.name, lease, weight, timeout, meta)
        reply = await _acall(self.client, self.retry, args, timeout_at=_ACQUIRE_TIMEOUT_AT)
        return _timed(parse_acquire(reply), timeout)

    async def release(self, lease) -> dict:
        return parse_entity(await _acall(self.client, self.retry, ["SEM.RELEASE", self.ns, self.name, _lease_id(lease)]))

    async def get(self) -> dict:
        return parse_entity(await _acall(self.client, self.retry, ["SEM.GET", self.ns, self.name]))

    async def holders(self, limit: Optional[int] = None, cursor: Optional[str] = None) -> dict:
        args: list = ["SEM.HOLDERS", self.ns, self.name]
        if cursor:
            args += ["CURSOR", cursor]
        if limit is not None:
            args += ["LIMIT", int(limit)]
        return parse_page(await _acall(self.client, self.retry, args))

    @contextlib.asynccontextmanager
    async def hold(self, lease, weight: int = 1, timeout: float = 0, meta=None):
        result = await self.acquire(lease, weight, timeout, meta)
        if not result.acquired:
            raise NotAcquired(result, self.ns, self.name, weight, timeout)
        async with _async_releasing([self], lease):
            yield result.fencing_token

    @staticmethod
    async def acquire_all(lease, parts, timeout: float = 0, meta=None) -> AcquireAllResult:
        """Semaphore.acquire_all for AsyncSemaphore parts."""
        client, _, args = _acquire_all_args(lease, parts, timeout, meta)
        _check_timeout(client, timeout)
        reply = await _acall(client, parts[0][0].retry, args, timeout_at=_ACQUIRE_ALL_TIMEOUT_AT)
        return _timed(parse_acquire_all(reply), timeout)

    @staticmethod
    @contextlib.asynccontextmanager
    async def hold_all(lease, parts, timeout: float = 0, meta=None):
        """`async with AsyncSemaphore.hold_all(lease, [(a, 1), (b, 2)], 5) as tokens:`."""
        result = await AsyncSemaphore.acquire_all(lease, parts, timeout, meta)
        if not result.acquired:
            raise NotAcquiredAll(result, parts[0][0].ns, list(parts), timeout)
        async with _async_releasing([sem for sem, _ in parts], lease):
            yield result.fencing_tokens


@contextlib.asynccontextmanager
async def _async_releasing(sems: list, lease):
    """_releasing for AsyncSemaphore."""
    body_failed = False
    try:
        yield
    except BaseException:
        body_failed = True
        raise
    finally:
        released = {}
        for sem in sems:
            try:
                await sem.release(lease)
            except ResponseError as err:
                released[sem] = err

        def replay(sem):
            if sem in released:
                raise released[sem]

        _release_error(sems, lease, body_failed, replay)
