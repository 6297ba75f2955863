"""The sync helpers of permitd_client: Lease, Semaphore, hold(), Heartbeat (RESP2 and RESP3)."""

import threading
import time

import pytest
from redis.exceptions import ResponseError

from conftest import make_client
from permitd_client import (ACQUIRED, TIMED_OUT, UNAVAILABLE, Lease, LeaseLost, NotAcquired,
                            NotAcquiredAll, Semaphore, parse_acquire)


@pytest.fixture
def sem(r, ns):
    r.execute_command("SEM.CREATE", ns, "pool", 3)
    return Semaphore(r, ns, "pool")


def test_acquire_result_and_release(r, ns, sem):
    lease = Lease.create(r, ns, "worker-1", ttl=30, meta={"host": "h1"})
    assert lease.id.startswith("ls_") and len(lease.id) == 31
    assert lease.info["process_id"] == "worker-1" and lease.info["metadata"] == {"host": "h1"}
    assert "ls_" not in repr(lease)  # the capability is not printed by repr

    res = sem.acquire(lease, weight=2, meta={"job": "42"})
    assert res.acquired and bool(res) and res.outcome == ACQUIRED
    assert isinstance(res.fencing_token, int)
    assert res.semaphore["name"] == "pool" and res.semaphore["active_holds"] == 2
    assert res.semaphore["metadata"] == {}

    other = Lease.create(r, ns, "worker-2", ttl=30)
    un = sem.acquire(other, weight=2)
    assert not un and un.outcome == UNAVAILABLE and un.fencing_token is None
    assert un.semaphore["active_holds"] == 2

    page = sem.holders()
    assert [h["lease_id"] for h in page["holders"]] == [lease.id]
    assert page["holders"][0]["metadata"] == {"job": "42"}
    assert page["holders"][0]["fencing_token"] == res.fencing_token
    assert page["next_cursor"] == ""

    after = sem.release(lease)
    assert after["active_holds"] == 0
    # releasing again is a no-op that returns the unchanged semaphore
    assert sem.release(lease)["active_holds"] == 0
    # a lease id string works as well as a Lease
    assert sem.acquire(other.id, 3).acquired
    assert sem.get()["active_holds"] == 3


def test_acquire_timed_out_and_server_errors(r, ns, sem):
    a = Lease.create(r, ns, "a", 30)
    b = Lease.create(r, ns, "b", 30)
    assert sem.acquire(a, 3).acquired
    t0 = time.monotonic()
    res = sem.acquire(b, 1, timeout=0.25)
    assert res.outcome == TIMED_OUT and 0.2 <= time.monotonic() - t0 < 4
    with pytest.raises(ResponseError, match="^INVALIDARG weight exceeds semaphore permits"):
        sem.acquire(b, 4, timeout=1)


def test_acquire_refuses_timeout_not_below_socket_timeout(ns):
    c = make_client(2, socket_timeout=2)
    try:
        c.execute_command("SEM.CREATE", ns, "s", 1)
        lease = Lease.create(c, ns, "w", 30)
        with pytest.raises(ValueError, match="socket_timeout"):
            Semaphore(c, ns, "s").acquire(lease, 1, timeout=5)
        # nothing was sent
        assert Semaphore(c, ns, "s").get()["last_activity_at"] == Semaphore(c, ns, "s").get()["created_at"]
        assert Semaphore(c, ns, "s").acquire(lease, 1, timeout=1).acquired
    finally:
        c.close()


def test_hold_context_manager(r, ns, sem):
    lease = Lease.create(r, ns, "w", 30)
    with sem.hold(lease, weight=2, timeout=1) as token:
        assert isinstance(token, int)
        assert sem.get()["active_holds"] == 2
        assert sem.holders()["holders"][0]["fencing_token"] == token
    assert sem.get()["active_holds"] == 0

    # released when the body raises, and the body's exception comes through
    with pytest.raises(KeyError):
        with sem.hold(lease, 1):
            assert sem.get()["active_holds"] == 1
            raise KeyError("boom")
    assert sem.get()["active_holds"] == 0

    # tokens rise from one hold to the next
    with sem.hold(lease, 1) as t1:
        pass
    with sem.hold(lease, 1) as t2:
        pass
    assert t2 > t1 > token


def test_hold_all_takes_every_semaphore_or_none_and_releases_them(r, ns, sem):
    r.execute_command("SEM.CREATE", ns, "other", 1)
    other = Semaphore(r, ns, "other")
    a = Lease.create(r, ns, "a", 30)
    b = Lease.create(r, ns, "b", 30)
    with Semaphore.hold_all(a, [(other, 1), (sem, 2)], timeout=1, meta={"job": "7"}) as tokens:
        assert len(tokens) == 2 and all(isinstance(t, int) for t in tokens)
        assert other.holders()["holders"][0]["fencing_token"] == tokens[0]
        assert sem.holders()["holders"][0]["metadata"] == {"job": "7"}
        # b fits pool but not other: it gets neither
        with pytest.raises(NotAcquiredAll) as exc:
            with Semaphore.hold_all(b, [(sem, 1), (other, 1)], timeout=0.2):
                pytest.fail("the body must not run")
        assert isinstance(exc.value, NotAcquired) and exc.value.outcome == TIMED_OUT
        assert [s["name"] for s in exc.value.semaphores] == ["pool", "other"]
        assert sem.get()["active_holds"] == 2
    assert sem.get()["active_holds"] == 0 and other.get()["active_holds"] == 0
    # released when the body raises, and the body's exception comes through
    with pytest.raises(KeyError):
        with Semaphore.hold_all(b, [(sem, 3), (other, 1)]):
            raise KeyError("boom")
    assert sem.get()["active_holds"] == 0 and other.get()["active_holds"] == 0
    res = Semaphore.acquire_all(a, [(sem, 1)])
    assert res.acquired and res.holds[0]["semaphore"]["name"] == "pool"
    with pytest.raises(ValueError, match="one client and namespace"):
        Semaphore.acquire_all(a, [(sem, 1), (Semaphore(make_client(2), ns, "other"), 1)])


def test_hold_all_reports_a_lease_lost_during_the_body(r, ns, sem):
    r.execute_command("SEM.CREATE", ns, "other", 1)
    lease = Lease.create(r, ns, "w", 30)
    with pytest.raises(LeaseLost, match="lost before release"):
        with Semaphore.hold_all(lease, [(sem, 1), (Semaphore(r, ns, "other"), 1)]):
            r.execute_command("LEASE.REVOKE", ns, lease.id)


def test_hold_raises_not_acquired(r, ns, sem):
    a = Lease.create(r, ns, "a", 30)
    b = Lease.create(r, ns, "b", 30)
    sem.acquire(a, 3)
    body_ran = False
    with pytest.raises(NotAcquired) as exc:
        with sem.hold(b, 1, timeout=0.2):
            body_ran = True
    assert not body_ran
    assert exc.value.outcome == TIMED_OUT
    assert exc.value.semaphore["active_holds"] == 3
    assert "not acquired" in str(exc.value) and ns in str(exc.value)
    with pytest.raises(NotAcquired) as exc:
        with sem.hold(b, 1):
            pass
    assert exc.value.outcome == UNAVAILABLE


def test_hold_reports_a_lease_lost_during_the_body(r, ns, sem):
    lease = Lease.create(r, ns, "w", 30)
    with pytest.raises(LeaseLost, match="lost before release"):
        with sem.hold(lease, 1):
            r.execute_command("LEASE.REVOKE", ns, lease.id)
    assert sem.get()["active_holds"] == 0


def test_hold_waits_for_a_release_in_another_thread(r, ns, sem):
    a = Lease.create(r, ns, "a", 30)
    b = Lease.create(r, ns, "b", 30)
    sem.acquire(a, 3)
    timer = threading.Timer(0.3, lambda: Semaphore(make_client(2), ns, "pool").release(a))
    timer.start()
    t0 = time.monotonic()
    with sem.hold(b, 2, timeout=10) as token:
        waited = time.monotonic() - t0
        assert isinstance(token, int)
    timer.join()
    assert 0.25 <= waited < 6


def test_lease_refresh_and_revoke(r, ns):
    lease = Lease.create(r, ns, "w", 5)
    first = lease.info["expires_at"]
    time.sleep(0.05)
    info = lease.refresh(20)
    assert lease.ttl == 20 and info["expires_at"] > first
    assert lease.get()["expires_at"] == info["expires_at"]
    lease.revoke()
    with pytest.raises(ResponseError, match="^NOTFOUND"):
        lease.refresh()


def test_heartbeat_default_interval_is_a_third_of_the_ttl(r, ns):
    lease = Lease.create(r, ns, "w", ttl=3)
    hb = lease.heartbeat(start=False)
    assert hb.interval == pytest.approx(1.0) and not hb.lost
    lease.revoke()


def test_heartbeat_keeps_a_lease_alive_past_its_ttl(r, ns, sem):
    # ttl 3 s, refreshed every 0.6 s: 2.4 s of slack for a loaded machine, where one
    # LEASE.REFRESH under --fsync always can take a second
    lease = Lease.create(r, ns, "beating", ttl=3)
    unguarded = Lease.create(r, ns, "silent", ttl=3)
    assert sem.acquire(lease, 2).acquired
    assert sem.acquire(unguarded, 1).acquired
    lost = []
    with lease.heartbeat(fraction=0.2, on_lost=lost.append) as hb:
        assert hb.interval == pytest.approx(0.6)
        time.sleep(6.5)  # more than twice the ttl
        assert not hb.lost and hb.error is None and lost == [], hb.error
        assert hb.refreshes >= 5
        assert lease.get()["lease_id"] == lease.id
        holders = sem.holders()["holders"]
        assert [h["lease_id"] for h in holders] == [lease.id]  # the silent one expired
        with pytest.raises(ResponseError, match="^NOTFOUND"):
            unguarded.refresh()
    # stopped: the lease now runs out like any other
    time.sleep(3.3)
    with pytest.raises(ResponseError, match="^NOTFOUND"):
        lease.get()
    assert sem.get()["active_holds"] == 0


def test_heartbeat_reports_loss_after_revoke(r, ns, sem):
    lease = Lease.create(r, ns, "doomed", ttl=3)
    sem.acquire(lease, 1)
    called = threading.Event()
    errors = []

    def on_lost(err):
        errors.append(err)
        called.set()

    hb = lease.heartbeat(fraction=0.1, on_lost=on_lost)
    try:
        deadline = time.monotonic() + 5
        while hb.refreshes < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not hb.lost and hb.refreshes >= 1
        r.execute_command("LEASE.REVOKE", ns, lease.id)
        assert called.wait(6), "on_lost was not called"
        assert hb.lost and hb.wait_lost(0)
        assert isinstance(hb.error, LeaseLost) and errors == [hb.error]
        assert "NOTFOUND" in str(hb.error)
        assert isinstance(hb.error.cause, ResponseError)
    finally:
        hb.stop()
    assert sem.get()["active_holds"] == 0


def test_parse_acquire_of_pipeline_replies(r, ns, sem):
    lease = Lease.create(r, ns, "w", 30)
    with r.pipeline(transaction=True) as p:
        p.execute_command("SEM.ACQUIRE", ns, "pool", lease.id, 1, 0)
        p.execute_command("SEM.ACQUIRE", ns, "pool", lease.id, 2, 0)
        first, second = (parse_acquire(x) for x in p.execute())
    assert first.acquired and second.acquired
    assert first.fencing_token == second.fencing_token  # a re-acquire keeps its token
    assert second.semaphore["active_holds"] == 2
