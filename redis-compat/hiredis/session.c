/* redis-compat/hiredis/session.c: one whole permitd session through Debian's libhiredis
 * (0.14, RESP2 only: its reader knows no RESP3 types), with its blocking API.
 *
 *   session HOST PORT
 *
 * NS.CREATE, SEM.CREATE, LEASE.CREATE; an acquire that parks on a second connection (sent with
 * redisAppendCommand, its reply read later) and is woken by a SEM.RELEASE on the first;
 * SEM.HOLDERS; a pipeline; MULTI/EXEC with two acquires on two semaphores, whose tokens must
 * differ as the long long integers hiredis hands over; a MULTI across two namespaces
 * (CROSSSLOT, nothing runs); INFO; every token below 2^53. Prints "ok - step" or
 * "FAIL - step: why" per step and "N passed, M failed" last; exits non-zero on any failure.
 * PERMITD_PASSWORD, when set, is sent with AUTH on each connection. */
#include <hiredis/hiredis.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define PARK_TIMEOUT_S 5
/* hiredis has no read timeout unless given one; this one is above the parked acquire's. */
#define READ_TIMEOUT_S (PARK_TIMEOUT_S + 10)
#define TWO_53 9007199254740992LL
#define MAX_TOKENS 16

static int passed, failed;
static char why[512];
static long long tokens[MAX_TOKENS];
static int ntokens;

/* Records why the current step fails; returns 0 so a step can `return fail(...)`. */
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return 0;
}

static void step(const char *name, int ok) {
    if (ok) {
        passed++;
        printf("ok - %s\n", name);
    } else {
        failed++;
        printf("FAIL - %s: %s\n", name, why);
    }
    fflush(stdout);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static redisContext *connect_to(const char *host, int port) {
    struct timeval tv = {READ_TIMEOUT_S, 0};
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    if (c == NULL || c->err) {
        fprintf(stderr, "cannot connect to %s:%d: %s\n", host, port, c ? c->errstr : "out of memory");
        exit(1);
    }
    redisSetTimeout(c, tv);
    const char *password = getenv("PERMITD_PASSWORD");
    if (password && *password) {
        redisReply *r = redisCommand(c, "AUTH %s", password);
        if (r == NULL || r->type == REDIS_REPLY_ERROR) {
            fprintf(stderr, "AUTH failed: %s\n", r ? r->str : c->errstr);
            exit(1);
        }
        freeReplyObject(r);
    }
    return c;
}

/* The value of `name` in a RESP2 map reply (a flat array name, value, ...), or NULL. */
static redisReply *field(redisReply *map, const char *name) {
    if (map == NULL || map->type != REDIS_REPLY_ARRAY) return NULL;
    for (size_t i = 0; i + 1 < map->elements; i += 2) {
        redisReply *k = map->element[i];
        if (k->type == REDIS_REPLY_STRING && strcmp(k->str, name) == 0) return map->element[i + 1];
    }
    return NULL;
}

static int is_str(redisReply *r, const char *want) {
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) && strcmp(r->str, want) == 0;
}

static int is_int(redisReply *r, long long want) {
    return r && r->type == REDIS_REPLY_INTEGER && r->integer == want;
}

static const char *describe(redisReply *r) {
    static char buf[256];
    if (r == NULL) return "no reply";
    switch (r->type) {
    case REDIS_REPLY_ERROR: snprintf(buf, sizeof buf, "error %s", r->str); break;
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS: snprintf(buf, sizeof buf, "\"%.200s\"", r->str); break;
    case REDIS_REPLY_INTEGER: snprintf(buf, sizeof buf, "%lld", r->integer); break;
    case REDIS_REPLY_ARRAY: snprintf(buf, sizeof buf, "array of %zu", r->elements); break;
    default: snprintf(buf, sizeof buf, "reply type %d", r->type);
    }
    return buf;
}

/* An ACQUIRED reply's fencing token (recorded for the range check), or -1. */
static long long acquired_token(redisReply *r) {
    if (!is_str(field(r, "outcome"), "ACQUIRE_OUTCOME_ACQUIRED")) return -1;
    redisReply *t = field(r, "fencing_token");
    if (t == NULL || t->type != REDIS_REPLY_INTEGER) return -1;
    if (ntokens < MAX_TOKENS) tokens[ntokens++] = t->integer;
    return t->integer;
}

/* CLIENT LIST on `c` shows connection `id` parked: flags=b, cmd=sem.acquire. */
static int is_parked(redisContext *c, long long id) {
    char prefix[32], *save = NULL;
    int parked = 0;
    snprintf(prefix, sizeof prefix, "id=%lld ", id);
    redisReply *r = redisCommand(c, "CLIENT LIST");
    if (r && r->type == REDIS_REPLY_STRING) {
        for (char *line = strtok_r(r->str, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
            if (strncmp(line, prefix, strlen(prefix)) == 0)
                parked = strstr(line, " flags=b ") && strstr(line, " cmd=sem.acquire ");
    }
    freeReplyObject(r);
    return parked;
}

/* Queues one command given as space-separated words (no name here contains a space). */
static void append(redisContext *c, const char *fmt, ...) {
    char line[512], *save = NULL, *argv[16];
    int argc = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    for (char *w = strtok_r(line, " ", &save); w && argc < 16; w = strtok_r(NULL, " ", &save)) argv[argc++] = w;
    redisAppendCommandArgv(c, argc, (const char **)argv, NULL);
}

static char ns[64], other[64], holder[64], waiter[64];
static long long parked_token;

static int create(redisContext *c) {
    redisReply *r = redisCommand(c, "NS.CREATE %s DESC %s", ns, "redis-compat hiredis");
    int ok = is_str(field(r, "name"), ns) && is_int(field(r, "version"), 1);
    if (!ok) return fail("NS.CREATE: %s", describe(r));
    freeReplyObject(r);
    freeReplyObject(redisCommand(c, "NS.CREATE %s", other));
    const char *sems[] = {"pool", "a", "b"};
    for (int i = 0; i < 3; i++) {
        r = redisCommand(c, "SEM.CREATE %s %s 1", ns, sems[i]);
        ok = is_int(field(r, "permits"), 1) && is_int(field(r, "active_holds"), 0);
        if (!ok) return fail("SEM.CREATE %s: %s", sems[i], describe(r));
        freeReplyObject(r);
    }
    const char *pids[] = {"holder", "waiter"};
    char *ids[] = {holder, waiter};
    for (int i = 0; i < 2; i++) {
        r = redisCommand(c, "LEASE.CREATE %s %s 30", ns, pids[i]);
        redisReply *id = field(r, "lease_id");
        redisReply *created = field(r, "created_at"), *expires = field(r, "expires_at");
        if (id == NULL || id->type != REDIS_REPLY_STRING || strncmp(id->str, "ls_", 3) != 0 || strlen(id->str) != 31)
            return fail("LEASE.CREATE: %s", describe(r));
        /* 64-bit integers arrive exact: the ttl is exactly 30 s in nanoseconds */
        if (created == NULL || expires == NULL || expires->integer - created->integer != 30000000000LL)
            return fail("expires_at - created_at is not 30e9");
        snprintf(ids[i], 64, "%s", id->str);
        freeReplyObject(r);
    }
    return 1;
}

static int park_and_wake(redisContext *c, redisContext *w) {
    redisReply *r = redisCommand(c, "SEM.ACQUIRE %s pool %s 1 0", ns, holder);
    long long first = acquired_token(r);
    if (first < 0) return fail("first acquire: %s", describe(r));
    freeReplyObject(r);

    r = redisCommand(w, "CLIENT ID");
    long long id = r ? r->integer : -1;
    freeReplyObject(r);
    double started = now_s();
    append(w, "SEM.ACQUIRE %s pool %s 1 %d", ns, waiter, PARK_TIMEOUT_S);
    int done;
    if (redisBufferWrite(w, &done) != REDIS_OK) return fail("sending the acquire: %s", w->errstr);
    int parked = 0;
    for (int i = 0; i < 250 && !(parked = is_parked(c, id)); i++) usleep(20000);
    if (!parked) return fail("CLIENT LIST never showed the acquire parked");
    usleep(200000);
    double released_at = now_s();
    r = redisCommand(c, "SEM.RELEASE %s pool %s", ns, holder);
    if (!is_str(field(r, "name"), "pool")) return fail("SEM.RELEASE: %s", describe(r));
    freeReplyObject(r);

    redisReply *got = NULL;
    if (redisGetReply(w, (void **)&got) != REDIS_OK) return fail("reading the parked reply: %s", w->errstr);
    double woken = now_s() - released_at, waited = now_s() - started;
    parked_token = acquired_token(got);
    if (parked_token < 0) return fail("parked acquire: %s", describe(got));
    freeReplyObject(got);
    if (woken >= 2.0) return fail("woken %.2f s after the release", woken);
    if (waited < 0.2) return fail("answered after %.2f s: it did not wait", waited);
    if (parked_token <= first) return fail("token %lld not above %lld", parked_token, first);
    return 1;
}

static int holders(redisContext *c) {
    redisReply *r = redisCommand(c, "SEM.HOLDERS %s pool", ns);
    redisReply *list = field(r, "holders");
    if (list == NULL || list->type != REDIS_REPLY_ARRAY || list->elements != 1) return fail("SEM.HOLDERS: %s", describe(r));
    redisReply *h = list->element[0];
    if (!is_str(field(h, "lease_id"), waiter) || !is_str(field(h, "process_id"), "waiter") ||
        !is_int(field(h, "weight"), 1) || !is_int(field(h, "fencing_token"), parked_token))
        return fail("holder fields differ from the woken acquire");
    if (!is_str(field(r, "next_cursor"), "")) return fail("next_cursor not empty");
    freeReplyObject(r);
    return 1;
}

static int pipeline(redisContext *c) {
    append(c, "LEASE.REFRESH %s %s 30", ns, holder);
    append(c, "SEM.ACQUIRE %s pool %s 1 0", ns, holder);
    append(c, "SEM.RELEASE %s pool %s", ns, waiter);
    append(c, "SEM.ACQUIRE %s pool %s 1 0", ns, holder);
    append(c, "SEM.HOLDERS %s pool", ns);
    redisReply *res[5] = {0};
    for (int i = 0; i < 5; i++)
        if (redisGetReply(c, (void **)&res[i]) != REDIS_OK) return fail("reply %d: %s", i, c->errstr);
    int ok = is_str(field(res[0], "lease_id"), holder) &&
             is_str(field(res[1], "outcome"), "ACQUIRE_OUTCOME_UNAVAILABLE") &&
             is_int(field(res[2], "active_holds"), 0);
    long long again = acquired_token(res[3]);
    redisReply *list = field(res[4], "holders");
    ok = ok && again > parked_token && list && list->elements == 1 && is_str(field(list->element[0], "lease_id"), holder);
    if (!ok) fail("replies out of order or wrong: %s / %s / %s / %s / %s", describe(res[0]), describe(res[1]),
                  describe(res[2]), describe(res[3]), describe(res[4]));
    for (int i = 0; i < 5; i++) freeReplyObject(res[i]);
    return ok;
}

/* Reads the replies of `n` queued commands, keeping the last (the caller frees it). */
static redisReply *last_of(redisContext *c, int n) {
    redisReply *r = NULL;
    for (int i = 0; i < n; i++) {
        freeReplyObject(r);
        r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) return NULL;
    }
    return r;
}

static int multi(redisContext *c) {
    append(c, "MULTI");
    append(c, "SEM.ACQUIRE %s a %s 1 0", ns, holder);
    append(c, "SEM.ACQUIRE %s b %s 1 0", ns, holder);
    append(c, "SEM.GET %s a", ns);
    append(c, "EXEC");
    redisReply *r = last_of(c, 5);
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 3) return fail("EXEC: %s", describe(r));
    long long ta = acquired_token(r->element[0]), tb = acquired_token(r->element[1]);
    int ok = ta > 0 && tb > 0 && ta != tb && is_int(field(r->element[2], "active_holds"), 1);
    if (!ok) fail("tokens %lld and %lld, SEM.GET %s", ta, tb, describe(r->element[2]));
    freeReplyObject(r);
    return ok;
}

static int crossslot(redisContext *c) {
    append(c, "MULTI");
    append(c, "SEM.CREATE %s x 1", ns);
    append(c, "SEM.CREATE %s y 1", other);
    append(c, "EXEC");
    redisReply *r = last_of(c, 4);
    if (r == NULL || r->type != REDIS_REPLY_ERROR || strncmp(r->str, "CROSSSLOT ", 10) != 0)
        return fail("EXEC: %s", describe(r));
    freeReplyObject(r);
    const char *names[] = {ns, other}, *sems[] = {"x", "y"};
    for (int i = 0; i < 2; i++) {
        r = redisCommand(c, "SEM.GET %s %s", names[i], sems[i]);
        int ok = r && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOTFOUND ", 9) == 0;
        if (!ok) return fail("SEM.GET %s %s after the refused EXEC: %s", names[i], sems[i], describe(r));
        freeReplyObject(r);
    }
    return 1;
}

static int info(redisContext *c) {
    redisReply *r = redisCommand(c, "INFO");
    int ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "redis_version:") &&
             strstr(r->str, "# Semaphores\r\n") && strstr(r->str, "\r\nnamespaces:") && strstr(r->str, "\r\nblocked_clients:");
    if (!ok) fail("INFO: %s", describe(r));
    freeReplyObject(r);
    return ok;
}

static int token_range(void) {
    if (ntokens < 5) return fail("only %d tokens seen", ntokens);
    for (int i = 0; i < ntokens; i++)
        if (tokens[i] <= 0 || tokens[i] >= TWO_53) return fail("token %lld is not in 1..2^53", tokens[i]);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s HOST PORT\n", argv[0]);
        return 2;
    }
    redisContext *c = connect_to(argv[1], atoi(argv[2]));
    redisContext *w = connect_to(argv[1], atoi(argv[2]));
    unsigned long tag = (unsigned long)getpid() ^ (unsigned long)time(NULL);
    snprintf(ns, sizeof ns, "hiredis-%lx", tag);
    snprintf(other, sizeof other, "hiredis-%lx-other", tag);
    printf("# hiredis %d.%d.%d, RESP2\n", HIREDIS_MAJOR, HIREDIS_MINOR, HIREDIS_PATCH);

    int created = create(c);
    step("NS.CREATE, SEM.CREATE, LEASE.CREATE (64-bit timestamps exact)", created);
    if (created) {
        step("an acquire parks (timeout 5 s) and is woken by SEM.RELEASE on another connection", park_and_wake(c, w));
        step("SEM.HOLDERS lists the woken holder with its token", holders(c));
        step("a pipeline: replies in order", pipeline(c));
        step("MULTI/EXEC: two acquires on two semaphores, tokens differ as long long", multi(c));
        step("MULTI across two namespaces: EXEC answers CROSSSLOT and nothing runs", crossslot(c));
        step("INFO: redis_version and the # Semaphores counts", info(c));
        step("every fencing token seen is below 2^53", token_range());
    }
    freeReplyObject(redisCommand(c, "NS.DELETE %s", ns));
    freeReplyObject(redisCommand(c, "NS.DELETE %s", other));
    redisFree(c);
    redisFree(w);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
