/* server/store/store_redis.c: the pure parts (the --session-store URL and its
 * redaction, key names, the metadata fields, versions) always; the backend
 * against a real redis-server on a loopback port when one is installed
 * (Debian's redis-server, scripts/deps.sh; without it those tests say they
 * were skipped): versions and stale saves, leases (busy, renewed past their
 * time, released, taken over from a queued release), delete, peek, lists
 * with owners and expired sessions, the server going away (EUNAVAIL at once,
 * health with the reason, back after a restart), and a full server
 * (ENOSPACE). */
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "server/store/store.h"
#include "server/store/store_backend.h"
#include "server/store/store_redis_test.h"

/* The detail of the last store call that failed on the main thread (the
 * threads a test starts pass their own buffer or none). */
static char last_err[SRV_STORE_ERR_MAX];
#define ERR last_err, sizeof last_err

#define ID1 "0123456789abcdef0123456789abcdef"
#define ID2 "1123456789abcdef0123456789abcdef"
#define ID3 "2123456789abcdef0123456789abcdef"
#define OWNER "abcdefabcdefabcdefabcdefabcdef01"

/* ---- pure parts ---- */

TEST(url_parse)
{
    srv_store_redis_url_t u;
    char err[512];
    CHECK_INT_EQ(srv_store_redis_url_parse("redis://127.0.0.1:6390/3", &u, err, sizeof err), 0);
    CHECK_STR_EQ(u.host, "127.0.0.1");
    CHECK_INT_EQ(u.port, 6390);
    CHECK_INT_EQ(u.db, 3);
    CHECK_STR_EQ(u.password, "");
    CHECK_INT_EQ(srv_store_redis_url_parse("redis://redis", &u, err, sizeof err), 0);
    CHECK_STR_EQ(u.host, "redis");
    CHECK_INT_EQ(u.port, 6379);
    CHECK_INT_EQ(u.db, 0);
    CHECK_INT_EQ(srv_store_redis_url_parse("redis://redis.svc.local:1/", &u, err, sizeof err), 0);
    CHECK_INT_EQ(u.port, 1);
    CHECK_INT_EQ(srv_store_redis_url_parse("redis://[::1]:7000/0", &u, err, sizeof err), 0);
    CHECK_STR_EQ(u.host, "::1");
    CHECK_INT_EQ(u.port, 7000);
    CHECK_INT_EQ(srv_store_redis_url_parse("redis://:p%40ss@h:6379/1", &u, err, sizeof err), 0);
    CHECK_STR_EQ(u.user, "");
    CHECK_STR_EQ(u.password, "p@ss");
    CHECK_STR_EQ(u.host, "h");
    CHECK_INT_EQ(srv_store_redis_url_parse("redis://app:pw@h", &u, err, sizeof err), 0);
    CHECK_STR_EQ(u.user, "app");
    CHECK_STR_EQ(u.password, "pw");
    static const struct {
        const char *url, *says;
    } bad[] = {
        {"", "empty"},
        {"h:6379", "unknown session store"},
        {"redis:/h", "unknown session store"},
        {"rediss://h", "TLS"},
        {"redis://", "no host"},
        {"redis://:1/0", "no host"},
        {"redis://h:/0", "port"},
        {"redis://h:0", "port"},
        {"redis://h:65536", "port"},
        {"redis://h:123456", "port"},
        {"redis://h:-1", "port"},
        {"redis://h/0x", "database"},
        {"redis://h/1000001", "database"},
        {"redis://h/0/1", "database"},
        {"redis://h/0?timeout=1", "query"},
        {"redis://h/0#x", "query"},
        {"redis://pw@h", "credentials"},
        {"redis://u:@h", "empty password"},
        {"redis://:%zz@h", "malformed"},
        {"redis://:%00@h", "malformed"},
        {"redis://h\x01/0", "non-ASCII"},
        {"redis://h st", "space"},
        {"redis://[::1", "IPv6"},
        {"redis://[]:1", "IPv6"},
        {"redis://[::g]:1", "IPv6"},
        {"redis://[::1]x", "after the IPv6"},
        {"redis://h$x", "malformed host"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        CHECK_MSG(srv_store_redis_url_parse(bad[i].url, &u, err, sizeof err) < 0, "%s accepted",
                  bad[i].url);
        CHECK_MSG(strstr(err, bad[i].says) != NULL, "%s: '%s' lacks '%s'", bad[i].url, err,
                  bad[i].says);
        CHECK_MSG(bad[i].url[0] == '\0' || strstr(err, "expected redis://") ||
                      strstr(err, "longer than"),
                  "%s: '%s' does not say what is expected", bad[i].url, err);
    }
    /* a host name too long; NULL */
    char longu[400];
    snprintf(longu, sizeof longu, "redis://%0300d", 0);
    CHECK(srv_store_redis_url_parse(longu, &u, err, sizeof err) < 0 && strstr(err, "longer"));
    CHECK(srv_store_redis_url_parse(NULL, &u, err, sizeof err) < 0);
    /* messages never show a password */
    CHECK(srv_store_redis_url_parse("redis://u:topsecret@h:0", &u, err, sizeof err) < 0);
    CHECK_MSG(!strstr(err, "topsecret") && strstr(err, "u:***@h"), "%s", err);
    CHECK(srv_store_redis_url_parse("redis://topsecret@h", &u, err, sizeof err) < 0);
    CHECK_MSG(!strstr(err, "topsecret"), "%s", err);
}

TEST(url_redact)
{
    char out[128];
    srv_store_redis_url_redact("redis://h:1/0", out, sizeof out);
    CHECK_STR_EQ(out, "redis://h:1/0");
    srv_store_redis_url_redact("redis://:pw@h:1/0", out, sizeof out);
    CHECK_STR_EQ(out, "redis://:***@h:1/0");
    srv_store_redis_url_redact("redis://user:pw@h", out, sizeof out);
    CHECK_STR_EQ(out, "redis://user:***@h");
    srv_store_redis_url_redact("redis://pw@h/2", out, sizeof out);
    CHECK_STR_EQ(out, "redis://***@h/2");
    srv_store_redis_url_redact("rediss://a:b@c", out, sizeof out);
    CHECK_STR_EQ(out, "rediss://a:***@c");
    srv_store_redis_url_redact(NULL, out, sizeof out);
    CHECK_STR_EQ(out, "");
    srv_store_redis_url_redact("redis://:pw@h", out, 4);
    CHECK_STR_EQ(out, "red");
}

TEST(keys_and_namespace)
{
    char ns[64], k[160];
    srv_store_redis_namespace("fp-of-a-model", ns, sizeof ns);
    CHECK_INT_EQ(strlen(ns), strlen("darkserve:") + 16 + 1);
    CHECK(strncmp(ns, "darkserve:", 10) == 0 && ns[strlen(ns) - 1] == ':');
    char ns2[64];
    srv_store_redis_namespace("fp-of-another-model", ns2, sizeof ns2);
    CHECK(strcmp(ns, ns2) != 0);
    srv_store_redis_namespace("fp-of-a-model", ns2, sizeof ns2);
    CHECK_STR_EQ(ns, ns2);
    CHECK_INT_EQ(srv_store_redis_key("darkserve:x:", 's', ID1, k, sizeof k),
                 (int)strlen("darkserve:x:s:" ID1));
    CHECK_STR_EQ(k, "darkserve:x:s:" ID1);
    CHECK(srv_store_redis_key("darkserve:x:", 'l', ID1, k, sizeof k) > 0);
    CHECK_STR_EQ(k, "darkserve:x:l:" ID1);
    CHECK_INT_EQ(srv_store_redis_key("darkserve:x:", 'q', ID1, k, sizeof k), -1);
    CHECK_INT_EQ(srv_store_redis_key("darkserve:x:", 's', "ABC", k, sizeof k), -1);
    CHECK_INT_EQ(srv_store_redis_key("darkserve:x:", 's', ID1 "0", k, sizeof k), -1);
    CHECK_INT_EQ(srv_store_redis_key("darkserve:x:", 's', ID1, k, 20), -1); /* no room */
}

TEST(meta_round_trip)
{
    srv_store_meta_t m;
    memset(&m, 0, sizeof m); /* padding too: compared with memcmp */
    snprintf(m.owner, sizeof m.owner, "%s", OWNER);
    m.created = 1700000000;
    m.last_used = 1700000099;
    m.tokens = 123456789012LL;
    m.turns = 7;
    m.pending_grammar = -1;
    m.state_bytes = 15621224;
    char buf[SRV_STORE_REDIS_META_FIELDS][32 + SRV_SESSION_OWNER_LEN];
    srv_store_redis_meta_encode(&m, buf);
    const char *v[SRV_STORE_REDIS_META_FIELDS];
    size_t l[SRV_STORE_REDIS_META_FIELDS];
    for (int i = 0; i < SRV_STORE_REDIS_META_FIELDS; i++) {
        v[i] = buf[i];
        l[i] = strlen(buf[i]);
    }
    srv_store_meta_t back;
    CHECK_INT_EQ(srv_store_redis_meta_decode(v, l, &back), 0);
    CHECK(memcmp(&m, &back, sizeof m) == 0);
    CHECK_STR_EQ(srv_store_redis_meta_names[0], "owner");
    CHECK_STR_EQ(srv_store_redis_meta_names[6], "bytes");
    /* no owner, a pending grammar */
    m.owner[0] = '\0';
    m.pending_grammar = 12;
    srv_store_redis_meta_encode(&m, buf);
    l[0] = 0;
    l[5] = strlen(buf[5]);
    CHECK_INT_EQ(srv_store_redis_meta_decode(v, l, &back), 0);
    CHECK_STR_EQ(back.owner, "");
    CHECK_INT_EQ(back.pending_grammar, 12);
    /* what does not decode */
    static const struct {
        int field;
        const char *val;
    } bad[] = {{0, "XYZ"}, {0, OWNER "0"}, {1, ""},   {1, "12a"}, {2, "1.5"},
               {3, "-5"},  {4, "-1"},      {5, "-2"}, {6, "-1"},  {6, "99999999999999999999999"},
               {3, " 1"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        srv_store_redis_meta_encode(&m, buf);
        const char *vv[SRV_STORE_REDIS_META_FIELDS];
        size_t ll[SRV_STORE_REDIS_META_FIELDS];
        for (int f = 0; f < SRV_STORE_REDIS_META_FIELDS; f++) {
            vv[f] = buf[f];
            ll[f] = strlen(buf[f]);
        }
        vv[bad[i].field] = bad[i].val;
        ll[bad[i].field] = strlen(bad[i].val);
        CHECK_MSG(srv_store_redis_meta_decode(vv, ll, &back) < 0, "field %d = '%s' accepted",
                  bad[i].field, bad[i].val);
    }
    const char *vv[SRV_STORE_REDIS_META_FIELDS] = {NULL};
    size_t ll[SRV_STORE_REDIS_META_FIELDS] = {0};
    CHECK(srv_store_redis_meta_decode(vv, ll, &back) < 0); /* missing fields */
}

TEST(version_parse)
{
    uint64_t v = 0;
    CHECK_INT_EQ(srv_store_redis_version_parse("1", 1, &v), 0);
    CHECK_INT_EQ(v, 1);
    CHECK_INT_EQ(srv_store_redis_version_parse("9007199254740993", 16, &v), 0);
    CHECK(v == UINT64_C(9007199254740993));
    CHECK_INT_EQ(srv_store_redis_version_parse("0", 1, &v), -1); /* versions start at 1 */
    CHECK_INT_EQ(srv_store_redis_version_parse("-3", 2, &v), -1);
    CHECK_INT_EQ(srv_store_redis_version_parse("", 0, &v), -1);
    CHECK_INT_EQ(srv_store_redis_version_parse("12x", 3, &v), -1);
    CHECK_INT_EQ(srv_store_redis_version_parse(NULL, 0, &v), -1);
    CHECK_INT_EQ(srv_store_redis_version_parse("1e3", 3, &v), -1);
}

/* ---- against redis-server ---- */

static char tmpdir[64];
static int port;
static pid_t redis_pid = -1;

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    int p = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &n) == 0)
        p = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return p;
}

static redisContext *raw(void)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c && c->err) {
        redisFree(c);
        return NULL;
    }
    return c;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* Starts redis-server on port (AOF in tmpdir, not fsynced); 0, or -1 when
 * it is not installed or does not come up. */
static int redis_start(void)
{
    if (system("command -v redis-server >/dev/null 2>&1") != 0)
        return -1;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    pid_t p = fork();
    if (p == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) {
            dup2(devnull, 1);
            dup2(devnull, 2);
        }
        /* AOF written to the kernel at every command (a kill -9 of the
         * server loses nothing), never fsynced: on a shared machine an fsync
         * can stall Redis for seconds, longer than the leases these tests
         * time (test_scaleout runs the fsync-always setup) */
        execlp("redis-server", "redis-server", "--port", ps, "--bind", "127.0.0.1", "--dir", tmpdir,
               "--save", "", "--appendonly", "yes", "--appendfsync", "no", (char *)NULL);
        _exit(127);
    }
    if (p < 0)
        return -1;
    redis_pid = p;
    for (int i = 0; i < 100; i++) {
        redisContext *c = raw();
        if (c) {
            redisReply *r = redisCommand(c, "PING");
            int ok = r && r->type == REDIS_REPLY_STATUS;
            if (r)
                freeReplyObject(r);
            redisFree(c);
            if (ok)
                return 0;
        }
        sleep_ms(50);
    }
    return -1;
}

static void redis_stop(void)
{
    if (redis_pid > 0) {
        kill(redis_pid, SIGKILL);
        waitpid(redis_pid, NULL, 0);
        redis_pid = -1;
    }
}

static srv_store_backend_t *backend(int64_t ttl_ms, int64_t lease_ms)
{
    char url[64], err[256] = "";
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/0", port);
    srv_store_redis_opts_t o = {.url = url,
                                .ns = "darkserve:test:",
                                .ttl_ms = ttl_ms,
                                .lease_ms = lease_ms,
                                .timeout_ms = 2000};
    srv_store_backend_t *be = NULL;
    CHECK_MSG(srv_store_redis_new(&o, &be, err, sizeof err) == 0, "%s", err);
    return be;
}

static void meta(srv_store_meta_t *m, const char *owner, size_t bytes)
{
    memset(m, 0, sizeof *m);
    snprintf(m->owner, sizeof m->owner, "%s", owner);
    m->created = 1000;
    m->last_used = 2000;
    m->tokens = 42;
    m->turns = 3;
    m->pending_grammar = -1;
    m->state_bytes = bytes;
}

static void flushall(void)
{
    redisContext *c = raw();
    if (!c)
        return;
    redisReply *r = redisCommand(c, "FLUSHALL");
    if (r)
        freeReplyObject(r);
    redisFree(c);
}

#define LIVE()                                                                                     \
    do {                                                                                           \
        if (redis_pid < 0) {                                                                       \
            printf("skip %s: no redis-server (scripts/deps.sh installs it)\n", __func__);          \
            return;                                                                                \
        }                                                                                          \
        flushall();                                                                                \
    } while (0)

/* The lease's remaining time in ms (PTTL: -2 gone, -1 no expiry). */
static long long pttl(const char *key)
{
    redisContext *c = raw();
    redisReply *r = c ? redisCommand(c, "PTTL %s", key) : NULL;
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -3;
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    return v;
}

/* Waits (up to 10 s) until key is gone; 1 when it is. */
static int gone_soon(const char *key)
{
    for (int i = 0; i < 200; i++) {
        if (pttl(key) == -2)
            return 1;
        sleep_ms(50);
    }
    return 0;
}

TEST(versions_and_stale_saves)
{
    LIVE();
    srv_store_backend_t *a = backend(60000, 30000), *b = backend(60000, 30000);
    const srv_store_backend_ops_t *A = a->ops, *B = b->ops;
    char tok[SRV_STORE_TOKEN_MAX], tok2[SRV_STORE_TOKEN_MAX];
    uint64_t v = 0;
    unsigned char *blob = NULL;
    size_t len = 0;
    srv_store_meta_t m, got;
    CHECK_INT_EQ(A->acquire(a, ID1, 0, tok, &v, &blob, &len, ERR), SRV_STORE_ENOTFOUND);
    CHECK_INT_EQ(A->peek(a, ID1, &v, &got, ERR), SRV_STORE_ENOTFOUND);
    /* binary blob with NULs */
    unsigned char data[1000];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (unsigned char)(i * 7);
    meta(&m, OWNER, sizeof data);
    CHECK_INT_EQ(A->save(a, ID1, NULL, 0, data, sizeof data, &m, &v, ERR), 0);
    CHECK_INT_EQ(v, 1);
    CHECK_INT_EQ(A->save(a, ID1, NULL, 0, data, sizeof data, &m, &v, ERR), SRV_STORE_ESTALE);
    CHECK_INT_EQ(B->peek(b, ID1, &v, &got, ERR), 0);
    CHECK_INT_EQ(v, 1);
    CHECK(memcmp(&m, &got, sizeof m) == 0);
    /* b reads it (it holds nothing), a cannot acquire while b holds it */
    CHECK_INT_EQ(B->acquire(b, ID1, 0, tok, &v, &blob, &len, ERR), 0);
    CHECK_INT_EQ(v, 1);
    CHECK(blob && len == sizeof data && memcmp(blob, data, len) == 0);
    free(blob);
    blob = NULL;
    CHECK_INT_EQ(A->acquire(a, ID1, 1, tok2, &v, &blob, &len, ERR), SRV_STORE_EBUSY);
    CHECK_MSG(strstr(last_err, "another replica"), "%s", last_err);
    /* a's save while b holds the lease, at the right version: refused */
    CHECK_INT_EQ(A->save(a, ID1, NULL, 1, data, 10, &m, &v, ERR), SRV_STORE_ESTALE);
    /* b saves version 2 (the lease goes with it) */
    data[0] = 0xee;
    m.turns = 4;
    CHECK_INT_EQ(B->save(b, ID1, tok, 1, data, sizeof data, &m, &v, ERR), 0);
    CHECK_INT_EQ(v, 2);
    /* a held version 1: it gets the blob; holding 2 it would not */
    CHECK_INT_EQ(A->acquire(a, ID1, 1, tok2, &v, &blob, &len, ERR), 0);
    CHECK_INT_EQ(v, 2);
    CHECK(blob && blob[0] == 0xee);
    free(blob);
    blob = NULL;
    /* a stale writer (it read version 1): refused, and it says why */
    CHECK_INT_EQ(A->save(a, ID1, tok2, 1, data, sizeof data, &m, &v, ERR), SRV_STORE_ESTALE);
    CHECK_MSG(strstr(last_err, "version 2"), "%s", last_err);
    A->release(a, ID1, tok2);
    CHECK(gone_soon("darkserve:test:l:" ID1)); /* the keeper runs the release */
    CHECK_INT_EQ(B->acquire(b, ID1, 2, tok, &v, &blob, &len, ERR), 0);
    CHECK(blob == NULL); /* current */
    B->release(b, ID1, tok);
    /* an acquire right after this process's own release takes it over */
    CHECK_INT_EQ(B->acquire(b, ID1, 2, tok, &v, &blob, &len, ERR), 0);
    B->release(b, ID1, tok);
    CHECK_INT_EQ(B->acquire(b, ID1, 2, tok2, &v, &blob, &len, ERR), 0);
    /* also while the keeper is running that release (it takes its batch
     * off the queue before it reaches Redis): many times, to meet it */
    int busy = 0;
    for (int i = 0; i < 1000; i++) {
        char *hold = (i & 1) ? tok : tok2, *next = (i & 1) ? tok2 : tok;
        B->release(b, ID1, hold);
        if (i % 3 == 0)
            sleep_ms(0); /* let the keeper start */
        busy += B->acquire(b, ID1, 2, next, &v, &blob, &len, ERR) != 0;
        free(blob);
        blob = NULL;
        if (busy)
            break;
    }
    CHECK_INT_EQ(busy, 0);
    B->release(b, ID1, tok2); /* the last one (i = 999) acquired into tok2 */
    CHECK_INT_EQ(B->acquire(b, ID1, 2, tok2, &v, &blob, &len, ERR), 0);
    CHECK_INT_EQ(A->acquire(a, ID1, 2, tok, &v, &blob, &len, ERR), SRV_STORE_EBUSY);
    B->release(b, ID1, tok2);
    A->free(a);
    B->free(b);
}

/* A replica answers before its keeper has run the lease's release, so the
 * next request of the same client may reach another replica while the
 * lease is still there: that acquire waits for it (BUSY_WAIT_MS) instead
 * of answering busy. The release here comes 60 ms after the acquire
 * starts; a lease that stays held is still busy (versions_and_stale_saves). */
typedef struct late_release {
    srv_store_backend_t *be;
    const char *token;
} late_release_t;

static void *release_later(void *arg)
{
    late_release_t *lr = arg;
    sleep_ms(60);
    lr->be->ops->release(lr->be, ID1, lr->token);
    return NULL;
}

TEST(acquire_waits_for_a_release_under_way)
{
    LIVE();
    srv_store_backend_t *a = backend(60000, 30000), *b = backend(60000, 30000);
    char tok[SRV_STORE_TOKEN_MAX], tok2[SRV_STORE_TOKEN_MAX];
    uint64_t v = 0;
    unsigned char *blob = NULL, data[16] = {1, 2, 3};
    size_t len = 0;
    srv_store_meta_t m;
    meta(&m, OWNER, sizeof data);
    CHECK_INT_EQ(b->ops->save(b, ID1, NULL, 0, data, sizeof data, &m, &v, ERR), 0);
    CHECK_INT_EQ(b->ops->acquire(b, ID1, 0, tok, &v, &blob, &len, ERR), 0);
    free(blob);
    blob = NULL;
    late_release_t lr = {b, tok};
    pthread_t th;
    CHECK_INT_EQ(pthread_create(&th, NULL, release_later, &lr), 0);
    CHECK_INT_EQ(a->ops->acquire(a, ID1, 0, tok2, &v, &blob, &len, ERR), 0);
    CHECK(blob && len == sizeof data && memcmp(blob, data, len) == 0);
    free(blob);
    pthread_join(th, NULL);
    a->ops->release(a, ID1, tok2);
    a->ops->free(a);
    b->ops->free(b);
}

/* The lease is renewed while held and expires when its holder is gone. Not
 * timed by sleeps alone: a loaded shared machine can stop the whole process
 * (and Redis) for seconds, which expires any short lease; the test watches
 * the lease's TTL instead and tries again after such a stop. */
TEST(leases_renewed_and_expiring)
{
    LIVE();
    const char *kl = "darkserve:test:l:" ID1;
    int renewed = 0, expired = 0;
    for (int attempt = 0; attempt < 3 && !(renewed && expired); attempt++) {
        flushall();
        srv_store_backend_t *a = backend(60000, 3000), *b = backend(60000, 3000);
        char tok[SRV_STORE_TOKEN_MAX], tok2[SRV_STORE_TOKEN_MAX];
        uint64_t v = 0;
        unsigned char *blob = NULL;
        size_t len = 0;
        srv_store_meta_t m;
        meta(&m, "", 3);
        CHECK_INT_EQ(a->ops->save(a, ID1, NULL, 0, (const unsigned char *)"abc", 3, &m, &v, ERR),
                     0);
        CHECK_INT_EQ(a->ops->acquire(a, ID1, 0, tok, &v, &blob, &len, ERR), 0);
        free(blob);
        blob = NULL;
        /* renewed: its TTL goes back up (every third of the lease time) */
        long long prev = pttl(kl), now = prev;
        int gone = 0;
        renewed = 0;
        for (int i = 0; i < 40 && !renewed && !gone; i++) {
            sleep_ms(100);
            now = pttl(kl);
            gone = now < 0;
            renewed = now > prev + 200;
            prev = now;
        }
        if (!renewed) { /* stopped for longer than the lease: again */
            a->ops->free(a);
            b->ops->free(b);
            continue;
        }
        CHECK_INT_EQ(b->ops->acquire(b, ID1, 1, tok2, &v, &blob, &len, ERR), SRV_STORE_EBUSY);
        /* a dies holding it (its keeper stops renewing): it expires */
        a->ops->free(a);
        expired = 0;
        for (int i = 0; i < 100 && !expired; i++) {
            sleep_ms(100);
            expired = pttl(kl) == -2;
        }
        CHECK(expired);
        CHECK_INT_EQ(b->ops->acquire(b, ID1, 1, tok2, &v, &blob, &len, ERR), 0);
        CHECK(blob == NULL);
        /* the dead holder's save is refused now (another lease) */
        srv_store_backend_t *a2 = backend(60000, 3000);
        CHECK_INT_EQ(a2->ops->save(a2, ID1, tok, 1, (const unsigned char *)"xyz", 3, &m, &v, ERR),
                     SRV_STORE_ESTALE);
        CHECK_INT_EQ(b->ops->save(b, ID1, tok2, 1, (const unsigned char *)"def", 3, &m, &v, ERR),
                     0);
        CHECK_INT_EQ(v, 2);
        a2->ops->free(a2);
        b->ops->free(b);
    }
    CHECK_MSG(renewed, "the lease was never seen renewed in 3 tries");
}

TEST(delete_and_list)
{
    LIVE();
    srv_store_backend_t *a = backend(60000, 30000);
    const srv_store_backend_ops_t *A = a->ops;
    char tok[SRV_STORE_TOKEN_MAX];
    uint64_t v = 0;
    unsigned char *blob = NULL;
    size_t len = 0;
    srv_store_meta_t m;
    const char *ids[3] = {ID3, ID1, ID2};
    for (int i = 0; i < 3; i++) {
        meta(&m, i == 1 ? "" : OWNER, 2);
        m.tokens = 10 + i;
        CHECK_INT_EQ(A->save(a, ids[i], NULL, 0, (const unsigned char *)"zz", 2, &m, &v, ERR), 0);
    }
    srv_store_entry_t e[4];
    size_t n = 0;
    int more = 0;
    CHECK_INT_EQ(A->list(a, NULL, "", 4, e, &n, &more, ERR), 0);
    CHECK_INT_EQ(n, 3);
    CHECK_INT_EQ(more, 0);
    CHECK_STR_EQ(e[0].id, ID1);
    CHECK_STR_EQ(e[1].id, ID2);
    CHECK_STR_EQ(e[2].id, ID3);
    CHECK_INT_EQ(e[0].meta.tokens, 11);
    CHECK_INT_EQ(e[0].version, 1);
    CHECK_INT_EQ(A->list(a, NULL, "", 2, e, &n, &more, ERR), 0);
    CHECK_INT_EQ(n, 2);
    CHECK_INT_EQ(more, 1);
    CHECK_INT_EQ(A->list(a, NULL, ID2, 2, e, &n, &more, ERR), 0);
    CHECK_INT_EQ(n, 1);
    CHECK_STR_EQ(e[0].id, ID3);
    CHECK_INT_EQ(A->list(a, OWNER, "", 4, e, &n, &more, ERR), 0);
    CHECK_INT_EQ(n, 2);
    CHECK_STR_EQ(e[0].id, ID2);
    CHECK_INT_EQ(A->list(a, "", "", 4, e, &n, &more, ERR), 0);
    CHECK_INT_EQ(n, 1);
    CHECK_STR_EQ(e[0].id, ID1);
    /* delete: busy while leased, then gone from lists and the indexes */
    CHECK_INT_EQ(A->acquire(a, ID2, 0, tok, &v, &blob, &len, ERR), 0);
    free(blob);
    srv_store_backend_t *b = backend(60000, 30000);
    CHECK_INT_EQ(b->ops->remove(b, ID2, ERR), SRV_STORE_EBUSY);
    A->release(a, ID2, tok);
    CHECK_INT_EQ(A->remove(a, ID2, ERR), 0); /* its queued release taken over */
    CHECK_INT_EQ(A->remove(a, ID2, ERR), SRV_STORE_ENOTFOUND);
    CHECK_INT_EQ(A->list(a, OWNER, "", 4, e, &n, &more, ERR), 0);
    CHECK_INT_EQ(n, 1);
    CHECK_STR_EQ(e[0].id, ID3);
    redisContext *c = raw();
    redisReply *r = c ? redisCommand(c, "ZCARD darkserve:test:idx") : NULL;
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 2);
    if (r)
        freeReplyObject(r);
    /* an expired session leaves the lists (and the index) */
    srv_store_backend_t *s = backend(300, 2000);
    meta(&m, "", 2);
    CHECK_INT_EQ(s->ops->save(s, ID2, NULL, 0, (const unsigned char *)"zz", 2, &m, &v, ERR), 0);
    r = c ? redisCommand(c, "PTTL darkserve:test:s:" ID2) : NULL;
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer > 0 && r->integer <= 300);
    if (r)
        freeReplyObject(r);
    r = c ? redisCommand(c, "PTTL darkserve:test:s:" ID1) : NULL; /* ttl 60 s */
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer > 30000);
    if (r)
        freeReplyObject(r);
    sleep_ms(500);
    CHECK_INT_EQ(A->list(a, NULL, "", 4, e, &n, &more, ERR), 0);
    CHECK_INT_EQ(n, 2);
    r = c ? redisCommand(c, "ZCARD darkserve:test:idx") : NULL;
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 2);
    if (r)
        freeReplyObject(r);
    redisFree(c);
    s->ops->free(s);
    b->ops->free(b);
    A->free(a);
}

TEST(server_gone_and_back)
{
    LIVE();
    srv_store_backend_t *a = backend(60000, 2000);
    char why[512] = "";
    char tok[SRV_STORE_TOKEN_MAX];
    uint64_t v = 0;
    unsigned char *blob = NULL;
    size_t len = 0;
    srv_store_meta_t m;
    meta(&m, "", 2);
    CHECK_INT_EQ(a->ops->save(a, ID1, NULL, 0, (const unsigned char *)"ok", 2, &m, &v, ERR), 0);
    sleep_ms(300);
    CHECK_INT_EQ(a->ops->health(a, why, sizeof why), 0);
    redis_stop();
    /* the first call finds out; the ones after fail at once */
    CHECK_INT_EQ(a->ops->acquire(a, ID1, 0, tok, &v, &blob, &len, ERR), SRV_STORE_EUNAVAIL);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_INT_EQ(a->ops->peek(a, ID1, &v, &m, ERR), SRV_STORE_EUNAVAIL);
    CHECK_INT_EQ(a->ops->save(a, ID2, NULL, 0, (const unsigned char *)"no", 2, &m, &v, ERR),
                 SRV_STORE_EUNAVAIL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 < 200);
    CHECK_MSG(strstr(last_err, "unreachable"), "%s", last_err);
    CHECK_INT_EQ(a->ops->health(a, why, sizeof why), SRV_STORE_EUNAVAIL);
    char hp[32];
    snprintf(hp, sizeof hp, "127.0.0.1:%d", port);
    CHECK_MSG(strstr(why, hp) && strstr(why, "unreachable"), "%s", why);
    /* back (same AOF directory): within the backoff, and nothing saved is lost */
    CHECK_INT_EQ(redis_start(), 0);
    int ok = 0;
    for (int i = 0; i < 100 && !ok; i++) {
        ok = a->ops->health(a, why, sizeof why) == 0;
        if (!ok)
            sleep_ms(100);
    }
    CHECK_MSG(ok, "still down: %s", why);
    CHECK_INT_EQ(a->ops->acquire(a, ID1, 0, tok, &v, &blob, &len, ERR), 0);
    CHECK(blob && len == 2 && memcmp(blob, "ok", 2) == 0);
    free(blob);
    a->ops->release(a, ID1, tok);
    CHECK_INT_EQ(a->ops->peek(a, ID2, &v, &m, ERR), SRV_STORE_ENOTFOUND);
    a->ops->free(a);
}

TEST(server_full)
{
    LIVE();
    redisContext *c = raw();
    redisReply *r = c ? redisCommand(c, "CONFIG SET maxmemory 2mb") : NULL;
    if (r)
        freeReplyObject(r);
    r = c ? redisCommand(c, "CONFIG SET maxmemory-policy noeviction") : NULL;
    if (r)
        freeReplyObject(r);
    srv_store_backend_t *a = backend(60000, 2000);
    size_t n = 4u << 20;
    unsigned char *big = calloc(1, n);
    srv_store_meta_t m;
    meta(&m, "", n);
    uint64_t v = 0;
    CHECK_INT_EQ(a->ops->save(a, ID1, NULL, 0, big, n, &m, &v, ERR), SRV_STORE_ENOSPACE);
    CHECK_MSG(strstr(last_err, "out of memory"), "%s", last_err);
    r = c ? redisCommand(c, "CONFIG SET maxmemory 0") : NULL;
    if (r)
        freeReplyObject(r);
    CHECK_INT_EQ(a->ops->save(a, ID1, NULL, 0, big, n, &m, &v, ERR), 0);
    free(big);
    redisFree(c);
    a->ops->free(a);
}

TEST(bad_options)
{
    srv_store_backend_t *be = NULL;
    char err[256];
    srv_store_redis_opts_t o = {.url = "redis://h:0", .ns = "x:"};
    CHECK_INT_EQ(srv_store_redis_new(&o, &be, err, sizeof err), -1);
    CHECK(strstr(err, "port") && !be);
    o.url = "redis://h";
    o.ns = "";
    CHECK_INT_EQ(srv_store_redis_new(&o, &be, err, sizeof err), -1);
    /* an unreachable server is no error at start: it reports itself unhealthy */
    o.ns = "x:";
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/0", free_port());
    o.url = url;
    CHECK_INT_EQ(srv_store_redis_new(&o, &be, err, sizeof err), 0);
    char why[256] = "";
    int down = 0;
    for (int i = 0; i < 50 && !down; i++) {
        down = be->ops->health(be, why, sizeof why) == SRV_STORE_EUNAVAIL;
        if (!down)
            sleep_ms(20);
    }
    CHECK_MSG(down && strstr(why, "refused"), "%s", why);
    be->ops->free(be);
}

int main(void)
{
    RUN(url_parse);
    RUN(url_redact);
    RUN(keys_and_namespace);
    RUN(meta_round_trip);
    RUN(version_parse);
    RUN(bad_options);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/darkserve_redis_XXXXXX");
    port = free_port();
    if (mkdtemp(tmpdir) && port > 0 && redis_start() < 0)
        redis_stop();
    RUN(versions_and_stale_saves);
    RUN(acquire_waits_for_a_release_under_way);
    RUN(leases_renewed_and_expiring);
    RUN(delete_and_list);
    RUN(server_gone_and_back);
    RUN(server_full);
    redis_stop();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        printf("could not remove %s\n", tmpdir);
    return CHECK_DONE();
}
