"""redis-py RedisCluster across real failovers (SPEC section 10): a 3-node permitd cluster of its
own, started from PERMITD_BIN, whose leader is killed with SIGKILL three times while worker
threads keep acquiring and releasing.

Each worker is what a user would write: a `RedisCluster(startup_nodes=[3 x ClusterNode])` with
nothing else configured, a lease of its own (refreshed every second), and a loop of
SEM.ACQUIRE ... 1 0 / SEM.RELEASE on one semaphore of fewer permits than workers. An error is
retried by the loop after a short pause; after an error on an acquire (its outcome may be
unknown: LEADERCHANGED, a lost connection) the worker sends SEM.RELEASE until it is answered
before it goes on, so that it never holds a permit without knowing it. RedisCluster hides part
of a failover by itself: it follows MOVED and TRYAGAIN (up to 16 tries), and re-sends after
CLUSTERDOWN or a lost connection (10 more tries, each after a CLUSTER SLOTS refresh, with no
pause between them). What gets past it reaches the loop and is counted by kind; seen so far:
ConnectionError (the 10 re-sends are spent long before the followers stop naming the dead
leader) and, before permitd kept showing the last leader's slots during an election (an empty
CLUSTER SLOTS), RedisClusterException "All slots are not covered ...", which is not a
RedisError: the loop still counts it.

Asserted, as a user would check it:
- after each kill, every worker gets an answer to a command sent after the kill within 3 s
  (SPEC section 10: "a client that retries ... gets its next answer within 3 s of the crash"),
  and some worker acquires a permit within 3 s;
- never more permits held at once than the semaphore has, counting a hold from its ACQUIRED
  reply to the first send of its SEM.RELEASE;
- fencing tokens rise: an acquire sent after another one's ACQUIRED reply gets a larger token;
- no lease is lost, and once every worker has stopped the semaphore has no holds left.

Runs only when PERMITD_BIN names the server binary (skipped otherwise, so the suite can still
run against a single server with run.sh PORT); a PERMITD_BIN that is not an executable fails.
The failover gaps (p50 and max per kill and worker) and the errors by kind are printed."""

import bisect
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections import Counter

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from permitd_client import ACQUIRED, UNAVAILABLE, parse_acquire, parse_entity

BIN = os.environ.get("PERMITD_BIN")
pytestmark = pytest.mark.skipif(
    not BIN, reason="PERMITD_BIN is not set: this test starts a 3-node cluster from that binary")

HOST = "127.0.0.1"
NODES = 3
KILLS = 3
WORKERS = 4
PERMITS = 2
LEASE_TTL = 10  # seconds
REFRESH_EVERY = 1.0
HOLD = 0.02  # how long a worker keeps a permit
PAUSE = 0.01  # between a worker's iterations (the machine may have 2 cores for everything)
ERROR_PAUSE = 0.05  # after an error reached the loop
STEADY = 1.0  # seconds of traffic on a settled cluster before each kill
FAILOVER_LIMIT = 3.0  # SPEC section 10
START_TIMEOUT = 30
REJOIN_TIMEOUT = 20
# setpriv (util-linux) makes each server die with this process, even if pytest is killed itself
# (a preexec_fn calling prctl is not safe once the worker threads run)
SETPRIV = ["/usr/bin/setpriv", "--pdeathsig", "KILL", "--"] if os.path.exists("/usr/bin/setpriv") else []


def free_port(taken):
    """A port free on 127.0.0.1, below the ephemeral range (32768-) so that no outgoing
    connection takes it while its node is down, and not in `taken`."""
    for _ in range(200):
        port = random.randrange(15000, 32000)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise RuntimeError("no free port found")


class Node:
    def __init__(self, node_id, port, cport, root):
        self.id = node_id
        self.port = port
        self.cport = cport
        self.dir = os.path.join(root, f"node{node_id}")
        self.log_path = os.path.join(root, f"node{node_id}.log")
        self.proc = None
        os.makedirs(self.dir)

    def start(self, init=None):
        args = [BIN, "--bind", HOST, "--port", str(self.port), "--dir", self.dir, "--shards", "2",
                "--cluster-node-id", str(self.id), "--cluster-port", str(self.cport)]
        if init:
            args += ["--cluster-init", init]
        with open(self.log_path, "ab") as log:
            log.write(f"--- start: {' '.join(args)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(SETPRIV + args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        """SIGKILL; returns the moment the signal was sent (monotonic clock)."""
        at = time.monotonic()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        return at

    def raft(self):
        """INFO raft as redis-py parses it (numbers as ints, a peer's line as a dict), or None
        if the node does not answer."""
        try:
            with redis.Redis(host=HOST, port=self.port, decode_responses=True, socket_timeout=1,
                             socket_connect_timeout=1) as c:
                return c.info("raft")
        except (RedisError, OSError):
            return None

    def errorstats(self):
        """INFO errorstats as {error code: count} (counted since this process started)."""
        try:
            with redis.Redis(host=HOST, port=self.port, decode_responses=True, socket_timeout=1,
                             socket_connect_timeout=1) as c:
                info = c.info("errorstats")
        except (RedisError, OSError):
            return None
        return {k.removeprefix("errorstat_"): v["count"] for k, v in info.items()}

    def log_tail(self, lines=30):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError as e:
            return f"(no log: {e})"


class Cluster:
    def __init__(self, root):
        taken = set()
        self.nodes = {}
        for i in range(1, NODES + 1):
            self.nodes[i] = Node(i, free_port(taken), free_port(taken), root)
        # the error replies the nodes sent (INFO errorstats), summed over their processes: the
        # last sample of each running process, plus those of the processes killed
        self.sampled = {}
        self.banked = Counter()

    def start(self):
        init = ",".join(f"{n.id}={HOST}:{n.port}@{n.cport}" for n in self.nodes.values())
        for n in self.nodes.values():
            if n.id != 1:
                n.start()
        self.nodes[1].start(init=init)
        self.wait_stable(START_TIMEOUT)

    def stable_leader(self):
        """The leader's id when every node runs, answers, agrees on one leader that says it leads,
        and the leader's log is matched by every peer (lag 0); else None."""
        infos = {}
        for n in self.nodes.values():
            if not n.alive():
                return None
            info = n.raft()
            if info is None:
                return None
            infos[n.id] = info
        leaders = {info.get("raft_leader_id") for info in infos.values()}
        if len(leaders) != 1:
            return None
        leader = leaders.pop()
        if leader not in infos or infos[leader].get("raft_role") != "leader":
            return None
        for n in self.nodes.values():
            peer = infos[leader].get(f"raft_peer{n.id}")
            if n.id != leader and not (isinstance(peer, dict) and peer.get("lag") == 0):
                return None
        return leader

    def wait_stable(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for n in self.nodes.values():
                if n.proc is not None and not n.alive():
                    raise AssertionError(f"node {n.id} exited ({n.proc.returncode}); its log:\n{n.log_tail()}")
            leader = self.stable_leader()
            if leader is not None:
                return leader
            time.sleep(0.1)
        raise AssertionError(f"the cluster did not settle on a leader in {timeout} s: "
                             + "; ".join(f"node {n.id}: {n.raft()}" for n in self.nodes.values()))

    def new_leader(self, old, timeout):
        """The id of a leader other than `old` that a live node names and that says it leads."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for n in self.nodes.values():
                if n.id == old or not n.alive():
                    continue
                info = n.raft()
                if info and info.get("raft_role") == "leader":
                    return n.id
            time.sleep(0.05)
        raise AssertionError(f"no new leader {timeout} s after node {old} was killed")

    def sample_errorstats(self):
        for n in self.nodes.values():
            stats = n.errorstats() if n.alive() else None
            if stats is not None:
                self.sampled[n.id] = stats

    def kill(self, node_id):
        """SIGKILL, after a last look at the node's error counts; returns when it was sent."""
        self.sample_errorstats()
        at = self.nodes[node_id].kill()
        self.banked.update(self.sampled.pop(node_id, {}))
        return at

    def error_replies(self):
        self.sample_errorstats()
        total = Counter(self.banked)
        for stats in self.sampled.values():
            total.update(stats)
        return total

    def stop(self):
        for n in self.nodes.values():
            n.kill()

    def startup_nodes(self):
        return [ClusterNode(HOST, n.port) for n in self.nodes.values()]


@pytest.fixture
def cluster(request):
    if not (os.path.isfile(BIN) and os.access(BIN, os.X_OK)):
        pytest.fail(f"PERMITD_BIN={BIN} is not an executable file")
    root = tempfile.mkdtemp(prefix="permitd-failover-")
    c = Cluster(root)
    c.passed = False  # set by the test at its very end
    try:
        c.start()
        yield c
    finally:
        c.stop()
        if not c.passed:
            for n in c.nodes.values():
                print(f"--- node {n.id} (port {n.port}) log, last lines ---\n{n.log_tail()}")
        shutil.rmtree(root, ignore_errors=True)


def kind(err):
    """An error as a short kind: the server's error code, or the exception's class."""
    if isinstance(err, ResponseError) and type(err) is ResponseError:
        return f"ResponseError {str(err).split(' ', 1)[0]}"
    return type(err).__name__


class Worker(threading.Thread):
    def __init__(self, index, startup_nodes, ns, sem, stop):
        super().__init__(name=f"worker{index}", daemon=True)
        self.index = index
        self.ns, self.sem, self.stop = ns, sem, stop
        self.rc = RedisCluster(startup_nodes=startup_nodes, decode_responses=True)
        reply = parse_entity(self.rc.execute_command("LEASE.CREATE", ns, f"worker-{index}", LEASE_TTL))
        self.lease = reply["lease_id"]
        self.answers = []  # (sent, answered, command, outcome or "OK")
        self.errors = []  # (sent, failed, command, kind, message)
        self.holds = []  # [acquire sent, ACQUIRED received, first release sent or None, token]
        self.lost = None  # the error that said the lease is gone
        self.crash = None  # an exception the loop did not expect

    def call(self, command, *args):
        """(True, reply) or (False, error), recording either."""
        sent = time.monotonic()
        try:
            reply = self.rc.execute_command(command, *args)
        except (RedisError, RedisClusterException) as e:  # the latter is no RedisError
            self.errors.append((sent, time.monotonic(), command, kind(e), str(e)[:200]))
            return False, e
        answered = time.monotonic()
        outcome = parse_acquire(reply).outcome if command == "SEM.ACQUIRE" else "OK"
        self.answers.append((sent, answered, command, outcome))
        return True, reply

    def release_until_answered(self):
        """SEM.RELEASE until the cluster answers it. A lease that holds nothing there is a no-op
        (SPEC section 9), so this also settles an acquire whose outcome was unknown."""
        give_up = time.monotonic() + 30
        while time.monotonic() < give_up:
            ok, res = self.call("SEM.RELEASE", self.ns, self.sem, self.lease)
            if ok:
                return
            if isinstance(res, ResponseError) and str(res).startswith("NOTFOUND"):
                self.lost = res
                return
            time.sleep(ERROR_PAUSE)
        raise AssertionError(f"{self.name}: SEM.RELEASE not answered for 30 s")

    def run(self):
        try:
            self.loop()
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.crash = e

    def loop(self):
        refreshed = time.monotonic()
        unsure = False
        while not self.stop.is_set() and self.lost is None:
            if time.monotonic() - refreshed >= REFRESH_EVERY:
                ok, res = self.call("LEASE.REFRESH", self.ns, self.lease, LEASE_TTL)
                if ok:
                    refreshed = time.monotonic()
                elif isinstance(res, ResponseError) and str(res).startswith("NOTFOUND"):
                    self.lost = res
                    return
            if unsure:
                self.release_until_answered()
                unsure = False
            sent = time.monotonic()
            ok, res = self.call("SEM.ACQUIRE", self.ns, self.sem, self.lease, 1, 0)
            if not ok:
                unsure = True
                time.sleep(ERROR_PAUSE)
                continue
            result = parse_acquire(res)
            if result.outcome == ACQUIRED:
                hold = [sent, time.monotonic(), None, result.fencing_token]
                self.holds.append(hold)
                time.sleep(HOLD)
                hold[2] = time.monotonic()
                self.release_until_answered()
            else:
                assert result.outcome == UNAVAILABLE, result
            time.sleep(PAUSE)
        if unsure:
            self.release_until_answered()

    def next_answer(self, after):
        """The first answer to a command sent at or after `after` (the answering time)."""
        for sent, answered, *_ in self.answers:
            if sent >= after:
                return answered
        return None

    def next_acquired(self, after):
        for sent, received, _, _ in self.holds:
            if sent >= after:
                return received
        return None


def max_concurrent(holds, end):
    """The most holds open at one instant, a hold counting from its ACQUIRED reply to the first
    send of its release (ends before starts at the same instant)."""
    edges = []
    for _, start, stop, _ in holds:
        edges.append((start, 1))
        edges.append((stop if stop is not None else end, -1))
    edges.sort(key=lambda e: (e[0], e[1]))
    most = cur = 0
    for _, d in edges:
        cur += d
        most = max(most, cur)
    return most


def token_inversions(holds):
    """Pairs (earlier, later) where `later`'s acquire was sent after `earlier`'s ACQUIRED reply
    was received, yet its fencing token is not larger: SPEC section 3's tokens must rise."""
    by_reply = sorted(holds, key=lambda h: h[1])
    replies = [h[1] for h in by_reply]
    prefix_max = []
    best = None
    for h in by_reply:
        best = h if best is None or h[3] > best[3] else best
        prefix_max.append(best)
    bad = []
    for h in holds:
        i = bisect.bisect_left(replies, h[0])  # holds whose reply came before h was sent
        if i and prefix_max[i - 1][3] >= h[3]:
            bad.append((prefix_max[i - 1], h))
    return bad


def stats(values):
    if not values:
        return "-"
    return f"p50 {statistics.median(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"


def test_workers_keep_acquiring_across_leader_kills(cluster, capsys):
    started = time.monotonic()
    admin = RedisCluster(startup_nodes=cluster.startup_nodes(), decode_responses=True)
    ns = f"failover-{os.getpid()}"
    sem = "pool"
    admin.execute_command("NS.CREATE", ns, "DESC", "redis-compat RedisCluster failover")
    admin.execute_command("SEM.CREATE", ns, sem, PERMITS)

    stop = threading.Event()
    workers = [Worker(i, cluster.startup_nodes(), ns, sem, stop) for i in range(WORKERS)]
    for w in workers:
        w.start()
    kills = []  # (time, killed node id, new leader id, election seen at)
    problems = []
    try:
        for k in range(KILLS):
            leader = cluster.wait_stable(REJOIN_TIMEOUT)
            # every worker in its loop, answered since the cluster settled and lately, so that
            # the kill lands mid-traffic
            settled = time.monotonic()
            deadline = settled + 10
            while True:
                now = time.monotonic()
                if now - settled >= STEADY and all(
                        w.holds and w.next_answer(settled) and now - w.answers[-1][1] < 0.5 for w in workers):
                    break
                if now > deadline or any(not w.is_alive() for w in workers):
                    raise AssertionError("workers not all answered before kill "
                                         f"{k + 1}: {[(w.name, len(w.answers), w.crash) for w in workers]}")
                time.sleep(0.05)
            killed_at = cluster.kill(leader)
            new = cluster.new_leader(leader, 10)
            elected = time.monotonic()
            kills.append((killed_at, leader, new, elected))
            # let the workers find the new leader before the killed node comes back
            deadline = killed_at + FAILOVER_LIMIT + 2
            while time.monotonic() < deadline and not all(w.next_answer(killed_at) for w in workers):
                time.sleep(0.05)
            cluster.nodes[leader].start()
        cluster.wait_stable(REJOIN_TIMEOUT)
        time.sleep(0.5)
    finally:
        stop.set()
        for w in workers:
            w.join(40)
    end = time.monotonic()

    for w in workers:
        if w.crash is not None:
            problems.append(f"{w.name} stopped on {w.crash!r}")
        if w.lost is not None:
            problems.append(f"{w.name} lost its lease: {w.lost}")
        if w.is_alive():
            problems.append(f"{w.name} still running 40 s after stop")

    lines = [f"redis-py RedisCluster failover: {WORKERS} workers, {PERMITS} permits, {KILLS} leader kills (SIGKILL)"]
    all_gaps = []
    for k, (killed_at, leader, new, elected) in enumerate(kills, 1):
        gaps, acq = [], []
        for w in workers:
            answered = w.next_answer(killed_at)
            if answered is None:
                problems.append(f"kill {k}: {w.name} got no answer after the kill")
                continue
            gaps.append(answered - killed_at)
            got = w.next_acquired(killed_at)
            if got is not None:
                acq.append(got - killed_at)
            if answered - killed_at >= FAILOVER_LIMIT:
                problems.append(f"kill {k}: {w.name} answered {answered - killed_at:.2f} s after the kill")
        all_gaps += gaps
        if not acq or min(acq) >= FAILOVER_LIMIT:
            problems.append(f"kill {k}: no worker acquired within {FAILOVER_LIMIT} s ({acq})")
        per_worker = ", ".join(f"{g * 1000:.0f}" for g in gaps)
        lines.append(f"  kill {k}: node {leader} -> node {new} leads {(elected - killed_at) * 1000:.0f} ms"
                     f" after; next answer per worker (ms): {per_worker} ({stats(gaps)});"
                     f" next ACQUIRED: {stats(acq)}")
    lines.append(f"  all kills: next answer {stats(all_gaps)}")

    quiet = [(a[2], a[1] - a[0]) for w in workers for a in w.answers
             if not any(k[0] - 0.5 <= a[0] <= k[0] + FAILOVER_LIMIT + 1 for k in kills)]
    for command in ("SEM.ACQUIRE", "SEM.RELEASE", "LEASE.REFRESH"):
        took = sorted(t for c, t in quiet if c == command)
        if took:
            lines.append(f"  {command} latency away from the kills: p50 {statistics.median(took) * 1000:.1f} ms,"
                         f" p99 {took[int(0.99 * (len(took) - 1))] * 1000:.1f} ms ({len(took)} calls)")

    holds = [h for w in workers for h in w.holds]
    most = max_concurrent(holds, end)
    inversions = token_inversions(holds)
    lines.append(f"  {len(holds)} holds, at most {most} at once; "
                 f"{sum(len(w.answers) for w in workers)} answers")
    if most > PERMITS:
        problems.append(f"{most} permits held at once, the semaphore has {PERMITS}")
    if inversions:
        problems.append(f"{len(inversions)} fencing tokens did not rise, e.g. {inversions[:3]}")

    errors = Counter((e[2], e[3]) for w in workers for e in w.errors)
    samples = {}
    for w in workers:
        for e in w.errors:
            samples.setdefault((e[2], e[3]), e[4])
    lines.append("  errors that reached the loop, by command and kind:"
                 + ("" if errors else " none"))
    for (command, k), count in sorted(errors.items()):
        lines.append(f"    {command} {k}: {count} (e.g. {samples[(command, k)]!r})")

    replies = cluster.error_replies()
    lines.append("  error replies the nodes sent (INFO errorstats; a killed node's since its last sample lost): "
                 + (", ".join(f"{code} {n}" for code, n in sorted(replies.items())) or "none"))

    # every worker stopped and released: nothing may be left held (an unknown acquire that
    # was granted was released by its worker)
    state = parse_entity(admin.execute_command("SEM.GET", ns, sem))
    if state["active_holds"] != 0:
        problems.append(f"after every worker released, SEM.GET shows active_holds {state['active_holds']}")
    for w in workers:
        try:
            w.rc.execute_command("LEASE.REVOKE", ns, w.lease)
        except RedisError as e:
            problems.append(f"{w.name}: LEASE.REVOKE failed: {e}")
        w.rc.close()
    admin.execute_command("NS.DELETE", ns)
    admin.close()
    lines.append(f"  total {time.monotonic() - started:.1f} s")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert not problems, "\n".join(problems + lines)
    cluster.passed = True
