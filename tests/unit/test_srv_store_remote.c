/* server/store/store_remote.c on the tiny fixture model (env
 * DARKSERVE_TINY_MODEL): the session table in front of a shared backend
 * (server/store/store_backend.h), with two tables ("replicas") on one in-process fake
 * backend that keeps the store_backend.h contract (versions, leases) — no Redis
 * needed; tests/unit/test_srv_store_redis.c checks the Redis backend
 * itself. Covered: a session continued alternately by two replicas is
 * the same state as on one (the strong way: identical logits over a
 * greedy continuation); a replica holding an old version reads the new
 * one; a stale writer is refused and its change dropped; a lease makes the
 * other replica's acquire EBUSY; a release without persist after a change
 * drops the copy; fetch / acquire_in_memory hand-over; refresh; delete;
 * fork, export, import and list through the backend; an unreachable
 * backend (EUNAVAIL, nothing acknowledged lost). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/model.h"
#include "core/rng.h"
#include "core/state.h"
#include "server/engine/engine.h"
#include "server/store/store.h"
#include "server/store/store_backend.h"
#include "tests/unit/ctx_helpers.h"

/* The detail of the last store call that failed on the main thread (the
 * threads a test starts pass their own buffer or none). */
static char last_err[SRV_STORE_ERR_MAX];
#define ERR last_err, sizeof last_err

static core_model_t *model; /* performer, W = 4 */
static int V;

/* ---- the fake backend ---- */

typedef struct fake_entry {
    char id[SRV_SESSION_ID_LEN + 1];
    uint64_t version;
    unsigned char *blob;
    size_t len;
    srv_store_meta_t meta;
    char lease[SRV_STORE_TOKEN_MAX]; /* "" = none */
} fake_entry_t;

typedef struct fake {
    srv_store_backend_t base;
    pthread_mutex_t mu;
    fake_entry_t e[64];
    size_t n;
    unsigned next_token;
    int down;  /* every call EUNAVAIL */
    int frees; /* ops->free calls */
    int saves; /* successful saves */
} fake_t;

static fake_entry_t *fake_find(fake_t *f, const char *id)
{
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->e[i].id, id) == 0)
            return &f->e[i];
    return NULL;
}

static int fake_acquire(srv_store_backend_t *be, const char *id, uint64_t have, char *token,
                        uint64_t *version, unsigned char **blob, size_t *len, char *err,
                        size_t errlen)
{
    (void)err;
    (void)errlen;
    fake_t *f = (fake_t *)be;
    pthread_mutex_lock(&f->mu);
    fake_entry_t *e = fake_find(f, id);
    int rc = 0;
    *blob = NULL;
    if (f->down)
        rc = SRV_STORE_EUNAVAIL;
    else if (!e)
        rc = SRV_STORE_ENOTFOUND;
    else if (e->lease[0])
        rc = SRV_STORE_EBUSY;
    if (rc == 0) {
        snprintf(token, SRV_STORE_TOKEN_MAX, "tok%u", ++f->next_token);
        snprintf(e->lease, sizeof e->lease, "%s", token);
        *version = e->version;
        if (e->version != have) {
            *blob = malloc(e->len);
            memcpy(*blob, e->blob, e->len);
            *len = e->len;
        }
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int fake_save(srv_store_backend_t *be, const char *id, const char *token, uint64_t expect,
                     const unsigned char *blob, size_t len, const srv_store_meta_t *m,
                     uint64_t *version, char *err, size_t errlen)
{
    fake_t *f = (fake_t *)be;
    pthread_mutex_lock(&f->mu);
    fake_entry_t *e = fake_find(f, id);
    int rc = 0;
    if (f->down)
        rc = SRV_STORE_EUNAVAIL;
    else if (e && e->lease[0] && (!token || strcmp(e->lease, token) != 0))
        rc = SRV_STORE_ESTALE;
    else if ((e ? e->version : 0) != expect)
        rc = SRV_STORE_ESTALE;
    if (rc == 0) {
        if (!e) {
            e = &f->e[f->n++];
            memset(e, 0, sizeof *e);
            snprintf(e->id, sizeof e->id, "%s", id);
        }
        free(e->blob);
        e->blob = malloc(len);
        memcpy(e->blob, blob, len);
        e->len = len;
        e->meta = *m;
        e->version = expect + 1;
        e->lease[0] = '\0';
        *version = e->version;
        f->saves++;
    }
    pthread_mutex_unlock(&f->mu);
    if (rc < 0 && err && errlen)
        snprintf(err, errlen, "fake: %s", rc == SRV_STORE_ESTALE ? "stale" : "down");
    return rc;
}

static void fake_release(srv_store_backend_t *be, const char *id, const char *token)
{
    fake_t *f = (fake_t *)be;
    pthread_mutex_lock(&f->mu);
    fake_entry_t *e = fake_find(f, id);
    if (e && strcmp(e->lease, token) == 0)
        e->lease[0] = '\0';
    pthread_mutex_unlock(&f->mu);
}

static int fake_remove(srv_store_backend_t *be, const char *id, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    fake_t *f = (fake_t *)be;
    pthread_mutex_lock(&f->mu);
    fake_entry_t *e = fake_find(f, id);
    int rc = f->down       ? SRV_STORE_EUNAVAIL
             : !e          ? SRV_STORE_ENOTFOUND
             : e->lease[0] ? SRV_STORE_EBUSY
                           : 0;
    if (rc == 0) {
        free(e->blob);
        *e = f->e[--f->n];
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int fake_peek(srv_store_backend_t *be, const char *id, uint64_t *version,
                     srv_store_meta_t *m, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    fake_t *f = (fake_t *)be;
    pthread_mutex_lock(&f->mu);
    fake_entry_t *e = fake_find(f, id);
    int rc = f->down ? SRV_STORE_EUNAVAIL : !e ? SRV_STORE_ENOTFOUND : 0;
    if (rc == 0) {
        *version = e->version;
        *m = e->meta;
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int fake_list(srv_store_backend_t *be, const char *owner, const char *after, size_t limit,
                     srv_store_entry_t *out, size_t *n, int *has_more, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    fake_t *f = (fake_t *)be;
    pthread_mutex_lock(&f->mu);
    *n = 0;
    *has_more = 0;
    const char *cur = after;
    for (;;) { /* the next id after cur, by selection (the fake is small) */
        fake_entry_t *best = NULL;
        for (size_t i = 0; i < f->n; i++)
            if (strcmp(f->e[i].id, cur) > 0 && (!owner || !strcmp(f->e[i].meta.owner, owner)) &&
                (!best || strcmp(f->e[i].id, best->id) < 0))
                best = &f->e[i];
        if (!best)
            break;
        if (*n == limit) {
            *has_more = 1;
            break;
        }
        srv_store_entry_t *o = &out[(*n)++];
        snprintf(o->id, sizeof o->id, "%s", best->id);
        o->version = best->version;
        o->meta = best->meta;
        cur = best->id;
    }
    int rc = f->down ? SRV_STORE_EUNAVAIL : 0;
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int fake_health(srv_store_backend_t *be, char *why, size_t n)
{
    fake_t *f = (fake_t *)be;
    if (!f->down) {
        why[0] = '\0';
        return 0;
    }
    snprintf(why, n, "fake backend down");
    return SRV_STORE_EUNAVAIL;
}

static void fake_free(srv_store_backend_t *be)
{
    ((fake_t *)be)->frees++; /* the fake outlives its stores */
}

static const srv_store_backend_ops_t fake_ops = {.acquire = fake_acquire,
                                                 .save = fake_save,
                                                 .release = fake_release,
                                                 .remove = fake_remove,
                                                 .peek = fake_peek,
                                                 .list = fake_list,
                                                 .health = fake_health,
                                                 .free = fake_free};

static fake_t *fake_new(void)
{
    fake_t *f = calloc(1, sizeof *f);
    f->base.ops = &fake_ops;
    pthread_mutex_init(&f->mu, NULL);
    return f;
}

static void fake_destroy(fake_t *f)
{
    for (size_t i = 0; i < f->n; i++)
        free(f->e[i].blob);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

/* The lease of id vanishes as if it expired. */
static void fake_expire(fake_t *f, const char *id)
{
    pthread_mutex_lock(&f->mu);
    fake_entry_t *e = fake_find(f, id);
    if (e)
        e->lease[0] = '\0';
    pthread_mutex_unlock(&f->mu);
}

static int fake_leased(fake_t *f, const char *id)
{
    pthread_mutex_lock(&f->mu);
    fake_entry_t *e = fake_find(f, id);
    int r = e && e->lease[0];
    pthread_mutex_unlock(&f->mu);
    return r;
}

static uint64_t fake_version(fake_t *f, const char *id)
{
    pthread_mutex_lock(&f->mu);
    fake_entry_t *e = fake_find(f, id);
    uint64_t v = e ? e->version : 0;
    pthread_mutex_unlock(&f->mu);
    return v;
}

/* ---- helpers ---- */

static srv_store_t *replica(fake_t *f, size_t max_n)
{
    srv_store_opts_t o = {.dir = "/nonexistent/ignored",
                          .max_sessions = max_n,
                          .ttl_s = 3600,
                          .max_checkpoints = 4,
                          .model = model,
                          .backend = &f->base};
    srv_store_t *st = NULL;
    char err[512] = "";
    int rc = srv_store_new(&o, &st, err, sizeof err);
    CHECK_MSG(rc == 0, "store: %s", err);
    return st;
}

static void feed(core_attn_state_t *s, const int32_t *t, int64_t n, float *last)
{
    core_batch_seq_t sq = {.state = s,
                           .tokens = t,
                           .n_tokens = n,
                           .logits_mode = last ? CORE_LOGITS_LAST : CORE_LOGITS_NONE,
                           .logits = last};
    core_error_t err = {0};
    int rc = core_model_forward(model, &sq, 1, &err);
    CHECK_MSG(rc == 0, "forward: %s", err.msg);
}

/* Feeds n pseudo-random tokens into the context and leaves 2 pending. */
static void advance(srv_seq_ctx_t *c, int n, uint64_t seed)
{
    int32_t t[256];
    core_rng_t r;
    core_rng_seed(&r, seed);
    for (int i = 0; i < n + 2; i++)
        t[i] = (int32_t)(core_rng_u64(&r) % (uint64_t)V);
    if (c->n_pending) { /* absorb what was pending first */
        feed(c->state, c->pending, (int64_t)c->n_pending, NULL);
        srv_seq_ctx_clear_pending(c);
    }
    feed(c->state, t, n, NULL);
    for (int i = 0; i < n + 2; i++)
        core_sampler_accept(c->sampler, t[i], NULL);
    CHECK_INT_EQ(srv_seq_ctx_set_pending(c, t + n, 2), 0);
}

/* Absorbs the pending tokens, then 8 greedy steps; all logits into out
 * [9][V]. Mutates c. */
static void continue_greedy(srv_seq_ctx_t *c, float *out)
{
    if (c->n_pending)
        feed(c->state, c->pending, (int64_t)c->n_pending, out);
    else
        feed(c->state, (const int32_t[]){1}, 1, out);
    srv_seq_ctx_clear_pending(c);
    for (int s = 1; s < 9; s++) {
        const float *prev = out + (size_t)(s - 1) * V;
        int32_t best = 0;
        for (int i = 1; i < V; i++)
            if (prev[i] > prev[best])
                best = i;
        feed(c->state, &best, 1, out + (size_t)s * V);
    }
}

/* 1 if a and b continue with identical logits (both consumed, freed). */
static int same_continuation(srv_seq_ctx_t *a, srv_seq_ctx_t *b)
{
    float *la = malloc((size_t)9 * V * sizeof(float)), *lb = malloc((size_t)9 * V * sizeof(float));
    continue_greedy(a, la);
    continue_greedy(b, lb);
    int same = memcmp(la, lb, (size_t)9 * V * sizeof(float)) == 0;
    free(la);
    free(lb);
    free_ctx(a);
    free_ctx(b);
    return same;
}

/* A new session on st with content, saved; its id into id. */
static void make_saved(srv_store_t *st, uint64_t seed, char *id)
{
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_create(st, &s, ERR), 0);
    if (!s)
        return;
    advance(srv_session_ctx(s), 10, seed);
    srv_session_touch(s);
    memcpy(id, srv_session_id(s), SRV_SESSION_ID_LEN + 1);
    CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
}

/* One turn on id at st: acquire, advance by n tokens, save. The context
 * after it is copied into *after when not NULL. */
static int turn(srv_store_t *st, const char *id, int n, uint64_t seed, srv_seq_ctx_t *after)
{
    srv_session_t *s = NULL;
    int rc = srv_store_acquire(st, id, &s, ERR);
    if (rc < 0)
        return rc;
    CHECK_INT_EQ(srv_store_turn_begin(st, s, NULL, 0, 0, ERR), 0);
    advance(srv_session_ctx(s), n, seed);
    if (after)
        *after = copy_ctx(model, srv_session_ctx(s));
    return srv_store_release(st, s, 1, ERR);
}

/* A copy of id's context as st holds it after an acquire. */
static srv_seq_ctx_t held_copy(srv_store_t *st, const char *id)
{
    srv_session_t *s = NULL;
    srv_seq_ctx_t c = {0};
    CHECK_INT_EQ(srv_store_acquire(st, id, &s, ERR), 0);
    if (!s)
        return c;
    c = copy_ctx(model, srv_session_ctx(s));
    CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    return c;
}

/* ---- tests ---- */

/* The setup most tests share: a fake backend, replica a and (n == 2)
 * replica b on it, and session id (seed's tokens) saved through a. */
typedef struct fixture {
    fake_t *f;
    srv_store_t *a, *b;
    char id[SRV_SESSION_ID_LEN + 1];
} fixture_t;

static fixture_t fixture_new(int n, uint64_t seed)
{
    fixture_t x = {.f = fake_new()};
    x.a = replica(x.f, 16);
    x.b = n == 2 ? replica(x.f, 16) : NULL;
    make_saved(x.a, seed, x.id);
    return x;
}

static void fixture_free(fixture_t *x)
{
    srv_store_free(x->a);
    srv_store_free(x->b);
    fake_destroy(x->f);
}

TEST(alternating_replicas_equal_one)
{
    fake_t *f = fake_new();
    srv_store_t *a = replica(f, 16), *b = replica(f, 16);
    CHECK(srv_store_remote(a) && srv_store_remote(b));
    char id[SRV_SESSION_ID_LEN + 1] = "";
    make_saved(a, 1, id);
    CHECK_INT_EQ(fake_version(f, id), 1);
    /* the control: the same turns on one context */
    srv_seq_ctx_t ctl = held_copy(a, id);
    srv_seq_ctx_t after = {0};
    for (int t = 0; t < 4; t++) {
        srv_store_t *r = t % 2 ? a : b; /* b first: it has never seen the session */
        free_ctx(&after);
        CHECK_INT_EQ(turn(r, id, 5 + t, 100 + (uint64_t)t, &after), 0);
        advance(&ctl, 5 + t, 100 + (uint64_t)t);
        CHECK_INT_EQ(fake_version(f, id), 2 + t);
        CHECK(!fake_leased(f, id)); /* the save dropped the lease */
    }
    /* each replica reads the newest version, whatever it held */
    srv_seq_ctx_t ca = held_copy(a, id), cb = held_copy(b, id), c2 = copy_ctx(model, &ctl);
    CHECK(same_continuation(&ca, &ctl));
    CHECK(same_continuation(&cb, &c2));
    srv_session_info_t ia, ib;
    CHECK_INT_EQ(srv_store_info(a, id, &ia, ERR), 0);
    CHECK_INT_EQ(srv_store_info(b, id, &ib, ERR), 0);
    CHECK_INT_EQ(ia.turns, 4);
    CHECK_INT_EQ(ib.turns, 4);
    CHECK_INT_EQ(ia.tokens, ib.tokens);
    CHECK_INT_EQ(ia.n_checkpoints, 0); /* a shared store keeps none */
    free_ctx(&after);
    srv_store_free(a);
    srv_store_free(b);
    CHECK_INT_EQ(f->frees, 2);
    fake_destroy(f);
}

TEST(lease_makes_the_other_replica_busy)
{
    fixture_t x = fixture_new(2, 2);
    fake_t *f = x.f;
    srv_store_t *a = x.a, *b = x.b;
    const char *id = x.id;
    srv_session_t *s = NULL, *s2 = NULL;
    CHECK_INT_EQ(srv_store_acquire(a, id, &s, ERR), 0);
    CHECK(fake_leased(f, id));
    CHECK_INT_EQ(srv_store_acquire(b, id, &s2, ERR), SRV_STORE_EBUSY);
    CHECK_INT_EQ(srv_store_acquire(a, id, &s2, ERR), SRV_STORE_EBUSY); /* busy here too */
    CHECK_INT_EQ(srv_store_delete(b, id, ERR), SRV_STORE_EBUSY);
    CHECK_INT_EQ(srv_store_release(a, s, 0, ERR), 0);
    CHECK(!fake_leased(f, id));
    CHECK_INT_EQ(srv_store_acquire(b, id, &s2, ERR), 0);
    CHECK_INT_EQ(srv_store_release(b, s2, 0, ERR), 0);
    fixture_free(&x);
}

TEST(stale_writer_is_refused)
{
    fixture_t x = fixture_new(2, 3);
    fake_t *f = x.f;
    srv_store_t *a = x.a, *b = x.b;
    const char *id = x.id;
    srv_seq_ctx_t v1 = held_copy(a, id);
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_acquire(a, id, &s, ERR), 0);
    CHECK_INT_EQ(srv_store_turn_begin(a, s, NULL, 0, 0, ERR), 0);
    advance(srv_session_ctx(s), 7, 30);
    /* a's lease runs out (a stalled replica); b serves a turn meanwhile */
    fake_expire(f, id);
    srv_seq_ctx_t bv = {0};
    CHECK_INT_EQ(turn(b, id, 4, 31, &bv), 0);
    CHECK_INT_EQ(fake_version(f, id), 2);
    /* a's save names version 1: refused, and a drops what it could not save */
    CHECK_INT_EQ(srv_store_release(a, s, 1, ERR), SRV_STORE_ESTALE);
    CHECK_INT_EQ(fake_version(f, id), 2);
    srv_session_info_t si;
    CHECK_INT_EQ(srv_store_info(a, id, &si, ERR), 0);
    CHECK_INT_EQ(si.in_memory, 0);
    /* a reads b's turn next time */
    srv_seq_ctx_t ca = held_copy(a, id);
    CHECK(same_continuation(&ca, &bv));
    free_ctx(&v1);
    /* another holder's lease refuses a save too */
    CHECK_INT_EQ(srv_store_acquire(a, id, &s, ERR), 0);
    advance(srv_session_ctx(s), 2, 32);
    CHECK_INT_EQ(srv_store_turn_begin(a, s, NULL, 0, 0, ERR), 0);
    fake_expire(f, id);
    srv_session_t *sb = NULL;
    CHECK_INT_EQ(srv_store_acquire(b, id, &sb, ERR), 0); /* b now holds the lease */
    CHECK_INT_EQ(srv_store_release(a, s, 1, ERR), SRV_STORE_ESTALE);
    CHECK_INT_EQ(srv_store_release(b, sb, 0, ERR), 0);
    CHECK_INT_EQ(fake_version(f, id), 2);
    fixture_free(&x);
}

TEST(release_without_persist_drops_a_changed_copy)
{
    fixture_t x = fixture_new(1, 4);
    srv_store_t *a = x.a;
    const char *id = x.id;
    srv_seq_ctx_t saved = held_copy(a, id);
    srv_session_info_t si;
    CHECK_INT_EQ(srv_store_info(a, id, &si, ERR), 0);
    CHECK_INT_EQ(si.in_memory, 1); /* unchanged: kept */
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_acquire(a, id, &s, ERR), 0);
    advance(srv_session_ctx(s), 6, 40); /* a job that ran, then failed */
    CHECK_INT_EQ(srv_store_release(a, s, 0, ERR), 0);
    CHECK_INT_EQ(srv_store_info(a, id, &si, ERR), 0);
    CHECK_INT_EQ(si.in_memory, 0);
    srv_seq_ctx_t again = held_copy(a, id);
    CHECK(same_continuation(&again, &saved));
    fixture_free(&x);
}

TEST(fetch_hands_over_to_acquire_in_memory)
{
    fixture_t x = fixture_new(2, 5);
    fake_t *f = x.f;
    srv_store_t *b = x.b; /* x.a saved the session */
    const char *id = x.id;
    srv_session_t *s = NULL, *s2 = NULL;
    /* b has never seen it: the loop's acquire says "read it first" */
    CHECK_INT_EQ(srv_store_acquire_in_memory(b, id, &s, ERR), SRV_STORE_EEVICTED);
    /* in memory but not fetched: the same (its version must be checked) */
    srv_seq_ctx_t c = held_copy(b, id);
    free_ctx(&c);
    CHECK_INT_EQ(srv_store_acquire_in_memory(b, id, &s, ERR), SRV_STORE_EEVICTED);
    CHECK_INT_EQ(srv_store_fetch(b, id, ERR), 0);
    CHECK(fake_leased(f, id));
    CHECK_INT_EQ(srv_store_fetch(b, id, ERR), SRV_STORE_EBUSY);
    CHECK_INT_EQ(srv_store_acquire_in_memory(b, id, &s, ERR), 0);
    CHECK(s != NULL);
    CHECK_INT_EQ(srv_store_acquire_in_memory(b, id, &s2, ERR), SRV_STORE_EBUSY);
    CHECK_INT_EQ(srv_store_release(b, s, 0, ERR), 0);
    CHECK(!fake_leased(f, id));
    /* a fetch nobody takes is given back */
    CHECK_INT_EQ(srv_store_fetch(b, id, ERR), 0);
    srv_store_unfetch(b, id);
    CHECK(!fake_leased(f, id));
    CHECK_INT_EQ(srv_store_acquire_in_memory(b, id, &s, ERR), SRV_STORE_EEVICTED);
    srv_store_unfetch(b, id); /* no-op */
    /* a session created here and never saved needs no backend */
    CHECK_INT_EQ(srv_store_create(b, &s, ERR), 0);
    char nid[SRV_SESSION_ID_LEN + 1];
    memcpy(nid, srv_session_id(s), sizeof nid);
    CHECK_INT_EQ(srv_store_release(b, s, 0, ERR), 0);
    CHECK_INT_EQ(srv_store_acquire_in_memory(b, nid, &s, ERR), 0);
    CHECK_INT_EQ(srv_store_release(b, s, 0, ERR), 0);
    CHECK_INT_EQ(srv_store_fetch(b, "nothex", ERR), SRV_STORE_EINVAL);
    fixture_free(&x);
}

TEST(refresh_and_delete)
{
    fixture_t x = fixture_new(2, 6);
    fake_t *f = x.f;
    srv_store_t *a = x.a, *b = x.b;
    const char *id = x.id;
    srv_session_info_t si;
    CHECK_INT_EQ(srv_store_info(b, id, &si, ERR), SRV_STORE_ENOTFOUND);
    CHECK_INT_EQ(srv_store_refresh(b, id, ERR), 0);
    CHECK_INT_EQ(srv_store_info(b, id, &si, ERR), 0);
    srv_session_info_t ia;
    CHECK_INT_EQ(srv_store_info(a, id, &ia, ERR), 0);
    CHECK_INT_EQ(si.tokens, ia.tokens);
    CHECK_INT_EQ(si.created, ia.created);
    CHECK_INT_EQ((long long)si.state_bytes, (long long)ia.state_bytes);
    CHECK_INT_EQ(si.in_memory, 0);
    /* b holds a copy; a moves the session on; b's refresh drops the copy */
    srv_seq_ctx_t c = held_copy(b, id);
    free_ctx(&c);
    CHECK_INT_EQ(turn(a, id, 3, 60, NULL), 0);
    CHECK_INT_EQ(srv_store_refresh(b, id, ERR), 0);
    CHECK_INT_EQ(srv_store_info(b, id, &si, ERR), 0);
    CHECK_INT_EQ(si.in_memory, 0);
    CHECK_INT_EQ(si.turns, 1);
    CHECK_INT_EQ(srv_store_refresh(b, "0123456789abcdef0123456789abcdef", ERR),
                 SRV_STORE_ENOTFOUND);
    CHECK_INT_EQ(srv_store_refresh(b, "xyz", ERR), SRV_STORE_EINVAL);
    /* delete on a; b finds out at its next acquire (and forgets it) */
    CHECK_INT_EQ(srv_store_delete(a, id, ERR), 0);
    CHECK_INT_EQ(srv_store_info(a, id, &si, ERR), SRV_STORE_ENOTFOUND);
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_acquire(b, id, &s, ERR), SRV_STORE_ENOTFOUND);
    CHECK_INT_EQ(srv_store_info(b, id, &si, ERR), SRV_STORE_ENOTFOUND);
    CHECK_INT_EQ(srv_store_delete(b, id, ERR), SRV_STORE_ENOTFOUND);
    /* a session never saved is deleted here only */
    CHECK_INT_EQ(srv_store_create(a, &s, ERR), 0);
    char nid[SRV_SESSION_ID_LEN + 1];
    memcpy(nid, srv_session_id(s), sizeof nid);
    CHECK_INT_EQ(srv_store_release(a, s, 0, ERR), 0);
    CHECK_INT_EQ(srv_store_delete(a, nid, ERR), 0);
    CHECK_INT_EQ(f->n, 0);
    fixture_free(&x);
}

TEST(fork_export_import_list)
{
    fixture_t x = fixture_new(2, 7);
    fake_t *f = x.f;
    srv_store_t *a = x.a, *b = x.b;
    const char *id = x.id;
    char fid[SRV_SESSION_ID_LEN + 1] = "";
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_acquire(a, id, &s, ERR), 0);
    CHECK_INT_EQ(srv_session_set_owner(s, "0123456789abcdef0123456789abcdef", ERR), 0);
    CHECK_INT_EQ(srv_store_release(a, s, 1, ERR), 0);
    /* fork on b (it reads the source), the copy saved for everyone */
    CHECK_INT_EQ(srv_store_fork_owned(b, id, NULL, fid, ERR), 0);
    CHECK_INT_EQ(fake_version(f, fid), 1);
    srv_seq_ctx_t c1 = held_copy(a, fid), c2 = held_copy(a, id);
    CHECK(same_continuation(&c1, &c2));
    /* export on b equals export on a; import of it on a new session */
    void *ba = NULL, *bb = NULL;
    size_t la = 0, lb = 0;
    CHECK_INT_EQ(srv_store_export(a, id, &ba, &la, ERR), 0);
    CHECK_INT_EQ(srv_store_export(b, id, &bb, &lb, ERR), 0);
    CHECK(la == lb && la > 0 && memcmp(ba, bb, la) == 0);
    char nid[SRV_SESSION_ID_LEN + 1] = "";
    make_saved(b, 8, nid);
    char err[256] = "";
    CHECK_INT_EQ(srv_store_import(a, nid, ba, la, err, sizeof err), 0);
    CHECK_INT_EQ(fake_version(f, nid), 2);
    c1 = held_copy(b, nid);
    c2 = held_copy(b, id);
    CHECK(same_continuation(&c1, &c2));
    /* a damaged blob is refused, the session unchanged */
    ((unsigned char *)bb)[lb / 2] ^= 0x5a;
    CHECK_INT_EQ(srv_store_import(b, nid, bb, lb, err, sizeof err), SRV_STORE_EMISMATCH);
    CHECK_MSG(err[0] != '\0', "no message");
    CHECK_INT_EQ(fake_version(f, nid), 2);
    free(ba);
    free(bb);
    /* a pending reply that does not follow its grammar is refused */
    static const char gram[] = "root ::= \"{\" [a-z]* \"}\"";
    CHECK_INT_EQ(srv_store_acquire(a, id, &s, ERR), 0);
    if (s) {
        CHECK_INT_EQ(srv_session_set_pending_grammar(s, gram, strlen(gram), "x{", 2, ERR), 0);
        CHECK_INT_EQ(srv_store_release(a, s, 1, ERR), 0);
    }
    CHECK_INT_EQ(srv_store_export(a, id, &ba, &la, ERR), 0);
    err[0] = '\0';
    CHECK_INT_EQ(srv_store_import(a, nid, ba, la, err, sizeof err), SRV_STORE_EMISMATCH);
    CHECK_MSG(strstr(err, "does not follow the pending grammar") != NULL, "got: %s", err);
    CHECK_INT_EQ(fake_version(f, nid), 2);
    free(ba);
    /* list from either replica: everything, ordered; by owner */
    srv_session_info_t out[8];
    size_t n = 0;
    int more = 0;
    CHECK_INT_EQ(srv_store_list_owned(b, NULL, NULL, 8, out, &n, &more, ERR), 0);
    CHECK_INT_EQ(n, 3);
    CHECK_INT_EQ(more, 0);
    CHECK(strcmp(out[0].id, out[1].id) < 0 && strcmp(out[1].id, out[2].id) < 0);
    CHECK_INT_EQ(srv_store_list_owned(b, NULL, NULL, 2, out, &n, &more, ERR), 0);
    CHECK_INT_EQ(n, 2);
    CHECK_INT_EQ(more, 1);
    CHECK_INT_EQ(
        srv_store_list_owned(b, "0123456789abcdef0123456789abcdef", NULL, 8, out, &n, &more, ERR),
        0);
    CHECK_INT_EQ(n, 2); /* the session and its fork (which kept its owner) */
    fixture_free(&x);
}

TEST(unreachable_backend)
{
    fake_t *f = fake_new();
    srv_store_t *a = replica(f, 16);
    char why[128] = "x";
    CHECK_INT_EQ(srv_store_health(a, why, sizeof why), 0);
    CHECK_STR_EQ(why, "");
    char id[SRV_SESSION_ID_LEN + 1] = "";
    make_saved(a, 9, id);
    srv_seq_ctx_t acked = {0};
    CHECK_INT_EQ(turn(a, id, 3, 90, &acked), 0);
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_acquire(a, id, &s, ERR), 0);
    CHECK_INT_EQ(srv_store_turn_begin(a, s, NULL, 0, 0, ERR), 0);
    advance(srv_session_ctx(s), 4, 91);
    f->down = 1;
    CHECK_INT_EQ(srv_store_health(a, why, sizeof why), SRV_STORE_EUNAVAIL);
    CHECK_STR_EQ(why, "fake backend down");
    /* the turn in flight cannot be saved: not acknowledged, dropped */
    CHECK_INT_EQ(srv_store_release(a, s, 1, ERR), SRV_STORE_EUNAVAIL);
    CHECK_INT_EQ(srv_store_acquire(a, id, &s, ERR), SRV_STORE_EUNAVAIL);
    CHECK_INT_EQ(srv_store_fetch(a, id, ERR), SRV_STORE_EUNAVAIL);
    CHECK_INT_EQ(srv_store_refresh(a, id, ERR), SRV_STORE_EUNAVAIL);
    CHECK_INT_EQ(srv_store_delete(a, id, ERR), SRV_STORE_EUNAVAIL);
    void *b = NULL;
    size_t bl = 0;
    CHECK_INT_EQ(srv_store_export(a, id, &b, &bl, ERR), SRV_STORE_EUNAVAIL);
    srv_session_info_t out[2];
    size_t n = 0;
    int more = 0;
    CHECK_INT_EQ(srv_store_list_owned(a, NULL, NULL, 2, out, &n, &more, ERR), SRV_STORE_EUNAVAIL);
    /* a new session cannot be saved either */
    CHECK_INT_EQ(srv_store_create(a, &s, ERR), 0);
    CHECK_INT_EQ(srv_store_release(a, s, 1, ERR), SRV_STORE_EUNAVAIL);
    f->down = 0;
    fake_expire(f, id); /* the lease of the failed turn expires */
    /* what was acknowledged is what is there */
    srv_seq_ctx_t now = held_copy(a, id);
    CHECK(same_continuation(&now, &acked));
    CHECK_INT_EQ(fake_version(f, id), 2);
    srv_store_free(a);
    fake_destroy(f);
}

TEST(memory_bound_drops_clean_copies)
{
    fake_t *f = fake_new();
    srv_store_t *a = replica(f, 2);
    char id[3][SRV_SESSION_ID_LEN + 1];
    for (int i = 0; i < 3; i++)
        make_saved(a, 20 + (uint64_t)i, id[i]);
    size_t mem = 0, saved = 0;
    srv_store_stats(a, &mem, &saved, NULL);
    CHECK(mem <= 2);
    CHECK_INT_EQ(saved, 3);
    CHECK_INT_EQ(f->saves, 3); /* dropping a copy writes nothing */
    for (int i = 0; i < 3; i++) {
        srv_seq_ctx_t c = held_copy(a, id[i]);
        free_ctx(&c);
    }
    CHECK_INT_EQ(f->saves, 3);
    /* the sweep forgets copies unused for the TTL, not the sessions */
    CHECK_INT_EQ(srv_store_sweep(a, (int64_t)time(NULL) + 7200, ERR), 0);
    srv_store_stats(a, &mem, &saved, NULL);
    CHECK_INT_EQ(mem, 0);
    CHECK_INT_EQ(f->n, 3);
    srv_store_free(a);
    fake_destroy(f);
}

int main(void)
{
    const char *tiny = getenv("DARKSERVE_TINY_MODEL");
    if (!tiny) {
        printf("DARKSERVE_TINY_MODEL is not set\n");
        return 1;
    }
    core_model_opts_t o = {
        .attn_kind = CORE_ATTN_PERFORMER, .n_features = 16, .window = 4, .seed = 5};
    core_error_t err = {0};
    if (core_model_load(tiny, &o, &model, &err) < 0) {
        printf("load: %s\n", err.msg);
        return 1;
    }
    V = core_model_info(model)->n_vocab;
    RUN(alternating_replicas_equal_one);
    RUN(lease_makes_the_other_replica_busy);
    RUN(stale_writer_is_refused);
    RUN(release_without_persist_drops_a_changed_copy);
    RUN(fetch_hands_over_to_acquire_in_memory);
    RUN(refresh_and_delete);
    RUN(fork_export_import_list);
    RUN(unreachable_backend);
    RUN(memory_bound_drops_clean_copies);
    core_model_free(model);
    return CHECK_DONE();
}
