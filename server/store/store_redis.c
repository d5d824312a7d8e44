/* server/store/store_redis.c — the Redis backend of a shared session store
 * (server/store/store_backend.h): --session-store redis://host:port/db.
 *
 * ## Keys (one namespace per model: "darkserve:<16 hex of its fingerprint>:")
 *   <ns>s:<id>       hash: v (version), w (the id of the save that wrote it),
 *                    blob (the core/state.h blob, as the directory store's
 *                    session file), owner, created, last_used, tokens,
 *                    turns, pg, bytes (srv_store_meta_t, for info and lists
 *                    without the blob); expires --session-ttl after its last
 *                    save or acquire
 *   <ns>l:<id>       string: the lease's token, PX lease time
 *   <ns>idx          sorted set (all scores 0): every id, for ordered lists
 *   <ns>idx:<owner>  the same per owner tag ("-" for none)
 * Expired sessions leave their ids in the indexes; a list drops them when it
 * meets them. Redis Cluster is not supported (scripts name keys they build).
 *
 * ## Atomic steps
 * acquire, release, renew, delete and list are Lua scripts (EVAL), atomic in
 * Redis: acquire takes the lease (SET PX) unless another token holds it and
 * returns the stored version; the blob is then read with a plain HMGET (under
 * the lease nobody else changes it; a 15 MB value returned through Lua costs
 * Redis tens of milliseconds of copies). release and renew compare the
 * lease's token before they delete or extend it. A save is a check-and-set
 * without Lua for the same reason: WATCH the session and its lease, read
 * version, writer and lease, decide here, then MULTI/EXEC the hash, its
 * expiry, the indexes and the lease's deletion (Redis refuses the EXEC when
 * a watched key changed meanwhile; then again). Each is safe to run twice (a
 * retry after a lost answer): acquire accepts its own token, and a save
 * recognises its own write by `w`.
 *
 * ## Threads: why blocking hiredis, not its libuv adapter
 * The session table calls a backend only from threads that may block (the
 * store's I/O thread, which already runs the directory store's file I/O in
 * order, off the event loop), and its API is synchronous: a save's result
 * decides what the client is told. So this backend uses hiredis's blocking
 * API with connect and command timeouts on that thread, which keeps one
 * code path and one failure model for both backends. The libuv adapter
 * would put hiredis's buffering of every 15 MB state (the command built,
 * the reply parsed) on the event loop, each costing milliseconds of every
 * other connection's time, and still need the I/O thread to serialize and
 * restore the state. The loop only reads health(), which never blocks.
 *
 * One thread of this file's own (the keeper), with its own connection,
 * renews the leases held (every third of the lease time), runs the queued
 * lease releases (release() never blocks: the loop thread calls it) and
 * checks the server every second; when it cannot reach it, health() says
 * so and the keeper reconnects after a backoff of 0.1 s doubling to 5 s.
 * Meanwhile calls fail at once with SRV_STORE_EUNAVAIL instead of each
 * waiting for a timeout. The I/O thread's connection is replaced after the
 * keeper saw the server go away, and a command whose connection broke is
 * tried once more on a new one (which the scripts make safe).
 */
#include "server/store/store_backend.h"
#include "server/store/store_redis_test.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proto/proto.h"
#include "server/base/log.h"
#include "server/base/random.h"
#include "server/base/sha256.h"

#define DEFAULT_LEASE_MS 15000
#define DEFAULT_TIMEOUT_MS 5000
#define CONNECT_TIMEOUT_MS 1000
#define PING_MS 1000
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define MAX_QUEUED 4096 /* queued releases; past it the oldest are dropped (they expire) */
/* How long an acquire waits for a lease held by another replica before it
 * reports the session busy: a replica answers a request before its keeper
 * has run the release, so a client that goes straight to another replica
 * (a GET of the state on each, turns alternating behind a balancer) would
 * otherwise meet a lease that is already on its way out. A session really
 * in use (a turn running there) is still busy after it. */
#define BUSY_WAIT_MS 100
#define KEY_MAX 160
#define OWNER_IDX_NONE "-"

/* Writes the detail into err[errlen] (err may be NULL) and yields code. */
#define STORE_FAIL(err, errlen, code, ...) (fail((err), (errlen), __VA_ARGS__), (code))

/* ---- pure parts (unit-tested without a server) ---- */

static int fail(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t n, const char *fmt, ...)
{
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Percent-decodes s[0..n) into out[cap]; -1 on a bad escape or no room. */
static int pct_decode(const char *s, size_t n, char *out, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i];
        if (c == '%') {
            if (i + 2 >= n)
                return -1;
            int h = hexval(s[i + 1]), l = hexval(s[i + 2]);
            if (h < 0 || l < 0)
                return -1;
            c = h * 16 + l;
            i += 2;
        }
        if (c == 0 || k + 1 >= cap)
            return -1;
        out[k++] = (char)c;
    }
    out[k] = '\0';
    return 0;
}

static int all_digits(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

int srv_store_redis_url_parse(const char *url, srv_store_redis_url_t *out, char *err, size_t errlen)
{
    static const char want[] = "expected redis://[[user]:password@]host[:port][/db]";
    memset(out, 0, sizeof *out);
    out->port = SRV_STORE_REDIS_PORT;
    char shown[160]; /* the URL in messages, without its password */
    srv_store_redis_url_redact(url ? url : "", shown, sizeof shown);
    if (!url || !*url)
        return fail(err, errlen, "empty session store URL (%s)", want);
    if (strncmp(url, "rediss://", 9) == 0)
        return fail(err, errlen, "'%s': TLS (rediss://) is not supported (%s)", shown, want);
    if (strncmp(url, "redis://", 8) != 0)
        return fail(err, errlen, "'%s': unknown session store (%s)", shown, want);
    const char *p = url + 8;
    if (strpbrk(p, "?#"))
        return fail(err, errlen, "'%s': query parameters and fragments are not supported (%s)",
                    shown, want);
    for (const char *c = p; *c; c++)
        if ((unsigned char)*c <= 0x20 || (unsigned char)*c >= 0x7f)
            return fail(err, errlen, "'%s': a space or a non-ASCII character (%s)", shown, want);
    const char *slash = strchr(p, '/');
    const char *end = slash ? slash : p + strlen(p);
    /* userinfo: up to the last '@' before the path */
    const char *at = NULL;
    for (const char *c = p; c < end; c++)
        if (*c == '@')
            at = c;
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (!colon)
            return fail(err, errlen,
                        "'%s': credentials must be user:password@ or :password@ "
                        "(%s)",
                        shown, want);
        if (pct_decode(p, (size_t)(colon - p), out->user, sizeof out->user) < 0 ||
            pct_decode(colon + 1, (size_t)(at - colon - 1), out->password, sizeof out->password) <
                0)
            return fail(err, errlen, "'%s': malformed or too long user or password (%s)", shown,
                        want);
        if (!out->password[0])
            return fail(err, errlen, "'%s': empty password (%s)", shown, want);
        p = at + 1;
    }
    /* host */
    const char *hend;
    if (*p == '[') {
        const char *rb = memchr(p, ']', (size_t)(end - p));
        if (!rb)
            return fail(err, errlen, "'%s': unclosed '[' of an IPv6 address (%s)", shown, want);
        for (const char *c = p + 1; c < rb; c++)
            if (hexval(*c) < 0 && *c != ':' && *c != '.')
                return fail(err, errlen, "'%s': malformed IPv6 address (%s)", shown, want);
        if (rb == p + 1 || (size_t)(rb - p - 1) > SRV_STORE_REDIS_HOST_MAX)
            return fail(err, errlen, "'%s': malformed IPv6 address (%s)", shown, want);
        memcpy(out->host, p + 1, (size_t)(rb - p - 1));
        hend = rb + 1;
        if (hend < end && *hend != ':')
            return fail(err, errlen, "'%s': unexpected text after the IPv6 address (%s)", shown,
                        want);
    } else {
        hend = p;
        while (hend < end && *hend != ':')
            hend++;
        if (hend == p)
            return fail(err, errlen, "'%s': no host (%s)", shown, want);
        if ((size_t)(hend - p) > SRV_STORE_REDIS_HOST_MAX)
            return fail(err, errlen, "'%s': host name longer than %d characters", shown,
                        SRV_STORE_REDIS_HOST_MAX);
        for (const char *c = p; c < hend; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                  (*c >= '0' && *c <= '9') || *c == '.' || *c == '-' || *c == '_'))
                return fail(err, errlen, "'%s': malformed host name (%s)", shown, want);
        memcpy(out->host, p, (size_t)(hend - p));
    }
    /* port */
    if (hend < end) { /* ':' */
        const char *ps = hend + 1;
        size_t pl = (size_t)(end - ps);
        long v = 0;
        if (!all_digits(ps, pl) || pl > 5 || (v = strtol(ps, NULL, 10)) < 1 || v > 65535)
            return fail(err, errlen, "'%s': the port must be a number in [1, 65535] (%s)", shown,
                        want);
        out->port = (int)v;
    }
    /* db */
    if (slash && slash[1]) {
        const char *ds = slash + 1;
        size_t dl = strlen(ds);
        long v = -1;
        if (!all_digits(ds, dl) || dl > 7 || (v = strtol(ds, NULL, 10)) > SRV_STORE_REDIS_DB_MAX)
            return fail(err, errlen, "'%s': the database must be a number in [0, %d] (%s)", shown,
                        SRV_STORE_REDIS_DB_MAX, want);
        out->db = (int)v;
    }
    return 0;
}

void srv_store_redis_url_redact(const char *url, char *out, size_t n)
{
    if (!n)
        return;
    if (!url)
        url = "";
    const char *sep = strstr(url, "://");
    const char *p = sep ? sep + 3 : url;
    size_t alen = strcspn(p, "/?#");
    const char *at = NULL;
    for (const char *c = p; c < p + alen; c++)
        if (*c == '@')
            at = c;
    if (!at) {
        snprintf(out, n, "%s", url);
        return;
    }
    const char *colon = memchr(p, ':', (size_t)(at - p));
    if (colon) /* the user stays, the password goes */
        snprintf(out, n, "%.*s:***%s", (int)(colon - url), url, at);
    else
        snprintf(out, n, "%.*s***%s", (int)(p - url), url, at);
}

int srv_store_redis_key(const char *ns, char kind, const char *id, char *out, size_t n)
{
    if (!srv_session_id_valid(id) || (kind != 's' && kind != 'l'))
        return -1;
    int w = snprintf(out, n, "%s%c:%s", ns, kind, id);
    return w < 0 || (size_t)w >= n ? -1 : w;
}

void srv_store_redis_namespace(const char *fingerprint, char *out, size_t n)
{
    uint8_t d[SRV_SHA256_BYTES];
    srv_sha256(fingerprint, strlen(fingerprint), d);
    char h[17];
    proto_hex_format(d, 8, h);
    snprintf(out, n, "darkserve:%s:", h);
}

const char *const srv_store_redis_meta_names[SRV_STORE_REDIS_META_FIELDS] = {
    "owner", "created", "last_used", "tokens", "turns", "pg", "bytes"};

void srv_store_redis_meta_encode(const srv_store_meta_t *m,
                                 char buf[SRV_STORE_REDIS_META_FIELDS][32 + SRV_SESSION_OWNER_LEN])
{
    snprintf(buf[0], sizeof buf[0], "%s", m->owner);
    snprintf(buf[1], sizeof buf[1], "%" PRId64, m->created);
    snprintf(buf[2], sizeof buf[2], "%" PRId64, m->last_used);
    snprintf(buf[3], sizeof buf[3], "%" PRId64, m->tokens);
    snprintf(buf[4], sizeof buf[4], "%" PRId64, m->turns);
    snprintf(buf[5], sizeof buf[5], "%" PRId64, m->pending_grammar);
    snprintf(buf[6], sizeof buf[6], "%" PRIu64, m->state_bytes);
}

/* Decimal int64 of s[0..n) (an optional '-'), 0 and *out, else -1. */
static int parse_i64(const char *s, size_t n, int64_t *out)
{
    if (!s || n == 0 || n > 20)
        return -1;
    char b[24];
    memcpy(b, s, n);
    b[n] = '\0';
    size_t k = b[0] == '-' ? 1 : 0;
    if (!all_digits(b + k, n - k))
        return -1;
    errno = 0;
    long long v = strtoll(b, NULL, 10);
    if (errno)
        return -1;
    *out = v;
    return 0;
}

int srv_store_redis_meta_decode(const char *const *v, const size_t *len, srv_store_meta_t *m)
{
    memset(m, 0, sizeof *m);
    if (!v[0] || len[0] > SRV_SESSION_OWNER_LEN)
        return -1;
    memcpy(m->owner, v[0], len[0]);
    m->owner[len[0]] = '\0';
    if (m->owner[0] && !srv_session_id_valid(m->owner)) /* an owner tag is shaped like an id */
        return -1;
    int64_t bytes = 0;
    if (parse_i64(v[1], len[1], &m->created) < 0 || parse_i64(v[2], len[2], &m->last_used) < 0 ||
        parse_i64(v[3], len[3], &m->tokens) < 0 || parse_i64(v[4], len[4], &m->turns) < 0 ||
        parse_i64(v[5], len[5], &m->pending_grammar) < 0 || parse_i64(v[6], len[6], &bytes) < 0)
        return -1;
    if (m->tokens < 0 || m->turns < 0 || m->pending_grammar < -1 || bytes < 0)
        return -1;
    m->state_bytes = (uint64_t)bytes;
    return 0;
}

int srv_store_redis_version_parse(const char *s, size_t len, uint64_t *out)
{
    int64_t v = 0;
    if (parse_i64(s, len, &v) < 0 || v < 1)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

/* ---- scripts ---- */

/* KEYS: session, lease. ARGV: token, lease ms, a token of ours whose
 * release is queued ("" = none), ttl ms. -> {-1} busy, {0} not found,
 * {1, v}. The blob is read after it with a plain HMGET (under the lease
 * nobody else can change it): a 15 MB value returned through Lua costs
 * tens of milliseconds of copies in Redis. */
static const char ACQUIRE_LUA[] =
    "local cur = redis.call('GET', KEYS[2])\n"
    "if cur and cur ~= ARGV[1] and cur ~= ARGV[3] then return {-1} end\n"
    "local v = redis.call('HGET', KEYS[1], 'v')\n"
    "if not v then\n"
    "  if cur then redis.call('DEL', KEYS[2]) end\n"
    "  return {0}\n"
    "end\n"
    "redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])\n"
    "if tonumber(ARGV[4]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end\n"
    "return {1, v}\n";

/* KEYS: lease. ARGV: token. */
static const char RELEASE_LUA[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end\n"
    "return 0\n";

/* KEYS: lease. ARGV: token, lease ms. -> 1 renewed, 0 lost. */
static const char RENEW_LUA[] = "if redis.call('GET', KEYS[1]) == ARGV[1] then\n"
                                "  return redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
                                "end\n"
                                "return 0\n";

/* KEYS: session, lease, index. ARGV: id, a token of ours whose release is
 * queued, the owner indexes' prefix. -> -1 busy, 0 not found, 1 deleted. */
static const char REMOVE_LUA[] = "local cur = redis.call('GET', KEYS[2])\n"
                                 "if cur and cur ~= ARGV[2] then return -1 end\n"
                                 "local owner = redis.call('HGET', KEYS[1], 'owner')\n"
                                 "local n = redis.call('DEL', KEYS[1])\n"
                                 "if cur then redis.call('DEL', KEYS[2]) end\n"
                                 "redis.call('ZREM', KEYS[3], ARGV[1])\n"
                                 "if owner then\n"
                                 "  if owner == '' then owner = '" OWNER_IDX_NONE "' end\n"
                                 "  redis.call('ZREM', ARGV[3] .. owner, ARGV[1])\n"
                                 "end\n"
                                 "return n\n";

/* KEYS: an index. ARGV: the session keys' prefix, after ("" = from the
 * start), limit. -> flat {id, v, metadata fields...} for up to limit + 1
 * sessions in id order; ids whose session expired leave the index. */
static const char LIST_LUA[] =
    "local out = {}\n"
    "local want = (tonumber(ARGV[3]) + 1) * 9\n"
    "local start = ARGV[2] == '' and '-' or ('(' .. ARGV[2])\n"
    "while #out < want do\n"
    "  local ids = redis.call('ZRANGEBYLEX', KEYS[1], start, '+', 'LIMIT', 0, tonumber(ARGV[3]) + "
    "1)\n"
    "  if #ids == 0 then break end\n"
    "  for _, id in ipairs(ids) do\n"
    "    local f = redis.call('HMGET', ARGV[1] .. id, 'v', 'owner', 'created', 'last_used',\n"
    "                         'tokens', 'turns', 'pg', 'bytes')\n"
    "    if f[1] then\n"
    "      out[#out + 1] = id\n"
    "      for i = 1, 8 do out[#out + 1] = f[i] or '' end\n"
    "      if #out >= want then break end\n"
    "    else\n"
    "      redis.call('ZREM', KEYS[1], id)\n"
    "    end\n"
    "  end\n"
    "  start = '(' .. ids[#ids]\n"
    "end\n"
    "return out\n";

/* ---- the backend ---- */

typedef struct lease {
    char id[SRV_SESSION_ID_LEN + 1];
    char token[SRV_STORE_TOKEN_MAX];
} lease_t;

typedef struct lease_list {
    lease_t *v;
    size_t n, cap;
} lease_list_t;

typedef struct redis_be {
    srv_store_backend_t base;
    srv_store_redis_url_t url;
    char shown[600]; /* the URL without its password, for messages */
    char ns[64];
    int64_t ttl_ms, lease_ms, timeout_ms;
    char replica[17]; /* random: this process's part of every token */
    uint64_t counter; /* under mu */

    pthread_mutex_t cmd_mu; /* the command connection (the I/O thread's) */
    redisContext *cmd;
    uint64_t cmd_gen; /* gen when it was made */

    pthread_mutex_t mu; /* everything below */
    pthread_cond_t cv;
    int state;     /* STATE_* */
    char why[256]; /* the last failure */
    int64_t down_since_ms;
    int64_t backoff_ms;
    uint64_t gen;        /* one more each time the server went away */
    int io_errno;        /* the errno of the I/O thread connection's last failure (cmd_mu) */
    lease_list_t held;   /* leases to renew */
    lease_list_t queued; /* leases to release */
    lease_list_t releasing; /* the keeper's batch being released now */
    int quit;
    pthread_t thread;
    int thread_started;
    redisContext *keep; /* the keeper's connection (its thread only) */
} redis_be_t;

enum { STATE_UNKNOWN = 0, STATE_UP = 1, STATE_DOWN = 2 };

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct timeval tv_ms(int64_t ms)
{
    struct timeval tv = {.tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000) * 1000};
    return tv;
}

static int list_add(lease_list_t *l, const char *id, const char *token)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        lease_t *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    snprintf(l->v[l->n].id, sizeof l->v[l->n].id, "%s", id);
    snprintf(l->v[l->n].token, sizeof l->v[l->n].token, "%s", token);
    l->n++;
    return 0;
}

static void list_del(lease_list_t *l, size_t i)
{
    l->v[i] = l->v[--l->n];
}

/* Index of id (and token when not NULL) in l, or -1. */
static ssize_t list_find(const lease_list_t *l, const char *id, const char *token)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->v[i].id, id) == 0 && (!token || strcmp(l->v[i].token, token) == 0))
            return (ssize_t)i;
    return -1;
}

/* Caller holds mu: the server cannot be reached (reason why). */
static void mark_down(redis_be_t *r, const char *why)
{
    if (r->state != STATE_DOWN) {
        SRV_LOG(SRV_LOG_WARN, NULL,
                "session store %s unreachable: %s; requests that need a "
                "session get 503 until it is back",
                r->shown, why);
        r->state = STATE_DOWN;
        r->down_since_ms = now_ms();
        r->backoff_ms = BACKOFF_MIN_MS;
        r->gen++;
    }
    snprintf(r->why, sizeof r->why, "%s", why);
    pthread_cond_broadcast(&r->cv);
}

/* A new connection (AUTH, SELECT done), or NULL with the reason in why. */
static redisContext *connect_to(redis_be_t *r, char *why, size_t n)
{
    redisContext *c = redisConnectWithTimeout(r->url.host, r->url.port, tv_ms(CONNECT_TIMEOUT_MS));
    if (!c || c->err) {
        snprintf(why, n, "connecting to %.100s:%d: %.100s", r->url.host, r->url.port,
                 c ? c->errstr : "out of memory");
        redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv_ms(r->timeout_ms));
    redisEnableKeepAlive(c);
    redisReply *rep = NULL;
    if (r->url.password[0]) {
        const char *av[3] = {"AUTH", r->url.user, r->url.password};
        int ac = r->url.user[0] ? 3 : 2;
        if (!r->url.user[0])
            av[1] = r->url.password;
        rep = redisCommandArgv(c, ac, av, NULL);
        if (!rep || rep->type == REDIS_REPLY_ERROR) {
            snprintf(why, n, "AUTH: %s", rep ? rep->str : c->errstr);
            goto fail;
        }
        freeReplyObject(rep);
    }
    if (r->url.db) {
        char db[16];
        snprintf(db, sizeof db, "%d", r->url.db);
        const char *av[2] = {"SELECT", db};
        rep = redisCommandArgv(c, 2, av, NULL);
        if (!rep || rep->type == REDIS_REPLY_ERROR) {
            snprintf(why, n, "SELECT %s: %s", db, rep ? rep->str : c->errstr);
            goto fail;
        }
        freeReplyObject(rep);
    }
    return c;
fail:
    if (rep)
        freeReplyObject(rep);
    redisFree(c);
    return NULL;
}

/* What an error reply means for the caller: EUNAVAIL (the server is
 * there but refuses for a while), ENOSPACE (out of memory), EIO. */
static int reply_error(redis_be_t *r, const redisReply *rep, const char *what, char *err,
                       size_t errlen)
{
    const char *s = rep->str ? rep->str : "";
    if (strncmp(s, "OOM", 3) == 0)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOSPACE,
                          "session store %s is out of memory (%s): %s", r->shown, what, s);
    if (strncmp(s, "LOADING", 7) == 0 || strncmp(s, "BUSY", 4) == 0 ||
        strncmp(s, "READONLY", 8) == 0 || strncmp(s, "MISCONF", 7) == 0 ||
        strncmp(s, "NOAUTH", 6) == 0 || strncmp(s, "WRONGPASS", 9) == 0 ||
        strncmp(s, "MASTERDOWN", 10) == 0)
        return STORE_FAIL(err, errlen, SRV_STORE_EUNAVAIL,
                          "session store %s cannot take requests now (%s): %s", r->shown, what, s);
    return STORE_FAIL(err, errlen, SRV_STORE_EIO, "session store %s (%s): %s", r->shown, what, s);
}

/* The health message while down (caller holds mu). */
static void down_text(const redis_be_t *r, char *out, size_t n)
{
    int64_t s = (now_ms() - r->down_since_ms) / 1000;
    snprintf(out, n, "session store %.200s unreachable for %" PRId64 " s (%.200s); reconnecting",
             r->shown, s, r->why);
}

/* What a sequence's step returns when its connection broke: the whole
 * sequence runs again on a new connection (every sequence is safe to run
 * twice). */
#define CONN_BROKEN 1

/* A sequence of commands on the I/O thread's connection c: 0, a negative
 * SRV_STORE_E* code, or CONN_BROKEN. */
typedef int (*seq_fn)(redis_be_t *r, redisContext *c, void *arg);

/* Runs fn with the I/O thread's connection (made when missing, replaced
 * when the keeper saw the server go away since it was made); a connection
 * that breaks is replaced and fn runs once more, unless it timed out (the
 * server hangs: no second wait). While the server is known to be down,
 * fails at once with SRV_STORE_EUNAVAIL. */
static int with_conn(redis_be_t *r, seq_fn fn, void *arg, const char *what, char *err,
                     size_t errlen)
{
    int rc = SRV_STORE_EUNAVAIL;
    char why[256] = "";
    pthread_mutex_lock(&r->cmd_mu);
    for (int attempt = 0; attempt < 2; attempt++) {
        pthread_mutex_lock(&r->mu);
        const int down = r->state == STATE_DOWN;
        const uint64_t gen = r->gen;
        char text[600];
        if (down)
            down_text(r, text, sizeof text);
        pthread_mutex_unlock(&r->mu);
        if (down) { /* the keeper reconnects; fail now rather than wait */
            rc = STORE_FAIL(err, errlen, SRV_STORE_EUNAVAIL, "%s", text);
            break;
        }
        if (r->cmd && r->cmd_gen != gen) { /* made before the server went away */
            redisFree(r->cmd);
            r->cmd = NULL;
        }
        if (!r->cmd) {
            r->cmd = connect_to(r, why, sizeof why);
            r->cmd_gen = gen;
            if (!r->cmd) {
                pthread_mutex_lock(&r->mu);
                mark_down(r, why);
                pthread_mutex_unlock(&r->mu);
                rc = STORE_FAIL(err, errlen, SRV_STORE_EUNAVAIL,
                                "session store %s unreachable (%s)", r->shown, why);
                break;
            }
        }
        r->io_errno = 0;
        rc = fn(r, r->cmd, arg);
        if (rc != CONN_BROKEN)
            break;
        const int timed_out =
            r->io_errno == EAGAIN || r->io_errno == EWOULDBLOCK || r->io_errno == ETIMEDOUT;
        snprintf(why, sizeof why, "%s: %s", what,
                 r->cmd->errstr[0] ? r->cmd->errstr : "connection lost");
        redisFree(r->cmd);
        r->cmd = NULL;
        rc = SRV_STORE_EUNAVAIL;
        if (timed_out || attempt == 1) {
            pthread_mutex_lock(&r->mu);
            mark_down(r, why);
            pthread_mutex_unlock(&r->mu);
            rc = STORE_FAIL(err, errlen, SRV_STORE_EUNAVAIL, "session store %s unreachable (%s)",
                            r->shown, why);
            break;
        }
    }
    pthread_mutex_unlock(&r->cmd_mu);
    return rc;
}

/* The next reply of c (after commands were appended): 0 and *rep (caller
 * frees), or CONN_BROKEN (the errno of the failure kept). */
static int next_reply(redis_be_t *r, redisContext *c, redisReply **rep)
{
    void *p = NULL;
    if (redisGetReply(c, &p) != REDIS_OK || !p) {
        r->io_errno = errno;
        *rep = NULL;
        return CONN_BROKEN;
    }
    *rep = p;
    return 0;
}

/* One command and its reply (as next_reply). */
static int cmd1(redis_be_t *r, redisContext *c, int argc, const char **argv, const size_t *lens,
                redisReply **rep)
{
    if (redisAppendCommandArgv(c, argc, argv, lens) != REDIS_OK) {
        r->io_errno = errno;
        *rep = NULL;
        return CONN_BROKEN;
    }
    return next_reply(r, c, rep);
}

typedef struct one_cmd {
    int argc;
    const char **argv;
    const size_t *lens;
    redisReply *rep;
} one_cmd_t;

static int one_fn(redis_be_t *r, redisContext *c, void *arg)
{
    one_cmd_t *o = arg;
    return cmd1(r, c, o->argc, o->argv, o->lens, &o->rep);
}

/* Runs one command on the I/O thread's connection (with_conn): the reply
 * (caller frees; may be an error reply), or NULL with *rc (EUNAVAIL,
 * detail set). */
static redisReply *run(redis_be_t *r, int argc, const char **argv, const size_t *lens, int *rc,
                       const char *what, char *err, size_t errlen)
{
    one_cmd_t o = {.argc = argc, .argv = argv, .lens = lens};
    int e = with_conn(r, one_fn, &o, what, err, errlen);
    if (e < 0)
        *rc = e;
    return e == 0 ? o.rep : NULL;
}

static void token_new(redis_be_t *r, char *out, char kind)
{
    pthread_mutex_lock(&r->mu);
    uint64_t c = ++r->counter;
    pthread_mutex_unlock(&r->mu);
    snprintf(out, SRV_STORE_TOKEN_MAX, "%s.%c%" PRIu64, r->replica, kind, c);
}

/* A queued release of id by this process, taken off the queue (so the
 * keeper does not delete what is about to be taken over): its token in
 * out, or "". A release the keeper is running at this moment gives its
 * token too, left in its batch: whichever of the two scripts runs first,
 * the result is the same (the release compares tokens, so it cannot delete
 * the lease the acquire put in its place). */
static void take_queued(redis_be_t *r, const char *id, char out[SRV_STORE_TOKEN_MAX])
{
    out[0] = '\0';
    pthread_mutex_lock(&r->mu);
    ssize_t i = list_find(&r->queued, id, NULL);
    if (i >= 0) {
        snprintf(out, SRV_STORE_TOKEN_MAX, "%s", r->queued.v[i].token);
        list_del(&r->queued, (size_t)i);
    } else if ((i = list_find(&r->releasing, id, NULL)) >= 0) {
        snprintf(out, SRV_STORE_TOKEN_MAX, "%s", r->releasing.v[i].token);
    }
    pthread_mutex_unlock(&r->mu);
}

static int reply_int(const redisReply *e, long long *v)
{
    if (e->type == REDIS_REPLY_INTEGER) {
        *v = e->integer;
        return 0;
    }
    return -1;
}

static void unhold(redis_be_t *r, const char *id, const char *token)
{
    pthread_mutex_lock(&r->mu);
    ssize_t i = list_find(&r->held, id, token);
    if (i >= 0)
        list_del(&r->held, (size_t)i);
    pthread_mutex_unlock(&r->mu);
}

typedef struct acq {
    const char *id, *ks, *kl, *token, *old;
    const char *lms, *ttl;
    uint64_t have;
    long long code; /* the script's: -1 busy, 0 not found, 1 taken */
    uint64_t version;
    unsigned char *blob; /* malloc'd when read */
    size_t len;
    char *err; /* the caller's detail buffer [errlen] (may be NULL) */
    size_t errlen;
} acq_t;

/* The acquire script, then the blob when the caller's version is not the
 * stored one. */
static int acquire_seq(redis_be_t *r, redisContext *c, void *arg)
{
    acq_t *q = arg;
    const char *av[] = {"EVAL", ACQUIRE_LUA, "2", q->ks, q->kl, q->token, q->lms, q->old, q->ttl};
    redisReply *rep = NULL;
    free(q->blob);
    q->blob = NULL;
    int rc = cmd1(r, c, 9, av, NULL, &rep);
    if (rc)
        return rc;
    if (rep->type == REDIS_REPLY_ERROR) {
        rc = reply_error(r, rep, "acquire", q->err, q->errlen);
    } else if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 1 ||
               reply_int(rep->element[0], &q->code) < 0 || q->code < -1 || q->code > 1 ||
               (q->code == 1 &&
                (rep->elements < 2 || rep->element[1]->type != REDIS_REPLY_STRING ||
                 srv_store_redis_version_parse(rep->element[1]->str, rep->element[1]->len,
                                               &q->version) < 0))) {
        rc = STORE_FAIL(q->err, q->errlen, SRV_STORE_EIO,
                        "session store %s: unexpected answer to acquire", r->shown);
    }
    freeReplyObject(rep);
    if (rc || q->code != 1 || q->version == q->have)
        return rc;
    const char *hv[] = {"HMGET", q->ks, "v", "blob"};
    if ((rc = cmd1(r, c, 4, hv, NULL, &rep)))
        return rc;
    uint64_t v2 = 0;
    if (rep->type == REDIS_REPLY_ERROR) {
        rc = reply_error(r, rep, "read", q->err, q->errlen);
    } else if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2) {
        rc = STORE_FAIL(q->err, q->errlen, SRV_STORE_EIO,
                        "session store %s: unexpected answer to HMGET", r->shown);
    } else if (rep->element[0]->type != REDIS_REPLY_STRING) { /* expired just now */
        rc = STORE_FAIL(q->err, q->errlen, SRV_STORE_ENOTFOUND, "session %s not found", q->id);
    } else if (srv_store_redis_version_parse(rep->element[0]->str, rep->element[0]->len, &v2) < 0 ||
               v2 != q->version || rep->element[1]->type != REDIS_REPLY_STRING ||
               rep->element[1]->len == 0) {
        rc = STORE_FAIL(q->err, q->errlen, SRV_STORE_EIO,
                        "session %s in %s: no state, or another version than its "
                        "lease was taken for",
                        q->id, r->shown);
    } else if (!(q->blob = malloc(rep->element[1]->len))) {
        rc = STORE_FAIL(q->err, q->errlen, SRV_STORE_ENOMEM, "out of memory for a %zu-byte state",
                        rep->element[1]->len);
    } else {
        memcpy(q->blob, rep->element[1]->str, rep->element[1]->len);
        q->len = rep->element[1]->len;
    }
    freeReplyObject(rep);
    return rc;
}

static int r_acquire(srv_store_backend_t *be, const char *id, uint64_t have, char *token,
                     uint64_t *version, unsigned char **blob, size_t *len, char *err, size_t errlen)
{
    redis_be_t *r = (redis_be_t *)be;
    *blob = NULL;
    *len = 0;
    char ks[KEY_MAX], kl[KEY_MAX], old[SRV_STORE_TOKEN_MAX], lms[24], ttl[24];
    if (srv_store_redis_key(r->ns, 's', id, ks, sizeof ks) < 0 ||
        srv_store_redis_key(r->ns, 'l', id, kl, sizeof kl) < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL, "malformed session id");
    token_new(r, token, 'a');
    take_queued(r, id, old);
    snprintf(lms, sizeof lms, "%" PRId64, r->lease_ms);
    snprintf(ttl, sizeof ttl, "%" PRId64, r->ttl_ms);
    acq_t q;
    int rc;
    for (int64_t waited = 0, step = 5;; waited += step, step = step < 40 ? 2 * step : 50) {
        q = (acq_t){.id = id,
                    .ks = ks,
                    .kl = kl,
                    .token = token,
                    .old = old,
                    .lms = lms,
                    .ttl = ttl,
                    .have = have,
                    .err = err,
                    .errlen = errlen};
        rc = with_conn(r, acquire_seq, &q, "acquire", err, errlen);
        if (rc != 0 || q.code != -1 || waited >= BUSY_WAIT_MS)
            break;
        struct timespec ts = {0, (long)step * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (rc == 0 && q.code == -1)
        rc = STORE_FAIL(err, errlen, SRV_STORE_EBUSY, "session %s is busy on another replica", id);
    else if (rc == 0 && q.code == 0)
        rc = STORE_FAIL(err, errlen, SRV_STORE_ENOTFOUND, "session %s not found", id);
    if (rc < 0) {
        free(q.blob);
        if (q.code == 1) /* the lease was taken: give it back */
            r->base.ops->release(be, id, token);
        else if (old[0] && q.code != -1) /* what we took off the queue */
            r->base.ops->release(be, id, old);
        return rc;
    }
    *version = q.version;
    *blob = q.blob;
    *len = q.len;
    pthread_mutex_lock(&r->mu);
    list_add(&r->held, id, token); /* out of memory: it just is not renewed */
    pthread_mutex_unlock(&r->mu);
    return 0;
}

typedef struct sav {
    const char *id, *ks, *kl, *ki, *ko, *token, *wid, *ttl;
    uint64_t expect;
    const unsigned char *blob;
    size_t len;
    char mv[SRV_STORE_REDIS_META_FIELDS][32 + SRV_SESSION_OWNER_LEN];
    uint64_t version;
    int stale; /* 1 another holder's lease, 2 another version (stored_v) */
    uint64_t stored_v;
    char *err; /* the caller's detail buffer [errlen] (may be NULL) */
    size_t errlen;
} sav_t;

/* A save as a check-and-set: WATCH the session and its lease, read the
 * version, its writer and the lease, decide here, then write everything in
 * one MULTI/EXEC, which Redis refuses when either key changed after the
 * WATCH (the keeper renewing the lease, another replica): then again. No
 * Lua here: a 15 MB script argument costs Redis more copies than three
 * round trips cost. A save that went through but whose answer was lost is
 * recognised by its writer id (`w`) when it runs again. */
static int save_seq(redis_be_t *r, redisContext *c, void *arg)
{
    sav_t *q = arg;
    char next[24];
    snprintf(next, sizeof next, "%" PRIu64, q->expect + 1);
    for (int tries = 0; tries < 8; tries++) {
        const char *wv[] = {"WATCH", q->ks, q->kl};
        const char *hv[] = {"HMGET", q->ks, "v", "w"};
        const char *gv[] = {"GET", q->kl};
        redisReply *w = NULL, *h = NULL, *g = NULL;
        if (redisAppendCommandArgv(c, 3, wv, NULL) != REDIS_OK ||
            redisAppendCommandArgv(c, 4, hv, NULL) != REDIS_OK ||
            redisAppendCommandArgv(c, 2, gv, NULL) != REDIS_OK) {
            r->io_errno = errno;
            return CONN_BROKEN;
        }
        if (next_reply(r, c, &w) || next_reply(r, c, &h) || next_reply(r, c, &g)) {
            freeReplyObject(w);
            freeReplyObject(h);
            return CONN_BROKEN;
        }
        int rc = 0;
        uint64_t v = 0;
        const redisReply *err = w->type == REDIS_REPLY_ERROR   ? w
                                : h->type == REDIS_REPLY_ERROR ? h
                                : g->type == REDIS_REPLY_ERROR ? g
                                                               : NULL;
        if (err)
            rc = reply_error(r, err, "save", q->err, q->errlen);
        else if (h->type != REDIS_REPLY_ARRAY || h->elements != 2 ||
                 (h->element[0]->type == REDIS_REPLY_STRING &&
                  srv_store_redis_version_parse(h->element[0]->str, h->element[0]->len, &v) < 0))
            rc = STORE_FAIL(q->err, q->errlen, SRV_STORE_EIO, "session %s in %s: malformed version",
                            q->id, r->shown);
        const int mine = rc == 0 && v == q->expect + 1 &&
                         h->element[1]->type == REDIS_REPLY_STRING &&
                         strlen(q->wid) == h->element[1]->len &&
                         memcmp(h->element[1]->str, q->wid, h->element[1]->len) == 0;
        const int leased = rc == 0 && g->type == REDIS_REPLY_STRING;
        const int ours = leased && q->token[0] && strlen(q->token) == g->len &&
                         memcmp(g->str, q->token, g->len) == 0;
        freeReplyObject(w);
        freeReplyObject(h);
        freeReplyObject(g);
        if (rc || mine || (leased && !ours) || v != q->expect) {
            /* decided without writing: end the WATCH (and drop our lease
             * when an earlier run of this save went through) */
            const char *uv[] = {"UNWATCH"};
            redisReply *u = NULL;
            if (cmd1(r, c, 1, uv, NULL, &u))
                return CONN_BROKEN;
            freeReplyObject(u);
            if (rc)
                return rc;
            if (mine) {
                if (ours) {
                    const char *dv[] = {"DEL", q->kl};
                    if (cmd1(r, c, 2, dv, NULL, &u))
                        return CONN_BROKEN;
                    freeReplyObject(u);
                }
                q->version = v;
                return 0;
            }
            q->stale = leased && !ours ? 1 : 2;
            q->stored_v = v;
            return 0;
        }
        /* the writes, in one transaction */
        const char *hs[6 + 2 + 2 * SRV_STORE_REDIS_META_FIELDS] = {
            "HSET", q->ks, "v", next, "w", q->wid, "blob", (const char *)q->blob};
        size_t hl[6 + 2 + 2 * SRV_STORE_REDIS_META_FIELDS];
        int hn = 8;
        for (int i = 0; i < SRV_STORE_REDIS_META_FIELDS; i++) {
            hs[hn++] = srv_store_redis_meta_names[i];
            hs[hn++] = q->mv[i];
        }
        for (int i = 0; i < hn; i++)
            hl[i] = strlen(hs[i]);
        hl[7] = q->len; /* the blob is binary */
        const char *mu[] = {"MULTI"};
        const char *ex[] = {"PEXPIRE", q->ks, q->ttl};
        const char *pe[] = {"PERSIST", q->ks};
        const char *z1[] = {"ZADD", q->ki, "0", q->id};
        const char *z2[] = {"ZADD", q->ko, "0", q->id};
        const char *dl[] = {"DEL", q->kl};
        const char *xe[] = {"EXEC"};
        const int ttl = strcmp(q->ttl, "0") != 0;
        int n = 0;
        int ok = redisAppendCommandArgv(c, 1, mu, NULL) == REDIS_OK && ++n &&
                 redisAppendCommandArgv(c, hn, hs, hl) == REDIS_OK && ++n &&
                 (ttl ? redisAppendCommandArgv(c, 3, ex, NULL)
                      : redisAppendCommandArgv(c, 2, pe, NULL)) == REDIS_OK &&
                 ++n && redisAppendCommandArgv(c, 4, z1, NULL) == REDIS_OK && ++n &&
                 redisAppendCommandArgv(c, 4, z2, NULL) == REDIS_OK && ++n &&
                 (!leased || (redisAppendCommandArgv(c, 2, dl, NULL) == REDIS_OK && ++n)) &&
                 redisAppendCommandArgv(c, 1, xe, NULL) == REDIS_OK && ++n;
        if (!ok) {
            r->io_errno = errno;
            return CONN_BROKEN;
        }
        /* MULTI and the queued commands: +OK / +QUEUED, or an error (then
         * EXEC answers EXECABORT) */
        for (int i = 0; i < n - 1; i++) {
            redisReply *x = NULL;
            if (next_reply(r, c, &x))
                return CONN_BROKEN;
            if (x->type == REDIS_REPLY_ERROR && rc == 0)
                rc = reply_error(r, x, "save", q->err, q->errlen);
            freeReplyObject(x);
        }
        redisReply *x = NULL;
        if (next_reply(r, c, &x))
            return CONN_BROKEN;
        if (rc == 0 && x->type == REDIS_REPLY_ERROR)
            rc = reply_error(r, x, "save", q->err, q->errlen);
        const int aborted = rc == 0 && x->type == REDIS_REPLY_NIL; /* a watched key changed */
        if (rc == 0 && !aborted && x->type != REDIS_REPLY_ARRAY)
            rc = STORE_FAIL(q->err, q->errlen, SRV_STORE_EIO,
                            "session store %s: unexpected answer to EXEC", r->shown);
        for (size_t i = 0; rc == 0 && !aborted && i < x->elements; i++)
            if (x->element[i]->type == REDIS_REPLY_ERROR)
                rc = reply_error(r, x->element[i], "save", q->err, q->errlen);
        freeReplyObject(x);
        if (rc)
            return rc;
        if (!aborted) {
            q->version = q->expect + 1;
            return 0;
        }
    }
    return STORE_FAIL(q->err, q->errlen, SRV_STORE_ESTALE,
                      "session %s kept changing while it was being saved; "
                      "this change was not saved",
                      q->id);
}

static int r_save(srv_store_backend_t *be, const char *id, const char *token, uint64_t expect,
                  const unsigned char *blob, size_t len, const srv_store_meta_t *m,
                  uint64_t *version, char *err, size_t errlen)
{
    redis_be_t *r = (redis_be_t *)be;
    char ks[KEY_MAX], kl[KEY_MAX], ki[KEY_MAX], ko[KEY_MAX], ttl[24], wid[SRV_STORE_TOKEN_MAX];
    if (srv_store_redis_key(r->ns, 's', id, ks, sizeof ks) < 0 ||
        srv_store_redis_key(r->ns, 'l', id, kl, sizeof kl) < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL, "malformed session id");
    snprintf(ki, sizeof ki, "%sidx", r->ns);
    snprintf(ko, sizeof ko, "%sidx:%s", r->ns, m->owner[0] ? m->owner : OWNER_IDX_NONE);
    snprintf(ttl, sizeof ttl, "%" PRId64, r->ttl_ms);
    token_new(r, wid, 'w');
    sav_t *q = calloc(1, sizeof *q);
    if (!q)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory");
    *q = (sav_t){.id = id,
                 .ks = ks,
                 .kl = kl,
                 .ki = ki,
                 .ko = ko,
                 .token = token ? token : "",
                 .wid = wid,
                 .ttl = ttl,
                 .expect = expect,
                 .blob = blob,
                 .len = len,
                 .err = err,
                 .errlen = errlen};
    srv_store_redis_meta_encode(m, q->mv);
    int rc = with_conn(r, save_seq, q, "save", err, errlen);
    if (rc == 0 && q->stale == 1)
        rc = STORE_FAIL(err, errlen, SRV_STORE_ESTALE,
                        "session %s is held by another replica (this one's "
                        "lease ran out): this change was not saved",
                        id);
    else if (rc == 0 && q->stale == 2)
        rc = STORE_FAIL(err, errlen, SRV_STORE_ESTALE,
                        "session %s changed on another replica meanwhile "
                        "(version %" PRIu64 " there, %" PRIu64 " here): this change was not "
                        "saved",
                        id, q->stored_v, expect);
    if (rc == 0) {
        *version = q->version;
        if (token)
            unhold(r, id, token);
    }
    free(q);
    return rc;
}

static void r_release(srv_store_backend_t *be, const char *id, const char *token)
{
    redis_be_t *r = (redis_be_t *)be;
    pthread_mutex_lock(&r->mu);
    ssize_t i = list_find(&r->held, id, token);
    if (i >= 0)
        list_del(&r->held, (size_t)i);
    if (r->queued.n >= MAX_QUEUED)
        list_del(&r->queued, 0); /* it expires by itself */
    list_add(&r->queued, id, token);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static int r_remove(srv_store_backend_t *be, const char *id, char *err, size_t errlen)
{
    redis_be_t *r = (redis_be_t *)be;
    char ks[KEY_MAX], kl[KEY_MAX], ki[KEY_MAX], ko[KEY_MAX], old[SRV_STORE_TOKEN_MAX];
    if (srv_store_redis_key(r->ns, 's', id, ks, sizeof ks) < 0 ||
        srv_store_redis_key(r->ns, 'l', id, kl, sizeof kl) < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL, "malformed session id");
    snprintf(ki, sizeof ki, "%sidx", r->ns);
    snprintf(ko, sizeof ko, "%sidx:", r->ns);
    take_queued(r, id, old);
    const char *av[] = {"EVAL", REMOVE_LUA, "3", ks, kl, ki, id, old, ko};
    int rc = 0;
    redisReply *rep = run(r, 9, av, NULL, &rc, "delete", err, errlen);
    if (!rep) {
        if (old[0])
            r_release(be, id, old);
        return rc;
    }
    long long code = 0;
    if (rep->type == REDIS_REPLY_ERROR)
        rc = reply_error(r, rep, "delete", err, errlen);
    else if (reply_int(rep, &code) < 0)
        rc = STORE_FAIL(err, errlen, SRV_STORE_EIO, "session store %s: unexpected answer to delete",
                        r->shown);
    else if (code < 0)
        rc = STORE_FAIL(err, errlen, SRV_STORE_EBUSY, "session %s is busy on another replica", id);
    else if (code == 0)
        rc = STORE_FAIL(err, errlen, SRV_STORE_ENOTFOUND, "session %s not found", id);
    freeReplyObject(rep);
    if (rc == SRV_STORE_EBUSY && old[0])
        r_release(be, id, old);
    return rc;
}

/* v[i], len[i] of array elements from first on (NULL for nil). */
static void fields(const redisReply *rep, size_t first, size_t n, const char **v, size_t *len)
{
    for (size_t i = 0; i < n; i++) {
        const redisReply *e = rep->element[first + i];
        const int s = e->type == REDIS_REPLY_STRING;
        v[i] = s ? e->str : NULL;
        len[i] = s ? e->len : 0;
    }
}

static int r_peek(srv_store_backend_t *be, const char *id, uint64_t *version, srv_store_meta_t *m,
                  char *err, size_t errlen)
{
    redis_be_t *r = (redis_be_t *)be;
    char ks[KEY_MAX];
    if (srv_store_redis_key(r->ns, 's', id, ks, sizeof ks) < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL, "malformed session id");
    const char *av[3 + SRV_STORE_REDIS_META_FIELDS] = {"HMGET", ks, "v"};
    for (int i = 0; i < SRV_STORE_REDIS_META_FIELDS; i++)
        av[3 + i] = srv_store_redis_meta_names[i];
    int rc = 0;
    redisReply *rep = run(r, 3 + SRV_STORE_REDIS_META_FIELDS, av, NULL, &rc, "read", err, errlen);
    if (!rep)
        return rc;
    if (rep->type == REDIS_REPLY_ERROR) {
        rc = reply_error(r, rep, "read", err, errlen);
    } else if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 1 + SRV_STORE_REDIS_META_FIELDS) {
        rc = STORE_FAIL(err, errlen, SRV_STORE_EIO, "session store %s: unexpected answer to HMGET",
                        r->shown);
    } else if (rep->element[0]->type != REDIS_REPLY_STRING) {
        rc = STORE_FAIL(err, errlen, SRV_STORE_ENOTFOUND, "session %s not found", id);
    } else {
        const char *v[SRV_STORE_REDIS_META_FIELDS];
        size_t l[SRV_STORE_REDIS_META_FIELDS];
        fields(rep, 1, SRV_STORE_REDIS_META_FIELDS, v, l);
        if (srv_store_redis_version_parse(rep->element[0]->str, rep->element[0]->len, version) <
                0 ||
            srv_store_redis_meta_decode(v, l, m) < 0)
            rc = STORE_FAIL(err, errlen, SRV_STORE_EIO, "session %s in %s: malformed metadata", id,
                            r->shown);
    }
    freeReplyObject(rep);
    return rc;
}

static int r_list(srv_store_backend_t *be, const char *owner, const char *after, size_t limit,
                  srv_store_entry_t *out, size_t *n, int *has_more, char *err, size_t errlen)
{
    redis_be_t *r = (redis_be_t *)be;
    *n = 0;
    *has_more = 0;
    char ki[KEY_MAX], kp[KEY_MAX], lim[24];
    if (owner)
        snprintf(ki, sizeof ki, "%sidx:%s", r->ns, owner[0] ? owner : OWNER_IDX_NONE);
    else
        snprintf(ki, sizeof ki, "%sidx", r->ns);
    snprintf(kp, sizeof kp, "%ss:", r->ns);
    snprintf(lim, sizeof lim, "%zu", limit);
    if (after && after[0] && !srv_session_id_valid(after))
        after = ""; /* not an id: the ids sort after what it is not; start over */
    const char *av[] = {"EVAL", LIST_LUA, "1", ki, kp, after ? after : "", lim};
    int rc = 0;
    redisReply *rep = run(r, 7, av, NULL, &rc, "list", err, errlen);
    if (!rep)
        return rc;
    if (rep->type == REDIS_REPLY_ERROR) {
        rc = reply_error(r, rep, "list", err, errlen);
    } else if (rep->type != REDIS_REPLY_ARRAY || rep->elements % 9) {
        rc = STORE_FAIL(err, errlen, SRV_STORE_EIO, "session store %s: unexpected answer to list",
                        r->shown);
    } else {
        for (size_t i = 0; i < rep->elements / 9 && rc == 0; i++) {
            const redisReply *e = rep->element[9 * i];
            if (*n == limit) {
                *has_more = 1;
                break;
            }
            srv_store_entry_t *o = &out[*n];
            const char *v[SRV_STORE_REDIS_META_FIELDS];
            size_t l[SRV_STORE_REDIS_META_FIELDS];
            fields(rep, 9 * i + 2, SRV_STORE_REDIS_META_FIELDS, v, l);
            const redisReply *ver = rep->element[9 * i + 1];
            if (e->type != REDIS_REPLY_STRING || e->len != SRV_SESSION_ID_LEN ||
                ver->type != REDIS_REPLY_STRING) {
                rc = STORE_FAIL(err, errlen, SRV_STORE_EIO,
                                "session store %s: malformed list entry", r->shown);
                break;
            }
            memcpy(o->id, e->str, SRV_SESSION_ID_LEN);
            o->id[SRV_SESSION_ID_LEN] = '\0';
            if (!srv_session_id_valid(o->id) ||
                srv_store_redis_version_parse(ver->str, ver->len, &o->version) < 0 ||
                srv_store_redis_meta_decode(v, l, &o->meta) < 0)
                continue; /* not one of ours: left out */
            (*n)++;
        }
    }
    freeReplyObject(rep);
    return rc;
}

static int r_health(srv_store_backend_t *be, char *why, size_t n)
{
    redis_be_t *r = (redis_be_t *)be;
    pthread_mutex_lock(&r->mu);
    int rc = 0;
    if (r->state == STATE_DOWN) {
        down_text(r, why, n);
        rc = SRV_STORE_EUNAVAIL;
    } else if (n) {
        why[0] = '\0';
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* ---- the keeper thread ---- */

/* One command on the keeper's connection: 0 and *rep, or -1 (the
 * connection is gone; the server marked down). */
static int keep_cmd(redis_be_t *r, int argc, const char **argv, redisReply **rep)
{
    *rep = r->keep ? redisCommandArgv(r->keep, argc, argv, NULL) : NULL;
    if (*rep)
        return 0;
    char why[256];
    snprintf(why, sizeof why, "%s",
             r->keep && r->keep->errstr[0] ? r->keep->errstr : "no connection");
    redisFree(r->keep);
    r->keep = NULL;
    pthread_mutex_lock(&r->mu);
    mark_down(r, why);
    pthread_mutex_unlock(&r->mu);
    return -1;
}

/* Runs script on the lease of each of l[n]; renew: *lost[i] = 1 for those
 * whose lease is no longer theirs. */
static void keep_leases(redis_be_t *r, const lease_t *l, size_t n, const char *script, int renew,
                        unsigned char *lost)
{
    char lms[24];
    snprintf(lms, sizeof lms, "%" PRId64, r->lease_ms);
    for (size_t i = 0; i < n; i++) {
        char kl[KEY_MAX];
        if (srv_store_redis_key(r->ns, 'l', l[i].id, kl, sizeof kl) < 0)
            continue;
        const char *av[] = {"EVAL", script, "1", kl, l[i].token, lms};
        redisReply *rep = NULL;
        if (keep_cmd(r, renew ? 6 : 5, av, &rep) < 0)
            return;
        if (renew && rep->type == REDIS_REPLY_INTEGER && rep->integer == 0)
            lost[i] = 1;
        freeReplyObject(rep);
    }
}

static void *keeper(void *arg)
{
    redis_be_t *r = arg;
    int64_t next_ping = 0, next_renew = now_ms() + r->lease_ms / 3, next_try = 0;
    pthread_mutex_lock(&r->mu);
    while (!r->quit) {
        int64_t t = now_ms();
        if (!r->keep || r->state != STATE_UP) {
            if (t >= next_try) { /* (re)connect */
                pthread_mutex_unlock(&r->mu);
                char why[256] = "";
                redisReply *rep = NULL;
                if (!r->keep)
                    r->keep = connect_to(r, why, sizeof why);
                if (r->keep) {
                    const char *av[] = {"PING"};
                    if (keep_cmd(r, 1, av, &rep) == 0 && rep->type == REDIS_REPLY_ERROR) {
                        snprintf(why, sizeof why, "PING: %s", rep->str);
                        redisFree(r->keep);
                        r->keep = NULL;
                    }
                    if (rep)
                        freeReplyObject(rep);
                }
                pthread_mutex_lock(&r->mu);
                if (r->keep) {
                    if (r->state == STATE_DOWN)
                        SRV_LOG(SRV_LOG_INFO, NULL,
                                "session store %s reachable again after %" PRId64 " s", r->shown,
                                (now_ms() - r->down_since_ms) / 1000);
                    r->state = STATE_UP;
                    r->why[0] = '\0';
                    next_ping = now_ms() + PING_MS;
                } else {
                    if (why[0])
                        mark_down(r, why);
                    next_try = now_ms() + r->backoff_ms;
                    r->backoff_ms =
                        r->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : r->backoff_ms * 2;
                }
                continue;
            }
        } else if (r->queued.n) { /* releases first: others may wait for them */
            lease_t batch[64];
            size_t n = r->queued.n < 64 ? r->queued.n : 64;
            memcpy(batch, r->queued.v, n * sizeof *batch);
            memmove(r->queued.v, r->queued.v + n, (r->queued.n - n) * sizeof *batch);
            r->queued.n -= n;
            r->releasing.n = 0; /* still seen by take_queued while it runs */
            for (size_t i = 0; i < n; i++)
                list_add(&r->releasing, batch[i].id, batch[i].token);
            pthread_mutex_unlock(&r->mu);
            keep_leases(r, batch, n, RELEASE_LUA, 0, NULL);
            pthread_mutex_lock(&r->mu);
            r->releasing.n = 0;
            continue;
        } else if (t >= next_renew) {
            size_t n = r->held.n;
            lease_t *copy = n ? malloc(n * sizeof *copy) : NULL;
            unsigned char *lost = n ? calloc(n, 1) : NULL;
            if (copy && lost)
                memcpy(copy, r->held.v, n * sizeof *copy);
            else
                n = 0;
            pthread_mutex_unlock(&r->mu);
            keep_leases(r, copy, n, RENEW_LUA, 1, lost);
            pthread_mutex_lock(&r->mu);
            for (size_t i = 0; i < n; i++) {
                if (!lost[i])
                    continue;
                ssize_t k = list_find(&r->held, copy[i].id, copy[i].token);
                if (k >= 0) {
                    SRV_LOG(SRV_LOG_WARN, NULL,
                            "session %s: its lease in %s was lost (another "
                            "replica may hold it now); its next save will be refused",
                            copy[i].id, r->shown);
                    list_del(&r->held, (size_t)k);
                }
            }
            free(copy);
            free(lost);
            next_renew = now_ms() + r->lease_ms / 3;
            continue;
        } else if (t >= next_ping) {
            pthread_mutex_unlock(&r->mu);
            const char *av[] = {"PING"};
            redisReply *rep = NULL;
            if (keep_cmd(r, 1, av, &rep) == 0)
                freeReplyObject(rep);
            pthread_mutex_lock(&r->mu);
            next_ping = now_ms() + PING_MS;
            continue;
        }
        /* sleep until the next thing to do (or a release is queued) */
        int64_t wake =
            r->state == STATE_UP ? (next_ping < next_renew ? next_ping : next_renew) : next_try;
        if (wake - t > 200)
            wake = t + 200;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ns = ts.tv_nsec + (wake - t) * 1000000;
        ts.tv_sec += ns / 1000000000;
        ts.tv_nsec = ns % 1000000000;
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static void r_free(srv_store_backend_t *be)
{
    redis_be_t *r = (redis_be_t *)be;
    if (!r)
        return;
    if (r->thread_started) {
        pthread_mutex_lock(&r->mu);
        r->quit = 1;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->thread, NULL);
    }
    /* leases still queued for release: once, best effort (they expire) */
    if (r->queued.n && r->state == STATE_UP && r->keep)
        keep_leases(r, r->queued.v, r->queued.n, RELEASE_LUA, 0, NULL);
    redisFree(r->keep);
    redisFree(r->cmd);
    free(r->held.v);
    free(r->queued.v);
    free(r->releasing.v);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->cmd_mu);
    free(r);
}

static const srv_store_backend_ops_t redis_ops = {.acquire = r_acquire,
                                                  .save = r_save,
                                                  .release = r_release,
                                                  .remove = r_remove,
                                                  .peek = r_peek,
                                                  .list = r_list,
                                                  .health = r_health,
                                                  .free = r_free};

int srv_store_redis_new(const srv_store_redis_opts_t *o, srv_store_backend_t **out, char *err,
                        size_t errlen)
{
    *out = NULL;
    srv_store_redis_url_t url;
    if (srv_store_redis_url_parse(o->url, &url, err, errlen) < 0)
        return -1;
    if (!o->ns || !o->ns[0] || strlen(o->ns) > 48 || o->ttl_ms < 0 || o->lease_ms < 0 ||
        o->timeout_ms < 0)
        return fail(err, errlen, "redis store: bad options");
    redis_be_t *r = calloc(1, sizeof *r);
    if (!r)
        return fail(err, errlen, "out of memory");
    r->base.ops = &redis_ops;
    r->url = url;
    srv_store_redis_url_redact(o->url, r->shown, sizeof r->shown);
    snprintf(r->ns, sizeof r->ns, "%s", o->ns);
    r->ttl_ms = o->ttl_ms;
    r->lease_ms = o->lease_ms ? o->lease_ms : DEFAULT_LEASE_MS;
    r->timeout_ms = o->timeout_ms ? o->timeout_ms : DEFAULT_TIMEOUT_MS;
    r->backoff_ms = BACKOFF_MIN_MS;
    srv_random_hex(r->replica, (sizeof r->replica - 1) / 2);
    pthread_mutex_init(&r->cmd_mu, NULL);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (pthread_create(&r->thread, NULL, keeper, r) != 0) {
        r_free(&r->base);
        return fail(err, errlen, "cannot start the session store's thread");
    }
    r->thread_started = 1;
    *out = &r->base;
    return 0;
}
