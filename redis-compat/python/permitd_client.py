"""permitd_client: a thin helper for permitd on top of redis-py (sync and asyncio).

Everything here is a wrapper around one server command, plus a lease heartbeat. The server does
the waiting (SEM.ACQUIRE blocks server-side up to `timeout`, FIFO), the expiry, the fencing
tokens and the bookkeeping; this module never queues, polls or retries an acquire.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Union

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = [
    "ACQUIRED",
    "UNAVAILABLE",
    "TIMED_OUT",
    "PermitdError",
    "NotAcquired",
    "NotAcquiredAll",
    "LeaseLost",
    "AcquireResult",
    "AcquireAllResult",
    "Lease",
    "Semaphore",
    "Heartbeat",
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


def _meta_args(meta: Optional[Union[Mapping, Iterable]]) -> list:
    if not meta:
        return []
    pairs = meta.items() if isinstance(meta, Mapping) else meta
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


# --- sync ------------------------------------------------------------------------------------


class Lease:
    """A server-side lease (LEASE.* commands). `id` is the lease id, a capability: keep it secret."""

    def __init__(self, client: Any, ns: str, lease_id: str, ttl: int, info: Optional[dict] = None):
        self.client = client
        self.ns = ns
        self.id = _s(lease_id)
        self.ttl = int(ttl)
        self.info = info or {}
        # Monotonic time before which the lease is known alive: the server set its expiry to
        # (its receipt time + ttl), and we sent the command after `sent`.
        self._alive_until = time.monotonic()

    @classmethod
    def create(cls, client, ns: str, process_id: str, ttl: int, meta=None) -> "Lease":
        sent = time.monotonic()
        reply = parse_entity(client.execute_command("LEASE.CREATE", ns, process_id, int(ttl), *_meta_args(meta)))
        lease = cls(client, ns, reply["lease_id"], ttl, reply)
        lease._alive_until = sent + int(ttl)
        return lease

    def refresh(self, ttl: Optional[int] = None) -> dict:
        """LEASE.REFRESH: expires_at = server now + ttl (default: the lease's ttl)."""
        if ttl is not None:
            self.ttl = int(ttl)
        sent = time.monotonic()
        self.info = parse_entity(self.client.execute_command("LEASE.REFRESH", self.ns, self.id, self.ttl))
        self._alive_until = sent + self.ttl
        return self.info

    def get(self) -> dict:
        return parse_entity(self.client.execute_command("LEASE.GET", self.ns, self.id))

    def revoke(self) -> None:
        """LEASE.REVOKE: releases every hold of the lease and deletes it."""
        self.client.execute_command("LEASE.REVOKE", self.ns, self.id)

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
    NOTFOUND (expired or revoked) or any other error reply, or when connection errors last past
    the moment the lease is known to be alive until. Use as a context manager or start()/stop().
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
                self.lease.refresh()
                self.refreshes += 1
            except ResponseError as err:
                self._report(LeaseLost(f"lease refresh failed: {err}", err))
                return
            except (RedisConnectionError, RedisTimeoutError, OSError) as err:
                if time.monotonic() >= self.lease._alive_until:
                    self._report(LeaseLost(f"lease could not be refreshed before it expired: {err}", err))
                    return


class Semaphore:
    """One semaphore of a namespace: SEM.ACQUIRE / SEM.RELEASE / SEM.GET / SEM.HOLDERS."""

    def __init__(self, client: Any, ns: str, name: str):
        self.client = client
        self.ns = ns
        self.name = name

    def acquire(self, lease, weight: int = 1, timeout: float = 0, meta=None) -> AcquireResult:
        """SEM.ACQUIRE: waits server-side up to `timeout` s (0: don't wait). Never raises for
        UNAVAILABLE / TIMED_OUT (check `.acquired`); server errors raise ResponseError."""
        _check_timeout(self.client, timeout)
        return parse_acquire(self.client.execute_command(*_acquire_args(self.ns, self.name, lease, weight, timeout, meta)))

    def release(self, lease) -> dict:
        """SEM.RELEASE: returns the semaphore (unchanged if the lease held nothing here)."""
        return parse_entity(self.client.execute_command("SEM.RELEASE", self.ns, self.name, _lease_id(lease)))

    def get(self) -> dict:
        return parse_entity(self.client.execute_command("SEM.GET", self.ns, self.name))

    def holders(self, limit: Optional[int] = None, cursor: Optional[str] = None) -> dict:
        """One page of SEM.HOLDERS (oldest first): {'holders': [...], 'next_cursor': ...}."""
        args: list = ["SEM.HOLDERS", self.ns, self.name]
        if cursor:
            args += ["CURSOR", cursor]
        if limit is not None:
            args += ["LIMIT", int(limit)]
        return parse_page(self.client.execute_command(*args))

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
        semaphores. META goes to every hold. Never raises for UNAVAILABLE / TIMED_OUT."""
        client, _, args = _acquire_all_args(lease, parts, timeout, meta)
        _check_timeout(client, timeout)
        return parse_acquire_all(client.execute_command(*args))

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


class AsyncLease:
    """Lease for redis.asyncio clients (same methods, awaitable)."""

    def __init__(self, client: Any, ns: str, lease_id: str, ttl: int, info: Optional[dict] = None):
        self.client = client
        self.ns = ns
        self.id = _s(lease_id)
        self.ttl = int(ttl)
        self.info = info or {}
        self._alive_until = time.monotonic()

    @classmethod
    async def create(cls, client, ns: str, process_id: str, ttl: int, meta=None) -> "AsyncLease":
        sent = time.monotonic()
        reply = parse_entity(await client.execute_command("LEASE.CREATE", ns, process_id, int(ttl), *_meta_args(meta)))
        lease = cls(client, ns, reply["lease_id"], ttl, reply)
        lease._alive_until = sent + int(ttl)
        return lease

    async def refresh(self, ttl: Optional[int] = None) -> dict:
        if ttl is not None:
            self.ttl = int(ttl)
        sent = time.monotonic()
        self.info = parse_entity(await self.client.execute_command("LEASE.REFRESH", self.ns, self.id, self.ttl))
        self._alive_until = sent + self.ttl
        return self.info

    async def get(self) -> dict:
        return parse_entity(await self.client.execute_command("LEASE.GET", self.ns, self.id))

    async def revoke(self) -> None:
        await self.client.execute_command("LEASE.REVOKE", self.ns, self.id)

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
                await self.lease.refresh()
                self.refreshes += 1
            except ResponseError as err:
                await self._report(LeaseLost(f"lease refresh failed: {err}", err))
                return
            except (RedisConnectionError, RedisTimeoutError, OSError) as err:
                if time.monotonic() >= self.lease._alive_until:
                    await self._report(LeaseLost(f"lease could not be refreshed before it expired: {err}", err))
                    return


class AsyncSemaphore:
    """Semaphore for redis.asyncio clients (same methods, awaitable; `async with sem.hold(...)`)."""

    def __init__(self, client: Any, ns: str, name: str):
        self.client = client
        self.ns = ns
        self.name = name

    async def acquire(self, lease, weight: int = 1, timeout: float = 0, meta=None) -> AcquireResult:
        _check_timeout(self.client, timeout)
        return parse_acquire(await self.client.execute_command(*_acquire_args(self.ns, self.name, lease, weight, timeout, meta)))

    async def release(self, lease) -> dict:
        return parse_entity(await self.client.execute_command("SEM.RELEASE", self.ns, self.name, _lease_id(lease)))

    async def get(self) -> dict:
        return parse_entity(await self.client.execute_command("SEM.GET", self.ns, self.name))

    async def holders(self, limit: Optional[int] = None, cursor: Optional[str] = None) -> dict:
        args: list = ["SEM.HOLDERS", self.ns, self.name]
        if cursor:
            args += ["CURSOR", cursor]
        if limit is not None:
            args += ["LIMIT", int(limit)]
        return parse_page(await self.client.execute_command(*args))

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
        return parse_acquire_all(await client.execute_command(*args))

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
