// redis-compat/go-redis/session.go: one whole permitd session through go-redis v5's
// redis.NewClient (gopkg.in/redis.v5, Debian's golang-gopkg-redis.v5-dev; RESP2 only).
//
//	session HOST:PORT
//
// NS.CREATE, SEM.CREATE, LEASE.CREATE; an acquire that parks on another client's connection
// and is woken by a SEM.RELEASE; SEM.HOLDERS; a pipeline; a TxPipeline (MULTI/EXEC) with two
// acquires on two semaphores, whose tokens must differ as int64; a transaction across two
// namespaces (CROSSSLOT, nothing runs); INFO; every token below 2^53; go-redis's default 3 s
// ReadTimeout cutting a 5 s acquire; and why redis.NewClusterClient is not in this session:
// go-redis v5 cannot parse the COMMAND and CLUSTER SLOTS replies of Redis 7, which permitd
// gives too (the same errors come from a real Redis 7.0 cluster). Prints "ok - step" or
// "FAIL - step: why" per step and "N passed, M failed" last; exits non-zero on any failure.
// PERMITD_PASSWORD, when set, is the clients' Password.
package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"gopkg.in/redis.v5"
)

const (
	parkTimeout = 5 * time.Second
	// go-redis v5 reads with a 3 s timeout unless told otherwise, shorter than the parked
	// acquire: every client here but the one showing that sets this.
	readTimeout = parkTimeout + 10*time.Second
	two53       = int64(1) << 53
)

var passed, failed int

func step(name string, fn func() error) bool {
	if err := fn(); err != nil {
		failed++
		fmt.Printf("FAIL - %s: %v\n", name, err)
		return false
	}
	passed++
	fmt.Printf("ok - %s\n", name)
	return true
}

func do(c *redis.Client, args ...interface{}) (interface{}, error) {
	cmd := redis.NewCmd(args...)
	c.Process(cmd)
	return cmd.Result()
}

// A RESP2 map reply (a flat array name, value, ...) as a map.
func asMap(reply interface{}) (map[string]interface{}, error) {
	list, ok := reply.([]interface{})
	if !ok || len(list)%2 != 0 {
		return nil, fmt.Errorf("not a map reply: %v", reply)
	}
	m := make(map[string]interface{}, len(list)/2)
	for i := 0; i < len(list); i += 2 {
		m[fmt.Sprint(list[i])] = list[i+1]
	}
	return m, nil
}

func doMap(c *redis.Client, args ...interface{}) (map[string]interface{}, error) {
	reply, err := do(c, args...)
	if err != nil {
		return nil, fmt.Errorf("%v: %v", args[0], err)
	}
	return asMap(reply)
}

type session struct {
	main, waiter     *redis.Client
	ns, other        string
	holder, waiterID string
	parkedToken      int64
	tokens           []int64
}

// An ACQUIRED reply's fencing token, recorded for the range check.
func (s *session) acquired(reply interface{}, what string) (int64, error) {
	r, err := asMap(reply)
	if err != nil {
		return 0, err
	}
	if r["outcome"] != "ACQUIRE_OUTCOME_ACQUIRED" {
		return 0, fmt.Errorf("%s: outcome %v", what, r["outcome"])
	}
	t, ok := r["fencing_token"].(int64)
	if !ok {
		return 0, fmt.Errorf("%s: token %v is a %T", what, r["fencing_token"], r["fencing_token"])
	}
	s.tokens = append(s.tokens, t)
	return t, nil
}

func (s *session) create() error {
	n, err := doMap(s.main, "NS.CREATE", s.ns, "DESC", "redis-compat go-redis")
	if err != nil {
		return err
	}
	if n["name"] != s.ns || n["version"] != int64(1) {
		return fmt.Errorf("NS.CREATE: %v", n)
	}
	if _, err := do(s.main, "NS.CREATE", s.other); err != nil {
		return err
	}
	for _, sem := range []string{"pool", "a", "b"} {
		m, err := doMap(s.main, "SEM.CREATE", s.ns, sem, 1)
		if err != nil {
			return err
		}
		if m["permits"] != int64(1) || m["active_holds"] != int64(0) {
			return fmt.Errorf("SEM.CREATE %s: %v", sem, m)
		}
	}
	l, err := doMap(s.main, "LEASE.CREATE", s.ns, "holder", 30)
	if err != nil {
		return err
	}
	// int64: nanosecond timestamps exact
	created, _ := l["created_at"].(int64)
	expires, _ := l["expires_at"].(int64)
	if expires-created != 30*int64(time.Second) {
		return fmt.Errorf("expires_at - created_at = %d", expires-created)
	}
	s.holder = fmt.Sprint(l["lease_id"])
	w, err := doMap(s.main, "LEASE.CREATE", s.ns, "waiter", 30)
	if err != nil {
		return err
	}
	s.waiterID = fmt.Sprint(w["lease_id"])
	return nil
}

// Whether CLIENT LIST shows connection id parked: flags=b, cmd=sem.acquire.
func (s *session) isParked(id int64) bool {
	list, err := do(s.main, "CLIENT", "LIST")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(fmt.Sprint(list), "\n") {
		if strings.HasPrefix(line, fmt.Sprintf("id=%d ", id)) {
			return strings.Contains(line, " flags=b ") && strings.Contains(line, " cmd=sem.acquire ")
		}
	}
	return false
}

func (s *session) parkAndWake() error {
	first, err := do(s.main, "SEM.ACQUIRE", s.ns, "pool", s.holder, 1, 0)
	if err != nil {
		return err
	}
	t0, err := s.acquired(first, "first acquire")
	if err != nil {
		return err
	}
	idReply, err := do(s.waiter, "CLIENT", "ID")
	if err != nil {
		return err
	}
	id, _ := idReply.(int64)
	type result struct {
		reply interface{}
		err   error
	}
	done := make(chan result, 1)
	started := time.Now()
	go func() {
		r, err := do(s.waiter, "SEM.ACQUIRE", s.ns, "pool", s.waiterID, 1, int(parkTimeout/time.Second))
		done <- result{r, err}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for !s.isParked(id) {
		if time.Now().After(deadline) {
			return fmt.Errorf("CLIENT LIST never showed the acquire parked")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	releasedAt := time.Now()
	if _, err := do(s.main, "SEM.RELEASE", s.ns, "pool", s.holder); err != nil {
		return err
	}
	got := <-done
	woken := time.Since(releasedAt)
	if got.err != nil {
		return fmt.Errorf("parked acquire: %v", got.err)
	}
	if s.parkedToken, err = s.acquired(got.reply, "woken acquire"); err != nil {
		return err
	}
	if woken >= 2*time.Second || time.Since(started) < 200*time.Millisecond {
		return fmt.Errorf("woken %v after the release, %v after the call", woken, time.Since(started))
	}
	if s.parkedToken <= t0 {
		return fmt.Errorf("token %d not above %d", s.parkedToken, t0)
	}
	return nil
}

func (s *session) holders() error {
	page, err := doMap(s.main, "SEM.HOLDERS", s.ns, "pool")
	if err != nil {
		return err
	}
	list, _ := page["holders"].([]interface{})
	if len(list) != 1 {
		return fmt.Errorf("holders: %v", page["holders"])
	}
	h, err := asMap(list[0])
	if err != nil {
		return err
	}
	if h["lease_id"] != s.waiterID || h["process_id"] != "waiter" || h["weight"] != int64(1) || h["fencing_token"] != s.parkedToken {
		return fmt.Errorf("holder: %v", h)
	}
	if page["next_cursor"] != "" {
		return fmt.Errorf("next_cursor %v", page["next_cursor"])
	}
	return nil
}

// Queues every command on pipe and runs it; the replies in order.
func run(pipe *redis.Pipeline, cmds [][]interface{}) ([]interface{}, error) {
	queued := make([]*redis.Cmd, len(cmds))
	for i, args := range cmds {
		queued[i] = redis.NewCmd(args...)
		pipe.Process(queued[i])
	}
	if _, err := pipe.Exec(); err != nil {
		return nil, err
	}
	replies := make([]interface{}, len(cmds))
	for i, cmd := range queued {
		replies[i] = cmd.Val()
	}
	return replies, nil
}

func (s *session) pipeline() error {
	res, err := run(s.main.Pipeline(), [][]interface{}{
		{"LEASE.REFRESH", s.ns, s.holder, 30},
		{"SEM.ACQUIRE", s.ns, "pool", s.holder, 1, 0},
		{"SEM.RELEASE", s.ns, "pool", s.waiterID},
		{"SEM.ACQUIRE", s.ns, "pool", s.holder, 1, 0},
		{"SEM.HOLDERS", s.ns, "pool"},
	})
	if err != nil {
		return err
	}
	refreshed, _ := asMap(res[0])
	unavailable, _ := asMap(res[1])
	released, _ := asMap(res[2])
	if refreshed["lease_id"] != s.holder || unavailable["outcome"] != "ACQUIRE_OUTCOME_UNAVAILABLE" || released["active_holds"] != int64(0) {
		return fmt.Errorf("replies: %v", res[:3])
	}
	again, err := s.acquired(res[3], "pipelined acquire")
	if err != nil {
		return err
	}
	page, _ := asMap(res[4])
	list, _ := page["holders"].([]interface{})
	if again <= s.parkedToken || len(list) != 1 {
		return fmt.Errorf("token %d, holders %v", again, page["holders"])
	}
	return nil
}

func (s *session) multi() error {
	res, err := run(s.main.TxPipeline(), [][]interface{}{
		{"SEM.ACQUIRE", s.ns, "a", s.holder, 1, 0},
		{"SEM.ACQUIRE", s.ns, "b", s.holder, 1, 0},
		{"SEM.GET", s.ns, "a"},
	})
	if err != nil {
		return err
	}
	ta, err := s.acquired(res[0], "MULTI token a")
	if err != nil {
		return err
	}
	tb, err := s.acquired(res[1], "MULTI token b")
	if err != nil {
		return err
	}
	if ta == tb {
		return fmt.Errorf("two acquires in one MULTI got the same token %d", ta)
	}
	if sem, _ := asMap(res[2]); sem["active_holds"] != int64(1) {
		return fmt.Errorf("SEM.GET: %v", sem)
	}
	return nil
}

func (s *session) crossSlot() error {
	_, err := run(s.main.TxPipeline(), [][]interface{}{
		{"SEM.CREATE", s.ns, "x", 1},
		{"SEM.CREATE", s.other, "y", 1},
	})
	if err == nil || !strings.HasPrefix(err.Error(), "CROSSSLOT ") {
		return fmt.Errorf("EXEC: %v", err)
	}
	for _, key := range [][]string{{s.ns, "x"}, {s.other, "y"}} {
		if _, err := do(s.main, "SEM.GET", key[0], key[1]); err == nil || !strings.HasPrefix(err.Error(), "NOTFOUND ") {
			return fmt.Errorf("SEM.GET %s %s after the refused EXEC: %v", key[0], key[1], err)
		}
	}
	return nil
}

func (s *session) info() error {
	reply, err := do(s.main, "INFO")
	if err != nil {
		return err
	}
	info := fmt.Sprint(reply)
	for _, want := range []string{"redis_version:", "# Semaphores\r\n", "\r\nnamespaces:", "\r\nblocked_clients:"} {
		if !strings.Contains(info, want) {
			return fmt.Errorf("INFO has no %q", want)
		}
	}
	return nil
}

func (s *session) tokenRange() error {
	if len(s.tokens) < 5 {
		return fmt.Errorf("only %d tokens seen", len(s.tokens))
	}
	for _, t := range s.tokens {
		if t <= 0 || t >= two53 {
			return fmt.Errorf("token %d is not in 1..2^53", t)
		}
	}
	return nil
}

// Whether CLIENT LIST still shows connection id.
func (s *session) isConnected(id int64) bool {
	list, err := do(s.main, "CLIENT", "LIST")
	return err != nil || strings.Contains("\n"+fmt.Sprint(list), fmt.Sprintf("\nid=%d ", id))
}

// go-redis's default ReadTimeout (3 s) gives up on a 5 s acquire and closes its connection;
// the server drops the waiter with it, so the release that follows grants nothing.
func (s *session) defaultReadTimeout(addr, password string) error {
	impatient := redis.NewClient(&redis.Options{Addr: addr, Password: password, PoolSize: 1})
	defer impatient.Close()
	idReply, err := do(impatient, "CLIENT", "ID")
	if err != nil {
		return err
	}
	id, _ := idReply.(int64)
	started := time.Now()
	_, err = do(impatient, "SEM.ACQUIRE", s.ns, "pool", s.waiterID, 1, int(parkTimeout/time.Second))
	took := time.Since(started)
	if err == nil || !strings.Contains(err.Error(), "i/o timeout") {
		return fmt.Errorf("expected an i/o timeout, got %v", err)
	}
	if took < 2900*time.Millisecond || took > 4500*time.Millisecond {
		return fmt.Errorf("gave up after %v, not 3 s", took)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.isConnected(id) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the timed-out connection is still open")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := do(s.main, "SEM.RELEASE", s.ns, "pool", s.holder); err != nil {
		return err
	}
	time.Sleep(100 * time.Millisecond)
	page, err := doMap(s.main, "SEM.HOLDERS", s.ns, "pool")
	if err != nil {
		return err
	}
	if list, _ := page["holders"].([]interface{}); len(list) != 0 {
		return fmt.Errorf("the dropped waiter was granted: %v", page["holders"])
	}
	return nil
}

// go-redis v5 reads COMMAND entries of 6 fields and CLUSTER SLOTS nodes of 2 or 3; Redis 7
// answers 10 and 4, and so does permitd. Its ClusterClient therefore never loads a slot map:
// every command goes to a random node and a TxPipeline fails. These are the errors it gives.
func clusterClientPredatesRedis7(addr, password string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, Password: password})
	defer c.Close()
	if _, err := c.Command().Result(); err == nil || err.Error() != "redis: got 10 elements in COMMAND reply, wanted 6" {
		return fmt.Errorf("COMMAND: %v", err)
	}
	if _, err := c.ClusterSlots().Result(); err == nil || err.Error() != "got 4 elements in cluster info address, expected 2 or 3" {
		return fmt.Errorf("CLUSTER SLOTS: %v", err)
	}
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, Password: password})
	defer cluster.Close()
	tx := cluster.TxPipeline()
	tx.Ping()
	if _, err := tx.Exec(); err == nil || err.Error() != "redis: cannot load cluster slots" {
		return fmt.Errorf("ClusterClient TxPipeline: %v", err)
	}
	return nil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintf(os.Stderr, "usage: %s HOST:PORT\n", os.Args[0])
		os.Exit(2)
	}
	addr, password := os.Args[1], os.Getenv("PERMITD_PASSWORD")
	client := func(poolSize int) *redis.Client {
		return redis.NewClient(&redis.Options{Addr: addr, Password: password, ReadTimeout: readTimeout, PoolSize: poolSize})
	}
	ns := fmt.Sprintf("go-%x", time.Now().UnixNano())
	// the waiter has one connection: CLIENT ID names the one that parks
	s := &session{main: client(10), waiter: client(1), ns: ns, other: ns + "-other"}
	defer s.main.Close()
	defer s.waiter.Close()

	fmt.Println("# gopkg.in/redis.v5, RESP2")
	if step("NS.CREATE, SEM.CREATE, LEASE.CREATE (64-bit timestamps exact)", s.create) {
		step("an acquire parks (timeout 5 s) and is woken by SEM.RELEASE on another connection", s.parkAndWake)
		step("SEM.HOLDERS lists the woken holder with its token", s.holders)
		step("a pipeline: replies in order", s.pipeline)
		step("TxPipeline (MULTI/EXEC): two acquires on two semaphores, tokens differ as int64", s.multi)
		step("TxPipeline across two namespaces: EXEC answers CROSSSLOT and nothing runs", s.crossSlot)
		step("INFO: redis_version and the # Semaphores counts", s.info)
		step("every fencing token seen is below 2^53", s.tokenRange)
		step("the default ReadTimeout (3 s) cuts a 5 s acquire, and the server drops that waiter",
			func() error { return s.defaultReadTimeout(addr, password) })
	}
	step("ClusterClient: go-redis v5 cannot parse Redis 7's COMMAND and CLUSTER SLOTS (not supported)",
		func() error { return clusterClientPredatesRedis7(addr, password) })
	do(s.main, "NS.DELETE", s.ns)
	do(s.main, "NS.DELETE", s.other)
	fmt.Printf("%d passed, %d failed\n", passed, failed)
	if failed > 0 {
		os.Exit(1)
	}
}
