"""redis.asyncio against permitd: raw commands, pipelines, parked acquires woken by another task,
and the async helpers (async with hold, AsyncHeartbeat), under RESP2 and RESP3."""

import asyncio
import time

import pytest
import pytest_asyncio
from redis.exceptions import ResponseError

from conftest import as_map, make_async_client, new_name
from permitd_client import (ACQUIRED, TIMED_OUT, AsyncLease, AsyncSemaphore, LeaseLost,
                            NotAcquired, NotAcquiredAll)


@pytest_asyncio.fixture
async def ar(protocol):
    c = make_async_client(protocol)
    yield c
    await c.aclose()


@pytest_asyncio.fixture
async def ans(ar):
    name = new_name("pya")
    await ar.execute_command("NS.CREATE", name)
    yield name
    await ar.execute_command("NS.DELETE", name)


async def new_lease(ar, ns, pid="w", ttl=30):
    return as_map(await ar.execute_command("LEASE.CREATE", ns, pid, ttl))["lease_id"]


@pytest.mark.asyncio
async def test_async_basic_commands(ar, ans, protocol):
    assert await ar.ping() is True
    raw = await ar.execute_command("SEM.CREATE", ans, "s", 2)
    assert isinstance(raw, dict if protocol == 3 else list)
    a = await new_lease(ar, ans, "a")
    got = as_map(await ar.execute_command("SEM.ACQUIRE", ans, "s", a, 2, 0))
    assert got["outcome"] == ACQUIRED and isinstance(got["fencing_token"], int)
    with pytest.raises(ResponseError, match="^INVALIDARG weight exceeds semaphore permits"):
        await ar.execute_command("SEM.ACQUIRE", ans, "s", a, 3, 0)
    assert "resp=%d" % protocol in await ar.execute_command("CLIENT", "INFO")


@pytest.mark.asyncio
async def test_async_parked_acquire_released_by_another_task(ar, ans, protocol):
    await ar.execute_command("SEM.CREATE", ans, "s", 1)
    a, b = await new_lease(ar, ans, "a"), await new_lease(ar, ans, "b")
    await ar.execute_command("SEM.ACQUIRE", ans, "s", a, 1, 0)
    w = make_async_client(protocol, single_connection_client=True)
    cid = await w.client_id()

    async def waiter():
        t0 = time.monotonic()
        reply = as_map(await w.execute_command("SEM.ACQUIRE", ans, "s", b, 1, 10))
        return reply, time.monotonic() - t0

    async def parked():
        for line in (await ar.execute_command("CLIENT", "LIST")).splitlines():
            if line.startswith(f"id={cid} "):
                return " flags=b " in line and " cmd=sem.acquire " in line
        return False

    task = asyncio.create_task(waiter())
    for _ in range(250):
        if await parked():
            break
        await asyncio.sleep(0.02)
    else:
        pytest.fail("the acquire did not park")
    assert (await ar.info("clients"))["blocked_clients"] >= 1
    await asyncio.sleep(0.2)
    await ar.execute_command("SEM.RELEASE", ans, "s", a)
    reply, elapsed = await asyncio.wait_for(task, 5)
    await w.aclose()
    assert reply["outcome"] == ACQUIRED
    assert 0.2 <= elapsed < 6


@pytest.mark.asyncio
async def test_async_pipelines(ar, ans):
    await ar.execute_command("SEM.CREATE", ans, "s", 1)
    a, b = await new_lease(ar, ans, "a"), await new_lease(ar, ans, "b")
    async with ar.pipeline(transaction=True) as p:
        p.execute_command("SEM.ACQUIRE", ans, "s", a, 1, 0)
        p.execute_command("SEM.ACQUIRE", ans, "s", b, 1, 10)  # never waits inside MULTI
        p.execute_command("SEM.HOLDERS", ans, "s")
        t0 = time.monotonic()
        res = await p.execute()
    assert time.monotonic() - t0 < 5
    assert as_map(res[0])["outcome"] == ACQUIRED
    assert as_map(res[1])["outcome"] == "ACQUIRE_OUTCOME_UNAVAILABLE"
    assert [as_map(h)["lease_id"] for h in as_map(res[2])["holders"]] == [a]

    async with ar.pipeline(transaction=False) as p:
        p.execute_command("SEM.ACQUIRE", ans, "s", b, 1, 0.2)
        p.execute_command("SEM.RELEASE", ans, "s", a)
        p.execute_command("SEM.ACQUIRE", ans, "s", b, 1, 0)
        p.execute_command("LEASE.GET", ans, "ls_" + "0" * 28)
        res = await p.execute(raise_on_error=False)
    assert as_map(res[0])["outcome"] == TIMED_OUT
    assert as_map(res[1])["active_holds"] == 0
    assert as_map(res[2])["outcome"] == ACQUIRED
    assert isinstance(res[3], ResponseError) and str(res[3]).startswith("NOTFOUND")


@pytest.mark.asyncio
async def test_async_hold_and_not_acquired(ar, ans):
    await ar.execute_command("SEM.CREATE", ans, "pool", 2)
    sem = AsyncSemaphore(ar, ans, "pool")
    lease = await AsyncLease.create(ar, ans, "w", 30)
    other = await AsyncLease.create(ar, ans, "o", 30)
    async with sem.hold(lease, 2, timeout=1) as token:
        assert isinstance(token, int)
        assert (await sem.get())["active_holds"] == 2
        with pytest.raises(NotAcquired) as exc:
            async with sem.hold(other, 1, timeout=0.2):
                pytest.fail("body must not run")
        assert exc.value.outcome == TIMED_OUT
    assert (await sem.get())["active_holds"] == 0

    with pytest.raises(RuntimeError):
        async with sem.hold(lease, 1):
            raise RuntimeError("body failed")
    assert (await sem.get())["active_holds"] == 0


@pytest.mark.asyncio
async def test_async_hold_all_waits_for_the_last_semaphore_and_releases_all(ar, ans):
    await ar.execute_command("SEM.CREATE", ans, "a", 1)
    await ar.execute_command("SEM.CREATE", ans, "b", 1)
    a, b = AsyncSemaphore(ar, ans, "a"), AsyncSemaphore(ar, ans, "b")
    holder = await AsyncLease.create(ar, ans, "h", 30)
    lease = await AsyncLease.create(ar, ans, "w", 30)
    await b.acquire(holder, 1)
    with pytest.raises(NotAcquiredAll) as exc:
        async with AsyncSemaphore.hold_all(lease, [(a, 1), (b, 1)]):
            pytest.fail("body must not run")
    assert exc.value.outcome == "ACQUIRE_OUTCOME_UNAVAILABLE"
    assert (await a.get())["active_holds"] == 0

    async def release_later():
        await asyncio.sleep(0.3)
        await b.release(holder)

    task = asyncio.get_running_loop().create_task(release_later())
    async with AsyncSemaphore.hold_all(lease, [(a, 1), (b, 1)], timeout=10) as tokens:
        assert len(tokens) == 2 and all(isinstance(t, int) for t in tokens)
        assert (await b.holders())["holders"][0]["lease_id"] == lease.id
    await task
    assert (await a.get())["active_holds"] == 0 and (await b.get())["active_holds"] == 0
    with pytest.raises(LeaseLost):
        async with AsyncSemaphore.hold_all(lease, [(a, 1), (b, 1)]):
            await lease.revoke()


@pytest.mark.asyncio
async def test_async_hold_wakes_when_another_task_releases(ar, ans):
    await ar.execute_command("SEM.CREATE", ans, "pool", 1)
    sem = AsyncSemaphore(ar, ans, "pool")
    a = await AsyncLease.create(ar, ans, "a", 30)
    b = await AsyncLease.create(ar, ans, "b", 30)
    order = []

    async def worker(lease, name):
        # both tasks share one client; its pool gives each its own connection
        async with sem.hold(lease, 1, timeout=10) as token:
            order.append((name, token, time.monotonic()))
            await asyncio.sleep(0.3)

    await asyncio.gather(worker(a, "a"), worker(b, "b"))
    assert sorted(n for n, _, _ in order) == ["a", "b"]
    (_, first_token, first_at), (_, second_token, second_at) = order
    assert second_at - first_at >= 0.28  # the second was parked until the first released
    assert second_token > first_token


@pytest.mark.asyncio
async def test_async_heartbeat_keeps_lease_alive(ar, ans):
    await ar.execute_command("SEM.CREATE", ans, "pool", 1)
    sem = AsyncSemaphore(ar, ans, "pool")
    lease = await AsyncLease.create(ar, ans, "w", ttl=3)
    lost = []
    async with lease.heartbeat(fraction=0.2, on_lost=lost.append) as hb:
        async with sem.hold(lease, 1) as token:
            await asyncio.sleep(6.5)
            assert not hb.lost and lost == [], hb.error
            holders = (await sem.holders())["holders"]
            assert [h["fencing_token"] for h in holders] == [token]
        assert hb.refreshes >= 5
    await asyncio.sleep(3.3)
    with pytest.raises(ResponseError, match="^NOTFOUND"):
        await lease.get()


@pytest.mark.asyncio
async def test_async_heartbeat_reports_loss(ar, ans):
    lease = await AsyncLease.create(ar, ans, "w", ttl=3)
    seen = asyncio.Event()
    errors = []

    async def on_lost(err):
        errors.append(err)
        seen.set()

    hb = lease.heartbeat(fraction=0.1, on_lost=on_lost)
    try:
        for _ in range(250):
            if hb.refreshes >= 1:
                break
            await asyncio.sleep(0.02)
        assert not hb.lost and hb.refreshes >= 1
        await lease.revoke()
        await asyncio.wait_for(seen.wait(), 6)
        assert hb.lost and await hb.wait_lost(0)
        assert isinstance(hb.error, LeaseLost) and errors == [hb.error]
        assert "NOTFOUND" in str(hb.error)
    finally:
        await hb.stop()


@pytest.mark.asyncio
async def test_async_socket_timeout_guard():
    c = make_async_client(3, socket_timeout=1)
    try:
        with pytest.raises(ValueError, match="socket_timeout"):
            await AsyncSemaphore(c, "any", "any").acquire("ls_x", 1, timeout=2)
    finally:
        await c.aclose()
