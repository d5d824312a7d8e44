/* The session store (server/store/store.h) on the tiny fixture model (env DARKSERVE_TINY_MODEL):
 * session lifecycle and busy rules, ids, persistence across a restart, LRU
 * eviction and reload, TTL, fork, export/import and their refusals, write
 * failures (injected, and a directory where the temp file goes) and crash
 * leftovers (a torn session file is listed and reported as such when
 * used). "Same state" is checked the strong way: the reloaded session and an
 * in-memory copy taken before it left memory give memcmp-identical logits
 * over a greedy continuation. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core/attn/attn_linear.h"
#include "core/attn/features.h"
#include "core/model.h"
#include "core/rng.h"
#include "core/state.h"
#include "core/crc32.h"
#include "server/engine/engine.h"
#include "server/store/store.h"
#include "server/store/store_test.h"
#include "tests/unit/ctx_helpers.h"

/* The detail of the last store call that failed on the main thread (the
 * threads a test starts pass their own buffer or none). */
static char last_err[SRV_STORE_ERR_MAX];
#define ERR last_err, sizeof last_err

static core_model_t *model;   /* performer, W = 4 */
static core_model_t *model_x; /* exact attention */
static core_model_t *model_m; /* linear with exact memory rows */
static int V;

/* ---- helpers ---- */

static char *mkdir_tmp(void)
{
    char *d = strdup("/tmp/darkserve_sess_XXXXXX");
    if (!mkdtemp(d)) {
        free(d);
        return NULL;
    }
    return d;
}

static void rm_rf(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)) != NULL) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                continue;
            char p[512];
            snprintf(p, sizeof p, "%s/%s", path, de->d_name);
            struct stat sb;
            if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
                rm_rf(p);
            else
                unlink(p);
        }
        closedir(d);
    }
    rmdir(path);
}

static srv_store_t *open_store(const char *dir, core_model_t *m, size_t max_n, size_t max_b,
                               int64_t ttl, const char *fp)
{
    srv_store_opts_t o = {.dir = dir, .max_sessions = max_n, .max_bytes = max_b, .ttl_s = ttl,
                          .model = m, .fingerprint = fp};
    srv_store_t *st = NULL;
    char err[512] = "";
    int rc = srv_store_new(&o, &st, err, sizeof err);
    CHECK_MSG(rc == 0, "store: %s", err);
    return st;
}

static int feed(core_model_t *m, core_attn_state_t *s, const int32_t *t, int64_t n, float *last)
{
    core_batch_seq_t sq = {.state = s, .tokens = t, .n_tokens = n,
                           .logits_mode = last ? CORE_LOGITS_LAST : CORE_LOGITS_NONE,
                           .logits = last};
    core_error_t err = {0};
    int rc = core_model_forward(m, &sq, 1, &err);
    CHECK_MSG(rc == 0, "forward: %s", err.msg);
    return rc;
}

/* Feeds n pseudo-random tokens into the context and leaves 2 pending. */
static void advance(core_model_t *m, srv_seq_ctx_t *c, int n, uint64_t seed)
{
    int32_t t[256];
    core_rng_t r;
    core_rng_seed(&r, seed);
    for (int i = 0; i < n + 2; i++)
        t[i] = (int32_t)(core_rng_u64(&r) % (uint64_t)V);
    feed(m, c->state, t, n, NULL);
    for (int i = 0; i < n + 2; i++)
        core_sampler_accept(c->sampler, t[i], NULL);
    CHECK_INT_EQ(srv_seq_ctx_set_pending(c, t + n, 2), 0);
}

/* Absorbs the pending tokens, then 12 greedy steps; all logits into out
 * [13][V]. Mutates c. */
static void continue_greedy(core_model_t *m, srv_seq_ctx_t *c, float *out)
{
    if (c->n_pending)
        feed(m, c->state, c->pending, (int64_t)c->n_pending, out);
    else
        feed(m, c->state, (const int32_t[]){1}, 1, out);
    srv_seq_ctx_clear_pending(c);
    for (int s = 1; s < 13; s++) {
        const float *prev = out + (size_t)(s - 1) * V;
        int32_t best = 0;
        for (int i = 1; i < V; i++)
            if (prev[i] > prev[best])
                best = i;
        feed(m, c->state, &best, 1, out + (size_t)s * V);
    }
}

/* 1 if ctx a and b continue with identical logits (both are consumed). */
static int same_continuation(core_model_t *m, srv_seq_ctx_t *a, srv_seq_ctx_t *b)
{
    float *la = malloc((size_t)13 * V * sizeof(float)), *lb = malloc((size_t)13 * V * sizeof(float));
    continue_greedy(m, a, la);
    continue_greedy(m, b, lb);
    int same = memcmp(la, lb, (size_t)13 * V * sizeof(float)) == 0;
    free(la);
    free(lb);
    return same;
}

static int file_exists(const char *dir, const char *name)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static unsigned char *read_all(const char *dir, const char *name, size_t *len)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    *len = 0;
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, f);
    fclose(f);
    return b;
}

/* A session with content, released (persist as asked); its id into id. */
static void make_session(srv_store_t *st, core_model_t *m, uint64_t seed, int persist, char *id)
{
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_create(st, &s, ERR), 0);
    if (!s)
        return;
    advance(m, srv_session_ctx(s), 20 + (int)(seed % 13), seed);
    srv_session_touch(s);
    memcpy(id, srv_session_id(s), 33);
    CHECK_INT_EQ(srv_store_release(st, s, persist, ERR), 0);
}

/* Copy of session id's context (acquires and releases it). */
static srv_seq_ctx_t snapshot(srv_store_t *st, core_model_t *m, const char *id)
{
    srv_session_t *s = NULL;
    srv_seq_ctx_t r = {0};
    int rc = srv_store_acquire(st, id, &s, ERR);
    CHECK_MSG(rc == 0, "acquire %s: %s", id, last_err);
    if (rc)
        return r;
    r = copy_ctx(m, srv_session_ctx(s));
    CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    return r;
}

/* Acquires id and checks it continues like ref (consumes ref). */
static void check_same(srv_store_t *st, core_model_t *m, const char *id, srv_seq_ctx_t *ref,
                       const char *what)
{
    srv_session_t *s = NULL;
    int rc = srv_store_acquire(st, id, &s, ERR);
    CHECK_MSG(rc == 0, "%s: acquire: %s", what, last_err);
    if (rc) {
        free_ctx(ref);
        return;
    }
    srv_seq_ctx_t mine = copy_ctx(m, srv_session_ctx(s));
    CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    CHECK_MSG(same_continuation(m, &mine, ref), "%s: continuation differs", what);
    free_ctx(&mine);
    free_ctx(ref);
}

/* ---- lifecycle ---- */

TEST(create_acquire_release_delete)
{
    char *dir = mkdir_tmp();
    srv_store_t *st = open_store(dir, model, 0, 0, 0, NULL);
    if (!st)
        goto out;
    srv_session_t *s = NULL, *s2 = NULL;
    CHECK_INT_EQ(srv_store_create(st, &s, ERR), 0);
    char id[33];
    memcpy(id, srv_session_id(s), 33);
    CHECK(srv_session_id_valid(id));
    CHECK_INT_EQ(srv_session_tokens(s), 0);
    srv_session_info_t in;
    CHECK_INT_EQ(srv_store_info(st, id, &in, ERR), 0);
    CHECK(in.busy == 1 && in.in_memory == 1 && in.on_disk == 0 && in.tokens == 0);
    CHECK(in.created > 0 && in.created <= (int64_t)time(NULL));
    CHECK_INT_EQ(srv_store_acquire(st, id, &s2, ERR), SRV_STORE_EBUSY);
    CHECK_INT_EQ(srv_store_delete(st, id, ERR), SRV_STORE_EBUSY);
    char nid[33];
    CHECK_INT_EQ(srv_store_fork_owned(st, id, NULL, nid, ERR), SRV_STORE_EBUSY);
    void *blob = NULL;
    size_t blen = 0;
    CHECK_INT_EQ(srv_store_export(st, id, &blob, &blen, ERR), SRV_STORE_EBUSY);
    advance(model, srv_session_ctx(s), 10, 1);
    CHECK_INT_EQ(srv_session_tokens(s), 12);
    CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
    CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), SRV_STORE_EINVAL); /* not held any more */
    CHECK(file_exists(dir, id));
    CHECK_INT_EQ(srv_store_info(st, id, &in, ERR), 0);
    CHECK(in.busy == 0 && in.on_disk == 1 && in.tokens == 12 && in.state_bytes > 0);
    size_t flen = 0;
    free(read_all(dir, id, &flen));
    CHECK_INT_EQ(in.state_bytes, flen);
    CHECK_INT_EQ(srv_store_acquire(st, id, &s2, ERR), 0);
    CHECK(s2 == s);
    CHECK_INT_EQ(srv_store_release(st, s2, 0, ERR), 0);
    CHECK_INT_EQ(srv_store_delete(st, id, ERR), 0);
    CHECK(!file_exists(dir, id));
    CHECK_INT_EQ(srv_store_acquire(st, id, &s2, ERR), SRV_STORE_ENOTFOUND);
    CHECK_INT_EQ(srv_store_delete(st, id, ERR), SRV_STORE_ENOTFOUND);
    CHECK_INT_EQ(srv_store_info(st, id, &in, ERR), SRV_STORE_ENOTFOUND);
    CHECK(strstr(last_err, id) != NULL);
    CHECK_STR_EQ(srv_store_strerror(SRV_STORE_EBUSY), "session busy");

    /* list: by id, paged */
    char ids[7][33];
    for (int i = 0; i < 7; i++)
        make_session(st, model, 100 + (uint64_t)i, i % 2, ids[i]);
    srv_session_info_t page[3];
    size_t n = 0, total = 0;
    int more = 1;
    char after[33] = "";
    char prev[33] = "";
    while (more) {
        CHECK_INT_EQ(srv_store_list_owned(st, NULL, after, 3, page, &n, &more, ERR), 0);
        for (size_t i = 0; i < n; i++) {
            CHECK(strcmp(page[i].id, prev) > 0);
            memcpy(prev, page[i].id, 33);
        }
        total += n;
        if (n)
            memcpy(after, page[n - 1].id, 33);
        if (!n)
            break;
    }
    CHECK_INT_EQ(total, 7);
    size_t mem = 0, disk = 0, bytes = 0;
    srv_store_stats(st, &mem, &disk, &bytes);
    CHECK_INT_EQ(mem, 7);
    CHECK_INT_EQ(disk, 3);
    CHECK(bytes > 0);
    srv_store_free(st);
out:
    rm_rf(dir);
    free(dir);
}

static int cmp_id(const void *a, const void *b)
{
    return strcmp(a, b);
}

TEST(ids_unique_and_validated)
{
    srv_store_t *st = open_store(NULL, model, 0, 0, 0, NULL);
    if (!st)
        return;
    enum { N = 10000 };
    char(*ids)[33] = malloc(sizeof(*ids) * N);
    int valid = 1;
    for (int i = 0; i < N; i++) {
        srv_session_t *s = NULL;
        if (srv_store_create(st, &s, ERR) != 0) {
            CHECK_MSG(0, "create %d: %s", i, last_err);
            break;
        }
        memcpy(ids[i], srv_session_id(s), 33);
        valid &= srv_session_id_valid(ids[i]) && strlen(ids[i]) == 32;
        for (int k = 0; k < 32; k++)
            valid &= (ids[i][k] >= '0' && ids[i][k] <= '9') || (ids[i][k] >= 'a' && ids[i][k] <= 'f');
        srv_store_release(st, s, 0, ERR);
        srv_store_delete(st, ids[i], ERR);
    }
    CHECK(valid);
    qsort(ids, N, 33, cmp_id);
    int dup = 0;
    for (int i = 1; i < N; i++)
        dup += strcmp(ids[i - 1], ids[i]) == 0;
    CHECK_INT_EQ(dup, 0);
    free(ids);

    /* Malformed ids are refused before any lookup or path. */
    char nul[40];
    memcpy(nul, "0123456789abcdef0123456789abcdef", 33);
    nul[10] = '\0';
    const char *bad[] = {"../x", "0123456789ABCDEF0123456789abcdef",
                         "0123456789abcdef0123456789abcde", "0123456789abcdef0123456789abcdef0",
                         "", "0123456789abcdef0123456789abcde/", "../../../../etc/passwd", nul};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        srv_session_t *s = NULL;
        srv_session_info_t in;
        char nid[33];
        void *b = NULL;
        size_t bl = 0;
        CHECK_INT_EQ(srv_store_acquire(st, bad[i], &s, ERR), SRV_STORE_EINVAL);
        CHECK_INT_EQ(srv_store_delete(st, bad[i], ERR), SRV_STORE_EINVAL);
        CHECK_INT_EQ(srv_store_info(st, bad[i], &in, ERR), SRV_STORE_EINVAL);
        CHECK_INT_EQ(srv_store_fork_owned(st, bad[i], NULL, nid, ERR), SRV_STORE_EINVAL);
        CHECK_INT_EQ(srv_store_export(st, bad[i], &b, &bl, ERR), SRV_STORE_EINVAL);
        CHECK_INT_EQ(srv_store_import(st, bad[i], "x", 1, NULL, 0), SRV_STORE_EINVAL);
    }
    CHECK(!srv_session_id_valid(NULL));
    CHECK(srv_session_id_valid("0123456789abcdef0123456789abcdef"));
    srv_store_free(st);
}

/* ---- persistence ---- */

TEST(persist_and_reopen)
{
    char *dir = mkdir_tmp();
    srv_store_t *st = open_store(dir, model, 0, 0, 0, NULL);
    if (!st)
        goto out;
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_create(st, &s, ERR), 0);
    char a[33], b[33], c[33];
    memcpy(a, srv_session_id(s), 33);
    advance(model, srv_session_ctx(s), 40, 7);
    srv_session_set_turn_open(s, 1);
    srv_session_set_has_chat(s, 1);
    srv_session_touch(s);
    CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
    make_session(st, model, 8, 1, b);
    make_session(st, model, 9, 0, c); /* never written */
    srv_session_info_t ia, ib;
    CHECK_INT_EQ(srv_store_info(st, a, &ia, ERR), 0);
    CHECK_INT_EQ(srv_store_info(st, b, &ib, ERR), 0);
    srv_seq_ctx_t ra = snapshot(st, model, a), rb = snapshot(st, model, b);
    srv_store_free(st);

    /* A second store may not open the same directory while one has it. */
    st = open_store(dir, model, 0, 0, 0, NULL);
    if (st) {
        srv_store_t *st2 = NULL;
        srv_store_opts_t o = {.dir = dir, .model = model};
        char err[256] = "";
        CHECK_INT_EQ(srv_store_new(&o, &st2, err, sizeof err), SRV_STORE_EIO);
        CHECK(strstr(err, "in use") != NULL);
        CHECK(st2 == NULL);

        size_t mem = 9, disk = 9;
        srv_store_stats(st, &mem, &disk, NULL);
        CHECK_INT_EQ(mem, 0);
        CHECK_INT_EQ(disk, 2);
        srv_session_info_t ja, jb;
        CHECK_INT_EQ(srv_store_info(st, a, &ja, ERR), 0);
        CHECK_INT_EQ(srv_store_info(st, b, &jb, ERR), 0);
        CHECK_INT_EQ(srv_store_info(st, c, &jb, ERR), SRV_STORE_ENOTFOUND);
        CHECK_INT_EQ(srv_store_info(st, b, &jb, ERR), 0);
        CHECK(ja.on_disk == 1 && ja.in_memory == 0 && ja.tokens == ia.tokens &&
              ja.tokens == 42 && ja.created == ia.created && ja.last_used == ia.last_used &&
              ja.state_bytes == ia.state_bytes);
        CHECK(jb.tokens == ib.tokens);
        CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), 0);
        if (s) {
            CHECK_INT_EQ(srv_session_turn_open(s), 1);
            CHECK_INT_EQ(srv_session_has_chat(s), 1);
            CHECK_INT_EQ(srv_session_tokens(s), 42);
            srv_seq_ctx_t *x = srv_session_ctx(s);
            CHECK(x->n_pending == 2 && ra.n_pending == 2 &&
                  memcmp(x->pending, ra.pending, 2 * sizeof(int32_t)) == 0);
            CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
        }
        check_same(st, model, a, &ra, "reopened a");
        check_same(st, model, b, &rb, "reopened b");
        srv_store_free(st);
        /* Same model, other attention: the files are not this server's. */
        st = open_store(dir, model_x, 0, 0, 1, NULL);
        if (st) {
            size_t ndisk = 9;
            srv_store_stats(st, NULL, &ndisk, NULL);
            CHECK_INT_EQ(ndisk, 0);
            CHECK_INT_EQ(srv_store_info(st, a, &ja, ERR), SRV_STORE_ENOTFOUND);
            CHECK_INT_EQ(srv_store_sweep(st, (int64_t)time(NULL) + 1000, ERR), 0);
            CHECK(file_exists(dir, a) && file_exists(dir, b));
            srv_store_free(st);
        }
    } else {
        free_ctx(&ra);
        free_ctx(&rb);
    }
out:
    rm_rf(dir);
    free(dir);
}

TEST(directory_checks)
{
    char *dir = mkdir_tmp();
    char sub[512], file[512];
    snprintf(sub, sizeof sub, "%s/a/b/sessions", dir);
    srv_store_t *st = open_store(sub, model, 0, 0, 0, NULL);
    struct stat sb;
    CHECK(stat(sub, &sb) == 0 && S_ISDIR(sb.st_mode) && (sb.st_mode & 0777) == 0700);
    srv_store_free(st);
    snprintf(file, sizeof file, "%s/plainfile", dir);
    FILE *f = fopen(file, "w");
    fclose(f);
    srv_store_opts_t o = {.dir = file, .model = model};
    char err[256] = "";
    st = NULL;
    CHECK_INT_EQ(srv_store_new(&o, &st, err, sizeof err), SRV_STORE_EIO);
    CHECK(strstr(err, file) != NULL);
    o.model = NULL;
    CHECK_INT_EQ(srv_store_new(&o, &st, err, sizeof err), SRV_STORE_EINVAL);
    rm_rf(dir);
    free(dir);
}

/* ---- eviction ---- */

TEST(lru_eviction_by_count_and_bytes)
{
    char *dir = mkdir_tmp();
    srv_store_t *st = open_store(dir, model, 3, 0, 0, NULL);
    if (!st)
        goto out;
    char ids[5][33];
    srv_seq_ctx_t refs[5];
    for (int i = 0; i < 5; i++) {
        make_session(st, model, 20 + (uint64_t)i, 0, ids[i]);
        refs[i] = snapshot(st, model, ids[i]);
    }
    size_t mem = 0, disk = 0;
    srv_store_stats(st, &mem, &disk, NULL);
    CHECK_INT_EQ(mem, 3);
    CHECK_INT_EQ(disk, 2);
    srv_session_info_t in;
    for (int i = 0; i < 5; i++) {
        CHECK_INT_EQ(srv_store_info(st, ids[i], &in, ERR), 0);
        CHECK_MSG(in.in_memory == (i >= 2) && in.on_disk == (i < 2), "session %d: mem %d disk %d",
                  i, in.in_memory, in.on_disk);
        CHECK_INT_EQ(file_exists(dir, ids[i]), i < 2);
    }
    /* Evicted ones load back; acquiring 0 evicts the least recent (2). */
    check_same(st, model, ids[0], &refs[0], "evicted 0");
    CHECK_INT_EQ(srv_store_info(st, ids[2], &in, ERR), 0);
    CHECK(!in.in_memory && in.on_disk);
    for (int i = 1; i < 5; i++)
        check_same(st, model, ids[i], &refs[i], "after eviction");
    srv_store_free(st);
    rm_rf(dir);

    /* By bytes: room for two sessions' memory. */
    st = open_store(dir, model, 0, 0, 0, NULL);
    if (!st)
        goto out;
    char one[33];
    make_session(st, model, 30, 0, one);
    size_t per = 0;
    srv_store_stats(st, NULL, NULL, &per);
    srv_store_free(st);
    rm_rf(dir);
    st = open_store(dir, model, 0, per * 5 / 2, 0, NULL);
    if (!st)
        goto out;
    for (int i = 0; i < 5; i++) {
        make_session(st, model, 40 + (uint64_t)i, 0, ids[i]);
        refs[i] = snapshot(st, model, ids[i]);
    }
    size_t bytes = 0;
    srv_store_stats(st, &mem, &disk, &bytes);
    CHECK_INT_EQ(mem, 2);
    CHECK_INT_EQ(disk, 3);
    CHECK(bytes <= per * 5 / 2);
    for (int i = 0; i < 5; i++)
        check_same(st, model, ids[i], &refs[i], "byte eviction");
    srv_store_free(st);

    /* Full: every session in memory busy. */
    rm_rf(dir);
    st = open_store(dir, model, 2, 0, 0, NULL);
    if (!st)
        goto out;
    srv_session_t *h[3] = {NULL, NULL, NULL};
    CHECK_INT_EQ(srv_store_create(st, &h[0], ERR), 0);
    CHECK_INT_EQ(srv_store_create(st, &h[1], ERR), 0);
    CHECK_INT_EQ(srv_store_create(st, &h[2], ERR), SRV_STORE_EFULL);
    CHECK(strstr(last_err, "2 sessions in memory") != NULL);
    srv_store_release(st, h[0], 0, ERR);
    CHECK_INT_EQ(srv_store_create(st, &h[2], ERR), 0); /* h[0] spilled to disk */
    srv_store_release(st, h[1], 0, ERR);
    srv_store_release(st, h[2], 0, ERR);
    srv_store_free(st);

    /* Memory only: nowhere to evict to. */
    st = open_store(NULL, model, 1, 0, 0, NULL);
    if (st) {
        CHECK_INT_EQ(srv_store_create(st, &h[0], ERR), 0);
        CHECK_INT_EQ(srv_store_release(st, h[0], 1, ERR), 0); /* persist: nothing to write */
        CHECK_INT_EQ(srv_store_create(st, &h[1], ERR), SRV_STORE_EFULL);
        srv_store_free(st);
    }
out:
    rm_rf(dir);
    free(dir);
}

TEST(ttl_sweep)
{
    char *dir = mkdir_tmp();
    srv_store_t *st = open_store(dir, model, 0, 0, 100, NULL);
    if (!st)
        goto out;
    char a[33], b[33];
    make_session(st, model, 50, 1, a);
    make_session(st, model, 51, 0, b);
    srv_session_t *held = NULL;
    CHECK_INT_EQ(srv_store_create(st, &held, ERR), 0);
    int64_t now = (int64_t)time(NULL);
    CHECK_INT_EQ(srv_store_sweep(st, now + 50, ERR), 0);
    srv_session_info_t in;
    CHECK_INT_EQ(srv_store_info(st, a, &in, ERR), 0);
    CHECK_INT_EQ(srv_store_info(st, b, &in, ERR), 0);
    CHECK_INT_EQ(srv_store_sweep(st, now + 200, ERR), 0);
    CHECK_INT_EQ(srv_store_info(st, a, &in, ERR), SRV_STORE_ENOTFOUND);
    CHECK_INT_EQ(srv_store_info(st, b, &in, ERR), SRV_STORE_ENOTFOUND);
    CHECK(!file_exists(dir, a));
    CHECK_INT_EQ(srv_store_info(st, srv_session_id(held), &in, ERR), 0); /* busy: kept */
    CHECK_INT_EQ(srv_store_release(st, held, 0, ERR), 0);
    size_t mem = 9, disk = 9, bytes = 9;
    CHECK_INT_EQ(srv_store_sweep(st, now + 400, ERR), 0);
    srv_store_stats(st, &mem, &disk, &bytes);
    CHECK(mem == 0 && disk == 0 && bytes == 0);
    srv_store_free(st);
out:
    rm_rf(dir);
    free(dir);
}

/* The state budget's view of the store: busy sessions are held, idle ones
 * evictable (only with a directory); a trim writes and frees idle ones, least
 * recently used first, down to a byte target, and never a busy one. */
TEST(mem_stats_and_trim)
{
    char *dir = mkdir_tmp();
    srv_store_t *st = open_store(dir, model, 0, 0, 0, NULL);
    if (!st)
        goto out;
    char a[33], b[33];
    make_session(st, model, 60, 1, a);
    make_session(st, model, 61, 1, b);
    srv_session_t *held = NULL;
    CHECK_INT_EQ(srv_store_create(st, &held, ERR), 0);
    size_t mem = 0, bytes = 0, h = 0, e = 0;
    srv_store_stats(st, &mem, NULL, &bytes);
    CHECK_INT_EQ(mem, 3);
    srv_store_mem_stats(st, &h, &e);
    CHECK(h > 0 && e > 0 && h + e == bytes);
    CHECK(e > h); /* two idle sessions of the same size as the busy one */
    /* room for one idle session next to the busy one: the older goes */
    CHECK_INT_EQ(srv_store_trim(st, h + e * 3 / 4, ERR), 0);
    srv_session_info_t ia, ib;
    CHECK_INT_EQ(srv_store_info(st, a, &ia, ERR), 0);
    CHECK_INT_EQ(srv_store_info(st, b, &ib, ERR), 0);
    CHECK(!ia.in_memory && ia.on_disk);
    CHECK(ib.in_memory);
    CHECK_INT_EQ(srv_store_trim(st, 0, ERR), 0);
    srv_store_mem_stats(st, &h, &e);
    CHECK_INT_EQ(e, 0);
    CHECK(h > 0); /* the busy one stays */
    CHECK_INT_EQ(srv_store_info(st, b, &ib, ERR), 0);
    CHECK(!ib.in_memory && ib.on_disk);
    CHECK_INT_EQ(srv_store_release(st, held, 0, ERR), 0);
    srv_store_free(st);
    /* without a directory nothing can be evicted: everything is held */
    st = open_store(NULL, model, 0, 0, 0, NULL);
    if (!st)
        goto out;
    make_session(st, model, 62, 1, a);
    srv_store_mem_stats(st, &h, &e);
    CHECK(h > 0 && e == 0);
    CHECK_INT_EQ(srv_store_trim(st, 0, ERR), 0);
    srv_store_stats(st, &mem, NULL, NULL);
    CHECK_INT_EQ(mem, 1);
    srv_store_free(st);
out:
    rm_rf(dir);
    free(dir);
}

/* The directory's budgets: past --max-session-files / --max-session-disk the
 * least recently used idle sessions are deleted (file and memory), the one
 * being written never, busy ones never; at startup a smaller budget trims
 * what the directory holds. */
TEST(disk_budget_by_count_and_bytes)
{
    char *dir = mkdir_tmp();
    srv_store_opts_t o = {.dir = dir, .max_disk_files = 3, .model = model};
    srv_store_t *st = NULL;
    char err[512] = "";
    CHECK_MSG(srv_store_new(&o, &st, err, sizeof err) == 0, "store: %s", err);
    if (!st)
        goto out;
    char id[4][33];
    for (int i = 0; i < 3; i++)
        make_session(st, model, 70 + (uint64_t)i, 1, id[i]);
    /* use the oldest again: it becomes the most recent */
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_acquire(st, id[0], &s, ERR), 0);
    if (s) {
        srv_session_touch(s);
        CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
    }
    make_session(st, model, 73, 1, id[3]); /* a 4th file: id[1] is the least recently used */
    srv_session_info_t in;
    CHECK_INT_EQ(srv_store_info(st, id[1], &in, ERR), SRV_STORE_ENOTFOUND);
    CHECK(!file_exists(dir, id[1]));
    CHECK_INT_EQ(srv_store_info(st, id[0], &in, ERR), 0);
    size_t disk = 0, dbytes = 0;
    uint64_t evicted = 0;
    srv_store_stats(st, NULL, &disk, NULL);
    srv_store_disk_stats(st, &dbytes, &evicted);
    CHECK_INT_EQ(disk, 3);
    CHECK_INT_EQ(evicted, 1);
    size_t one = in.state_bytes;
    CHECK(dbytes >= 3 * one - 64 && dbytes <= 3 * one + 64);
    /* a fork writes a file too: the least recently used idle one (id[2]) goes */
    char fork_id[33];
    CHECK_INT_EQ(srv_store_fork_owned(st, id[3], NULL, fork_id, ERR), 0);
    CHECK_INT_EQ(srv_store_info(st, id[2], &in, ERR), SRV_STORE_ENOTFOUND);
    CHECK_INT_EQ(srv_store_info(st, id[0], &in, ERR), 0);
    CHECK_INT_EQ(srv_store_info(st, fork_id, &in, ERR), 0);
    srv_store_free(st);
    st = NULL;

    /* reopened with a byte budget of about two files: one more goes */
    o.max_disk_files = 0;
    o.max_disk_bytes = 2 * one + one / 2;
    CHECK_MSG(srv_store_new(&o, &st, err, sizeof err) == 0, "store: %s", err);
    if (!st)
        goto out;
    srv_store_stats(st, NULL, &disk, NULL);
    srv_store_disk_stats(st, &dbytes, &evicted);
    CHECK_INT_EQ(disk, 2);
    CHECK(dbytes <= o.max_disk_bytes);
    CHECK_INT_EQ(evicted, 1);
    int files = file_exists(dir, id[0]) + file_exists(dir, id[3]) + file_exists(dir, fork_id);
    CHECK_INT_EQ(files, 2);
    srv_store_free(st);
    st = NULL;
    rm_rf(dir);

    /* busy sessions are never deleted, nor the one being written: the
     * budget is exceeded meanwhile, and met again when they are released */
    CHECK(mkdir(dir, 0700) == 0);
    o.max_disk_files = 1;
    o.max_disk_bytes = 0;
    CHECK_MSG(srv_store_new(&o, &st, err, sizeof err) == 0, "store: %s", err);
    if (!st)
        goto out;
    char a[33], b[33];
    make_session(st, model, 80, 1, a);
    s = NULL;
    CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), 0); /* a busy */
    make_session(st, model, 81, 1, b);              /* b written: a is busy, b is b */
    CHECK(file_exists(dir, a) && file_exists(dir, b));
    if (s)
        CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0); /* a written: b goes */
    CHECK(file_exists(dir, a) && !file_exists(dir, b));
    CHECK_INT_EQ(srv_store_info(st, b, &in, ERR), SRV_STORE_ENOTFOUND);
    srv_store_free(st);
out:
    rm_rf(dir);
    free(dir);
}

/* Owner tags: kept in the file (a restart finds them), lists filter by
 * them, a fork takes the tag it is given, an import keeps the session's. */
TEST(owners_persist_and_filter)
{
    static const char ta[] = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    static const char tb[] = "0123456789abcdef0123456789abcdef";
    char *dir = mkdir_tmp();
    srv_store_t *st = open_store(dir, model, 0, 0, 0, NULL);
    if (!st)
        goto out;
    char a[33], b[33], f[33];
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_create(st, &s, ERR), 0);
    if (s) {
        srv_session_info_t i0;
        CHECK_INT_EQ(srv_store_info(st, srv_session_id(s), &i0, ERR), 0);
        CHECK_STR_EQ(i0.owner, "");
        CHECK_INT_EQ(srv_session_set_owner(s, "not-a-tag", ERR), SRV_STORE_EINVAL);
        CHECK_INT_EQ(srv_session_set_owner(s, ta, ERR), 0);
        memcpy(a, srv_session_id(s), 33);
        CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
    }
    make_session(st, model, 90, 1, b); /* no owner */
    CHECK_INT_EQ(srv_store_fork_owned(st, a, tb, f, ERR), 0);
    CHECK_INT_EQ(srv_store_fork_owned(st, a, "xyz", f + 0, ERR), SRV_STORE_EINVAL);
    char g[33];
    srv_session_info_t gi;
    CHECK_INT_EQ(srv_store_fork_owned(st, a, "", g, ERR), 0); /* "" is a tag too: nobody's */
    CHECK_INT_EQ(srv_store_info(st, g, &gi, ERR), 0);
    CHECK_STR_EQ(gi.owner, "");
    CHECK_INT_EQ(srv_store_delete(st, g, ERR), 0);
    /* an import keeps the session's own tag */
    void *blob = NULL;
    size_t len = 0;
    CHECK_INT_EQ(srv_store_export(st, f, &blob, &len, ERR), 0);
    CHECK_INT_EQ(srv_store_import(st, b, blob, len, NULL, 0), 0);
    free(blob);
    srv_store_free(st);

    st = open_store(dir, model, 0, 0, 0, NULL);
    if (!st)
        goto out;
    srv_session_info_t in[4];
    size_t n = 0;
    int more = 0;
    CHECK_INT_EQ(srv_store_list_owned(st, ta, NULL, 4, in, &n, &more, ERR), 0);
    CHECK(n == 1 && !more && strcmp(in[0].id, a) == 0 && strcmp(in[0].owner, ta) == 0);
    CHECK_INT_EQ(srv_store_list_owned(st, tb, NULL, 4, in, &n, &more, ERR), 0);
    CHECK(n == 1 && strcmp(in[0].id, f) == 0);
    CHECK_INT_EQ(srv_store_list_owned(st, "", NULL, 4, in, &n, &more, ERR), 0);
    CHECK(n == 1 && strcmp(in[0].id, b) == 0);
    CHECK_INT_EQ(srv_store_list_owned(st, NULL, NULL, 2, in, &n, &more, ERR), 0);
    CHECK(n == 2 && more);
    /* the tag survives loading the state back into memory and writing it */
    CHECK_INT_EQ(srv_store_acquire(st, f, &s, ERR), 0);
    if (s) {
        srv_session_info_t fi;
        CHECK_INT_EQ(srv_store_info(st, f, &fi, ERR), 0);
        CHECK_STR_EQ(fi.owner, tb);
        srv_session_touch(s);
        CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
    }
    srv_store_free(st);
    st = open_store(dir, model, 0, 0, 0, NULL);
    if (st) {
        CHECK_INT_EQ(srv_store_info(st, f, &in[0], ERR), 0);
        CHECK_STR_EQ(in[0].owner, tb);
        srv_store_free(st);
    }
out:
    rm_rf(dir);
    free(dir);
}

/* ---- fork, export, import ---- */

TEST(fork_is_an_independent_copy)
{
    char *dir = mkdir_tmp();
    srv_store_t *st = open_store(dir, model, 0, 0, 0, NULL);
    if (!st)
        goto out;
    char a[33], f[33], g[33];
    make_session(st, model, 60, 1, a);
    srv_seq_ctx_t ref = snapshot(st, model, a);
    CHECK_INT_EQ(srv_store_fork_owned(st, a, NULL, f, ERR), 0);
    CHECK(strcmp(a, f) != 0 && srv_session_id_valid(f));
    CHECK(file_exists(dir, f));
    srv_session_info_t ia, ifk;
    CHECK_INT_EQ(srv_store_info(st, a, &ia, ERR), 0);
    CHECK_INT_EQ(srv_store_info(st, f, &ifk, ERR), 0);
    CHECK_INT_EQ(ifk.tokens, ia.tokens);
    /* Advancing the fork leaves the original as it was. */
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_acquire(st, f, &s, ERR), 0);
    if (s) {
        advance(model, srv_session_ctx(s), 5, 61);
        srv_session_touch(s);
        CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
    }
    srv_seq_ctx_t ref2 = copy_ctx(model, &ref);
    check_same(st, model, a, &ref, "original after its fork moved on");
    /* The fork, before it moved, was the same: fork again and compare. */
    CHECK_INT_EQ(srv_store_fork_owned(st, a, NULL, g, ERR), 0);
    check_same(st, model, g, &ref2, "second fork");

    /* A session whose state accumulates in double (made under other linear
     * options) forks into a store whose fresh states are float. */
    core_attn_linear_opts_t lo = {64, 1, 0};
    core_error_t cerr = {0};
    CHECK_INT_EQ(core_attn_linear_set_opts(core_model_attn(model), &lo, &cerr), 0);
    char d64[33], f64[33];
    make_session(st, model, 62, 0, d64);
    lo.fp64_state = 0;
    CHECK_INT_EQ(core_attn_linear_set_opts(core_model_attn(model), &lo, &cerr), 0);
    srv_seq_ctx_t r64 = snapshot(st, model, d64);
    CHECK_INT_EQ(srv_store_fork_owned(st, d64, NULL, f64, ERR), 0);
    check_same(st, model, f64, &r64, "fork of a double-precision state");
    srv_store_free(st);

    /* Fork of a session that is only on disk. */
    st = open_store(dir, model, 0, 0, 0, NULL);
    if (st) {
        srv_seq_ctx_t r3 = snapshot(st, model, a);
        srv_store_free(st);
        st = open_store(dir, model, 0, 0, 0, NULL);
        char h[33];
        CHECK_INT_EQ(srv_store_fork_owned(st, a, NULL, h, ERR), 0);
        srv_session_info_t in;
        CHECK_INT_EQ(srv_store_info(st, a, &in, ERR), 0);
        CHECK(!in.in_memory);
        check_same(st, model, h, &r3, "fork from disk");
        srv_store_free(st);
    }
out:
    rm_rf(dir);
    free(dir);
}

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

TEST(export_import)
{
    char *dir = mkdir_tmp(), *dir2 = mkdir_tmp();
    srv_store_t *st = open_store(dir, model, 0, 0, 0, NULL);
    srv_store_t *sx = open_store(dir2, model_x, 0, 0, 0, NULL);
    if (!st || !sx)
        goto out;
    char a[33], b[33], x[33];
    make_session(st, model, 70, 1, a);
    make_session(st, model, 71, 1, b);
    make_session(sx, model_x, 72, 1, x);
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), 0);
    srv_session_set_turn_open(s, 1);
    CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
    void *blob = NULL, *before = NULL, *after = NULL, *xb = NULL;
    size_t len = 0, blen = 0, alen = 0, xlen = 0;
    CHECK_INT_EQ(srv_store_export(st, a, &blob, &len, ERR), 0);
    CHECK_INT_EQ(srv_store_export(sx, x, &xb, &xlen, ERR), 0);
    CHECK_INT_EQ(srv_store_export(st, b, &before, &blen, ERR), 0);
    if (!blob || !xb || !before)
        goto out;
    char err[512];
    /* Refusals keep b as it was. */
    CHECK_INT_EQ(srv_store_import(st, b, xb, xlen, err, sizeof err), SRV_STORE_EMISMATCH);
    CHECK(strstr(err, "blob has attention exact, this server runs performer") != NULL);
    unsigned char *bad = malloc(len);
    memcpy(bad, blob, len);
    bad[len / 2] ^= 4;
    CHECK_INT_EQ(srv_store_import(st, b, bad, len, err, sizeof err), SRV_STORE_EMISMATCH);
    CHECK(strstr(err, "checksum mismatch") != NULL);
    CHECK_INT_EQ(srv_store_import(st, b, blob, len - 1, err, sizeof err), SRV_STORE_EMISMATCH);
    CHECK(strstr(err, "truncated") != NULL);
    /* A pending token outside the vocabulary, resealed. */
    core_state_info_t info;
    CHECK_INT_EQ(core_state_peek(blob, len, &info, NULL), 0);
    memcpy(bad, blob, len);
    put32(bad + info.owner_off + info.owner_len, (uint32_t)V);
    put32(bad + len - 4, core_crc32(0, bad, len - 4));
    CHECK_INT_EQ(srv_store_import(st, b, bad, len, err, sizeof err), SRV_STORE_EMISMATCH);
    CHECK(strstr(err, "vocabulary") != NULL);
    free(bad);
    CHECK_INT_EQ(srv_store_export(st, b, &after, &alen, ERR), 0);
    CHECK(alen == blen && after && memcmp(before, after, blen) == 0);
    free(after);
    after = NULL;
    /* Busy and missing targets. */
    CHECK_INT_EQ(srv_store_acquire(st, b, &s, ERR), 0);
    CHECK_INT_EQ(srv_store_import(st, b, blob, len, err, sizeof err), SRV_STORE_EBUSY);
    CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    CHECK_INT_EQ(srv_store_import(st, "00000000000000000000000000000000", blob, len, err,
                                  sizeof err), SRV_STORE_ENOTFOUND);

    /* The good blob: b becomes a, and is written. */
    srv_seq_ctx_t ra = snapshot(st, model, a);
    CHECK_INT_EQ(srv_store_import(st, b, blob, len, err, sizeof err), 0);
    CHECK_INT_EQ(srv_store_acquire(st, b, &s, ERR), 0);
    CHECK_INT_EQ(srv_session_turn_open(s), 1);
    CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    check_same(st, model, b, &ra, "imported");
    /* Written at once: a new store sees the imported state. */
    srv_seq_ctx_t ra2 = snapshot(st, model, a);
    srv_store_free(st);
    st = open_store(dir, model, 0, 0, 0, NULL);
    if (st) {
        /* Import into an evicted session, and another model's fingerprint. */
        check_same(st, model, b, &ra2, "imported, reopened");
        srv_store_t *sf = NULL;
        srv_store_free(st);
        st = NULL;
        sf = open_store(dir, model, 0, 0, 0, "0123456789abcdef");
        if (sf) {
            /* Files of another model are not listed. */
            srv_session_info_t in;
            CHECK_INT_EQ(srv_store_info(sf, a, &in, ERR), SRV_STORE_ENOTFOUND);
            srv_session_t *n = NULL;
            CHECK_INT_EQ(srv_store_create(sf, &n, ERR), 0);
            char nid[33];
            memcpy(nid, srv_session_id(n), 33);
            CHECK_INT_EQ(srv_store_release(sf, n, 1, ERR), 0);
            CHECK_INT_EQ(srv_store_import(sf, nid, blob, len, err, sizeof err),
                         SRV_STORE_EMISMATCH);
            CHECK(strstr(err, "blob is for model") != NULL);
            srv_store_free(sf);
        }
        st = open_store(dir, model, 0, 0, 0, NULL);
        srv_seq_ctx_t ra3 = snapshot(st, model, a);
        srv_store_free(st);
        st = open_store(dir, model, 0, 0, 0, NULL);
        srv_session_info_t in;
        CHECK_INT_EQ(srv_store_info(st, b, &in, ERR), 0);
        CHECK(!in.in_memory);
        CHECK_INT_EQ(srv_store_import(st, b, blob, len, err, sizeof err), 0);
        check_same(st, model, b, &ra3, "imported into an evicted session");
    }
out:
    free(blob);
    free(xb);
    free(before);
    srv_store_free(st);
    srv_store_free(sx);
    rm_rf(dir);
    rm_rf(dir2);
    free(dir);
    free(dir2);
}

/* ---- pending grammar ---- */

/* Checks that session id holds the pending grammar text ++ reply (text NULL:
 * none) when acquired. */
static void check_pending(srv_store_t *st, const char *id, const char *text, const char *reply,
                          const char *what)
{
    srv_session_t *s = NULL;
    int rc = srv_store_acquire(st, id, &s, ERR);
    CHECK_MSG(rc == 0, "%s: acquire: %s", what, last_err);
    if (rc)
        return;
    const char *t = NULL, *r = NULL;
    size_t tl = 9, rl = 9;
    int have = srv_session_pending_grammar(s, &t, &tl, &r, &rl);
    CHECK_MSG(have == (text != NULL), "%s: has %d", what, have);
    if (text && have) {
        CHECK_MSG(tl == strlen(text) && memcmp(t, text, tl) == 0, "%s: text", what);
        CHECK_MSG(rl == strlen(reply) && memcmp(r, reply, rl) == 0, "%s: reply", what);
    } else {
        CHECK(!t && !r && tl == 0 && rl == 0);
    }
    CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
}

static int64_t pending_info(srv_store_t *st, const char *id)
{
    srv_session_info_t in;
    CHECK_INT_EQ(srv_store_info(st, id, &in, ERR), 0);
    return in.pending_grammar;
}


/* A blob of context c with a version 3 owner section (before pending
 * grammars): flags and turns as given (new malloc'd, its length in *len). */
static unsigned char *v3_blob(const srv_seq_ctx_t *c, uint32_t flags, uint32_t turns, size_t *len)
{
    unsigned char own[72] = {0};
    put32(own, 3);
    put32(own + 4, flags);
    put32(own + 56, turns);
    core_state_desc_t d = {.fingerprint = core_model_info(model)->fingerprint,
                           .state = c->state,
                           .sampler = c->sampler,
                           .pending = c->pending,
                           .n_pending = c->n_pending,
                           .owner = own,
                           .owner_len = sizeof own};
    size_t n = core_state_desc_size(&d);
    unsigned char *b = malloc(n);
    *len = 0;
    if (b && core_state_save(&d, b, n, len, NULL) != 0) {
        free(b);
        b = NULL;
    }
    return b;
}

TEST(pending_grammar_round_trip)
{
    static const char gram[] = "root ::= \"{\" [a-z]* \"}\"", rep[] = "{ab";
    char *dir = mkdir_tmp();
    srv_store_t *st = open_store(dir, model, 0, 0, 0, NULL);
    unsigned char *blob3 = NULL;
    if (!st)
        goto out;
    char a[33], b[33], f[33], f2[33];
    make_session(st, model, 40, 1, a);
    make_session(st, model, 41, 1, b);
    CHECK_INT_EQ(pending_info(st, a), -1);
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), 0);
    if (!s)
        goto out;
    /* refusals change nothing */
    static char big[SRV_PENDING_GRAMMAR_MAX + 1];
    memset(big, 'x', sizeof big);
    CHECK_INT_EQ(srv_session_set_pending_grammar(s, gram, 0, NULL, 0, ERR), SRV_STORE_EINVAL);
    CHECK_INT_EQ(srv_session_set_pending_grammar(s, big, sizeof big, NULL, 0, ERR),
                 SRV_STORE_EINVAL);
    CHECK_INT_EQ(
        srv_session_set_pending_grammar(s, gram, strlen(gram), big, SRV_PENDING_GRAMMAR_MAX, ERR),
        SRV_STORE_EINVAL);
    CHECK_INT_EQ(srv_session_set_pending_grammar(s, gram, strlen(gram), rep, strlen(rep), ERR), 0);
    CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
    CHECK_INT_EQ(pending_info(st, a), 3);
    check_pending(st, a, gram, rep, "set");
    /* a fork of a session in memory */
    CHECK_INT_EQ(srv_store_fork_owned(st, a, NULL, f, ERR), 0);
    CHECK_INT_EQ(pending_info(st, f), 3);
    check_pending(st, f, gram, rep, "fork");
    srv_store_free(st);

    /* from the file: listed at startup, read back with the state, forked */
    st = open_store(dir, model, 0, 0, 0, NULL);
    if (!st)
        goto out;
    CHECK_INT_EQ(pending_info(st, a), 3);
    CHECK_INT_EQ(pending_info(st, b), -1);
    CHECK_INT_EQ(srv_store_fork_owned(st, a, NULL, f2, ERR), 0);
    check_pending(st, f2, gram, rep, "fork of an evicted session");
    check_pending(st, a, gram, rep, "reopened");
    /* export and import into another session */
    void *blob = NULL;
    size_t len = 0;
    CHECK_INT_EQ(srv_store_export(st, a, &blob, &len, ERR), 0);
    CHECK_INT_EQ(srv_store_import(st, b, blob, len, NULL, 0), 0);
    free(blob);
    CHECK_INT_EQ(pending_info(st, b), 3);
    check_pending(st, b, gram, rep, "imported");
    /* cleared, and so written */
    CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), 0);
    if (s) {
        CHECK_INT_EQ(srv_session_set_pending_grammar(s, NULL, 0, NULL, 0, ERR), 0);
        CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
    }
    CHECK_INT_EQ(pending_info(st, a), -1);
    /* an owner section of version 3 (before pending grammars) still reads */
    srv_seq_ctx_t c = snapshot(st, model, a);
    if (!c.state)
        goto done;
    size_t l3 = 0;
    blob3 = v3_blob(&c, 1, 5, &l3); /* turn_open, 5 turns */
    CHECK(blob3 != NULL);
    char err[256] = "";
    CHECK_MSG(srv_store_import(st, b, blob3, l3, err, sizeof err) == 0, "v3: %s", err);
    srv_session_info_t in;
    CHECK_INT_EQ(srv_store_info(st, b, &in, ERR), 0);
    CHECK(in.turns == 5 && in.pending_grammar == -1);
    check_pending(st, b, NULL, NULL, "version 3");
done:
    free_ctx(&c);
out:
    free(blob3);
    srv_store_free(st);
    rm_rf(dir);
    free(dir);
}

/* The turn a chat continuation starts in is one of three (none, the
 * assistant's, a Gemma user turn holding system text): the third persists
 * (flags bit 2) like the second, and flags naming both are refused. */
TEST(user_turn_open_persists)
{
    char *dir = mkdir_tmp();
    unsigned char *blob = NULL;
    srv_seq_ctx_t c = {0};
    srv_store_t *st = open_store(dir, model, 0, 0, 0, NULL);
    if (!st)
        goto out;
    char a[33];
    make_session(st, model, 44, 1, a);
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), 0);
    if (!s)
        goto out;
    srv_session_set_turn_open(s, 2);
    CHECK_INT_EQ(srv_session_turn_open(s), 2);
    CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
    srv_store_free(st);
    st = open_store(dir, model, 0, 0, 0, NULL);
    if (!st)
        goto out;
    CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), 0);
    if (!s)
        goto out;
    CHECK_INT_EQ(srv_session_turn_open(s), 2);
    CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    /* an owner section whose flags open both turns */
    c = snapshot(st, model, a);
    if (!c.state)
        goto out;
    size_t l = 0;
    blob = v3_blob(&c, 5, 5, &l); /* bit 0 and bit 2, 5 turns */
    CHECK(blob != NULL);
    if (!blob)
        goto out;
    /* not read: the session imports as one without the store's section */
    char err[256] = "";
    srv_session_info_t in;
    CHECK_MSG(srv_store_import(st, a, blob, l, err, sizeof err) == 0, "bits 0+2: %s", err);
    CHECK_INT_EQ(srv_store_info(st, a, &in, ERR), 0);
    CHECK(in.turns == 0);
    CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), 0);
    if (s) {
        CHECK_INT_EQ(srv_session_turn_open(s), 0);
        CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    }
    free(blob);
    blob = v3_blob(&c, 4, 5, &l); /* bit 2 alone reads */
    CHECK(blob != NULL);
    if (!blob)
        goto out;
    CHECK_MSG(srv_store_import(st, a, blob, l, err, sizeof err) == 0, "bit 2: %s", err);
    CHECK_INT_EQ(srv_store_info(st, a, &in, ERR), 0);
    CHECK(in.turns == 5);
    CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), 0);
    if (s) {
        CHECK_INT_EQ(srv_session_turn_open(s), 2);
        CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    }
out:
    free_ctx(&c);
    free(blob);
    srv_store_free(st);
    rm_rf(dir);
    free(dir);
}

/* An import refuses a blob whose pending grammar does not compile or whose
 * reply does not follow it (a later continue_grammar could not go on from
 * it); the session keeps what it had. */
TEST(import_checks_the_pending_grammar)
{
    static const char gram[] = "root ::= \"{\" [a-z]* \"}\"", rep[] = "{ab", bad_rep[] = "x{";
    char *dir = mkdir_tmp();
    srv_store_t *st = open_store(dir, model, 0, 0, 0, NULL);
    if (!st)
        goto out;
    char a[33], b[33];
    make_session(st, model, 42, 1, a);
    make_session(st, model, 43, 1, b);
    const struct {
        const char *text, *reply, *why;
    } cases[] = {{gram, bad_rep, "pending reply (2 bytes) does not follow the pending grammar"},
                 {"root ::= (", "", "pending grammar (10 bytes) is not a valid grammar"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        srv_session_t *s = NULL;
        CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), 0);
        if (!s)
            break;
        CHECK_INT_EQ(srv_session_set_pending_grammar(s, cases[i].text, strlen(cases[i].text),
                                                     cases[i].reply, strlen(cases[i].reply), ERR),
                     0);
        CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
        void *blob = NULL;
        size_t len = 0;
        CHECK_INT_EQ(srv_store_export(st, a, &blob, &len, ERR), 0);
        char err[SRV_STORE_ERR_MAX] = "";
        CHECK_INT_EQ(srv_store_import(st, b, blob, len, err, sizeof err), SRV_STORE_EMISMATCH);
        CHECK_MSG(strstr(err, cases[i].why) != NULL, "case %zu: %s", i, err);
        CHECK_INT_EQ(pending_info(st, b), -1);
        free(blob);
    }
    /* a reply that follows it imports */
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), 0);
    if (s) {
        CHECK_INT_EQ(srv_session_set_pending_grammar(s, gram, strlen(gram), rep, strlen(rep), ERR),
                     0);
        CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
    }
    void *blob = NULL;
    size_t len = 0;
    CHECK_INT_EQ(srv_store_export(st, a, &blob, &len, ERR), 0);
    CHECK_INT_EQ(srv_store_import(st, b, blob, len, ERR), 0);
    check_pending(st, b, gram, rep, "imported");
    free(blob);
out:
    srv_store_free(st);
    rm_rf(dir);
    free(dir);
}

/* ---- failures ---- */

typedef struct hook {
    size_t budget; /* bytes allowed before ENOSPC */
    size_t chunk;  /* max bytes per call (short writes) */
    int calls;
} hook_t;

static ssize_t hook_write(int fd, const void *buf, size_t n, void *ud)
{
    hook_t *h = ud;
    h->calls++;
    if (h->budget == 0) {
        errno = ENOSPC;
        return -1;
    }
    size_t k = n < h->budget ? n : h->budget;
    if (h->chunk && k > h->chunk)
        k = h->chunk;
    ssize_t w = write(fd, buf, k);
    if (w > 0)
        h->budget -= (size_t)w;
    return w;
}

TEST(write_failures_keep_the_previous_file)
{
    char *dir = mkdir_tmp();
    unsigned char *v0 = NULL;
    srv_store_t *st = open_store(dir, model, 0, 0, 0, NULL);
    if (!st)
        goto out;
    char a[33], tmpname[64];
    make_session(st, model, 80, 1, a);
    snprintf(tmpname, sizeof tmpname, "%s.tmp", a);
    size_t l0 = 0, l1 = 0;
    v0 = read_all(dir, a, &l0);

    /* Disk full half-way through the write: ENOSPACE, and the session goes
     * back to its file (the change that could not be saved is dropped). */
    srv_session_info_t in;
    CHECK_INT_EQ(srv_store_info(st, a, &in, ERR), 0);
    const int64_t tokens0 = in.tokens;
    hook_t h = {.budget = l0 / 2};
    srv_store_set_write_fn(st, hook_write, &h);
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), 0);
    advance(model, srv_session_ctx(s), 7, 81);
    srv_session_touch(s);
    CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), SRV_STORE_ENOSPACE);
    const char *msg = last_err;
    CHECK_MSG(strstr(msg, tmpname) && strstr(msg, "No space left on device"), "message: %s", msg);
    unsigned char *v1 = read_all(dir, a, &l1);
    CHECK(v1 && l1 == l0 && memcmp(v0, v1, l0) == 0);
    free(v1);
    CHECK(!file_exists(dir, tmpname));
    CHECK_INT_EQ(srv_store_info(st, a, &in, ERR), 0);
    CHECK(!in.busy && !in.in_memory); /* released, back to its file */
    CHECK_INT_EQ(in.tokens, tokens0);

    /* A directory where the temp file goes: another I/O error. */
    srv_store_set_write_fn(st, NULL, NULL);
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, tmpname);
    CHECK(mkdir(p, 0700) == 0);
    CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), 0);
    CHECK_INT_EQ(srv_session_tokens(s), tokens0); /* read back from the file */
    CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), SRV_STORE_EIO);
    CHECK(strstr(last_err, "cannot create") != NULL);
    v1 = read_all(dir, a, &l1);
    CHECK(v1 && l1 == l0 && memcmp(v0, v1, l0) == 0);
    free(v1);
    /* Nothing unsaved is left for a flush: the failed changes were dropped. */
    CHECK_INT_EQ(srv_store_flush(st, ERR), 0);
    rmdir(p);

    /* Short writes are completed; the new state reaches the disk. */
    h = (hook_t){.budget = SIZE_MAX, .chunk = 1000};
    srv_store_set_write_fn(st, hook_write, &h);
    CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), 0);
    advance(model, srv_session_ctx(s), 7, 81);
    srv_session_touch(s);
    srv_seq_ctx_t ref = copy_ctx(model, srv_session_ctx(s));
    CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
    CHECK(h.calls > 1);
    srv_store_free(st);
    st = open_store(dir, model, 0, 0, 0, NULL);
    if (st)
        check_same(st, model, a, &ref, "after the failed writes");
    else
        free_ctx(&ref);
    srv_store_free(st);
out:
    free(v0);
    rm_rf(dir);
    free(dir);
}

/* ---- the no-I/O thread (the event loop's) ---- */

static int count_op(const char *op, void *ud)
{
    (void)op;
    atomic_int *n = ud;
    atomic_fetch_add(n, 1);
    return 0;
}

static void *settle_thread(void *st)
{
    return (void *)(intptr_t)srv_store_settle(st, NULL, 0);
}

TEST(no_io_thread_leaves_disk_work_to_settle)
{
    char *dir = mkdir_tmp();
    srv_store_t *st = open_store(dir, model, 1, 0, 0, NULL);
    if (!st)
        goto out;
    char a[33], b[33];
    make_session(st, model, 11, 0, a); /* in memory, never written: evicting it writes */
    atomic_int ops = 0;
    srv_store_set_fault_fn(st, count_op, &ops);
    srv_store_no_io_here(st);
    /* one session in memory at most: b's create would evict a, which needs
     * a write; on this thread it is left for srv_store_settle */
    make_session(st, model, 12, 0, b);
    CHECK_INT_EQ(atomic_load(&ops), 0);
    CHECK_INT_EQ(srv_store_needs_settle(st), 1);
    srv_session_info_t in;
    CHECK_INT_EQ(srv_store_info(st, a, &in, ERR), 0);
    CHECK(in.in_memory && !in.on_disk);
    pthread_t t;
    void *rc = NULL;
    CHECK(pthread_create(&t, NULL, settle_thread, st) == 0);
    pthread_join(t, &rc);
    CHECK_INT_EQ((int)(intptr_t)rc, 0);
    CHECK(atomic_load(&ops) > 0); /* written there */
    CHECK_INT_EQ(srv_store_needs_settle(st), 0);
    CHECK_INT_EQ(srv_store_info(st, a, &in, ERR), 0);
    CHECK(!in.in_memory && in.on_disk);
    /* a clean session is dropped on this thread without any I/O */
    CHECK_INT_EQ(srv_store_info(st, b, &in, ERR), 0);
    CHECK(in.in_memory);
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_acquire(st, b, &s, ERR), 0);
    if (s)
        CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0); /* b now has a current file */
    atomic_store(&ops, 0);
    CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), 0); /* reading a (allowed) drops b */
    CHECK_INT_EQ(atomic_load(&ops), 1);            /* the read, nothing else */
    if (s)
        CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    CHECK_INT_EQ(srv_store_info(st, b, &in, ERR), 0);
    CHECK(!in.in_memory && in.on_disk);
    CHECK_INT_EQ(srv_store_needs_settle(st), 0);
    srv_store_free(st);
out:
    rm_rf(dir);
    free(dir);
}

/* A write that waits until the test lets it go (or 10 s pass). */
typedef struct gate {
    atomic_int entered, open;
} gate_t;

static ssize_t gate_write(int fd, const void *buf, size_t n, void *ud)
{
    gate_t *g = ud;
    atomic_store(&g->entered, 1);
    for (int i = 0; i < 1000 && !atomic_load(&g->open); i++)
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    return write(fd, buf, n);
}

static void *trim_thread(void *st)
{
    return (void *)(intptr_t)srv_store_trim(st, 0, NULL, 0);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* srv_store_acquire_in_memory never touches the disk nor waits for it: an
 * evicted session is SRV_STORE_EEVICTED with its file unopened and nothing
 * in memory changed, and so is one whose eviction is writing it right now;
 * srv_store_acquire still reads it back. */
TEST(acquire_in_memory_never_reads)
{
    char *dir = mkdir_tmp();
    unsigned char *f0 = NULL;
    srv_store_t *st = open_store(dir, model, 0, 0, 0, NULL);
    if (!st)
        goto out;
    CHECK_STR_EQ(srv_store_strerror(SRV_STORE_EEVICTED), "session on disk, not in memory");
    char a[33], b[33];
    make_session(st, model, 90, 1, a);
    make_session(st, model, 91, 1, b);
    srv_session_t *s = NULL, *held = NULL;
    CHECK_INT_EQ(srv_store_acquire_in_memory(st, a, &held, ERR), 0); /* in memory: held */
    CHECK_INT_EQ(srv_store_acquire_in_memory(st, a, &s, ERR), SRV_STORE_EBUSY);
    CHECK(s == NULL);
    CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), SRV_STORE_EBUSY);
    if (held)
        CHECK_INT_EQ(srv_store_release(st, held, 0, ERR), 0);
    CHECK_INT_EQ(srv_store_acquire_in_memory(st, "0123456789abcdef0123456789abcdef", &s, ERR),
                 SRV_STORE_ENOTFOUND);
    CHECK_INT_EQ(srv_store_acquire_in_memory(st, "not-an-id", &s, ERR), SRV_STORE_EINVAL);

    /* a on disk only: refused, the file not opened, nothing moves */
    CHECK_INT_EQ(srv_store_trim(st, 0, ERR), 0);
    size_t mem0 = 9, bytes0 = 9, l0 = 0, l1 = 0;
    srv_store_stats(st, &mem0, NULL, &bytes0);
    CHECK_INT_EQ(mem0, 0);
    f0 = read_all(dir, a, &l0);
    atomic_int ops = 0;
    srv_store_set_fault_fn(st, count_op, &ops);
    CHECK_INT_EQ(srv_store_acquire_in_memory(st, a, &s, ERR), SRV_STORE_EEVICTED);
    CHECK(s == NULL);
    CHECK_MSG(strstr(last_err, a) && strstr(last_err, "on disk"), "message: %s", last_err);
    CHECK_INT_EQ(atomic_load(&ops), 0);
    size_t mem = 9, bytes = 9;
    srv_store_stats(st, &mem, NULL, &bytes);
    CHECK_INT_EQ(mem, mem0);
    CHECK_INT_EQ(bytes, bytes0);
    srv_session_info_t in;
    CHECK_INT_EQ(srv_store_info(st, a, &in, ERR), 0);
    CHECK(!in.in_memory && in.on_disk && !in.busy);
    unsigned char *f1 = read_all(dir, a, &l1);
    CHECK(f0 && f1 && l1 == l0 && memcmp(f0, f1, l0) == 0);
    free(f1);

    /* the ordinary acquire reads it (one operation: the read); then it is
     * in memory for the other */
    CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), 0);
    CHECK_INT_EQ(atomic_load(&ops), 1);
    if (s)
        CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    CHECK_INT_EQ(srv_store_acquire_in_memory(st, a, &s, ERR), 0);
    if (s)
        CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    srv_store_set_fault_fn(st, NULL, NULL);

    /* b changed since its write: evicting it writes it first, under the io
     * mark; meanwhile the in-memory acquire answers at once (the ordinary
     * one would wait for the write, then read the file back) */
    CHECK_INT_EQ(srv_store_acquire(st, b, &s, ERR), 0);
    if (s) {
        advance(model, srv_session_ctx(s), 5, 92);
        srv_session_touch(s);
        CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    }
    CHECK_INT_EQ(srv_store_acquire(st, a, &held, ERR), 0); /* a busy: b is the only victim */
    gate_t g = {0};
    srv_store_set_write_fn(st, gate_write, &g);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, trim_thread, st) == 0);
    for (int i = 0; i < 10000 && !atomic_load(&g.entered); i++)
        nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    CHECK(atomic_load(&g.entered));
    double t0 = now_s();
    CHECK_INT_EQ(srv_store_acquire_in_memory(st, b, &s, ERR), SRV_STORE_EEVICTED);
    CHECK(now_s() - t0 < 1.0);
    CHECK_MSG(strstr(last_err, "being written") != NULL, "message: %s", last_err);
    atomic_store(&g.open, 1);
    void *rc = NULL;
    pthread_join(t, &rc);
    CHECK_INT_EQ((int)(intptr_t)rc, 0);
    srv_store_set_write_fn(st, NULL, NULL);
    CHECK_INT_EQ(srv_store_info(st, b, &in, ERR), 0);
    CHECK(!in.in_memory && in.on_disk);
    CHECK_INT_EQ(srv_store_acquire_in_memory(st, b, &s, ERR), SRV_STORE_EEVICTED);
    if (held)
        CHECK_INT_EQ(srv_store_release(st, held, 0, ERR), 0);
    srv_store_free(st);
out:
    free(f0);
    rm_rf(dir);
    free(dir);
}

TEST(crash_leftovers_at_startup)
{
    char *dir = mkdir_tmp();
    srv_store_t *st = open_store(dir, model, 0, 0, 0, NULL);
    if (!st)
        goto out;
    char a[33];
    make_session(st, model, 90, 1, a);
    srv_seq_ctx_t ref = snapshot(st, model, a);
    srv_store_free(st);
    size_t l0 = 0;
    unsigned char *v0 = read_all(dir, a, &l0);
    /* A crash during a rewrite of a (half a temp file), a temp file of a
     * session never completed, a torn file that somehow got a session name,
     * and a stranger's file. */
    char p[512];
    const char *ghost = "ffffffffffffffffffffffffffffffff";
    const char *torn = "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";
    snprintf(p, sizeof p, "%s/%s.tmp", dir, a);
    FILE *f = fopen(p, "wb");
    fwrite(v0, 1, l0 / 2, f);
    fclose(f);
    snprintf(p, sizeof p, "%s/%s.tmp", dir, ghost);
    f = fopen(p, "wb");
    fwrite(v0, 1, 100, f);
    fclose(f);
    snprintf(p, sizeof p, "%s/%s", dir, torn);
    f = fopen(p, "wb");
    fwrite(v0, 1, l0 - 10, f);
    fclose(f);
    snprintf(p, sizeof p, "%s/notes.txt", dir);
    f = fopen(p, "wb");
    fputs("mine", f);
    fclose(f);
    st = open_store(dir, model, 0, 0, 0, NULL);
    if (st) {
        char tn[64];
        snprintf(tn, sizeof tn, "%s.tmp", a);
        CHECK(!file_exists(dir, tn));
        snprintf(tn, sizeof tn, "%s.tmp", ghost);
        CHECK(!file_exists(dir, tn));
        CHECK(file_exists(dir, "notes.txt"));
        srv_session_info_t in;
        /* the torn file is listed, and using it says what is wrong (a
         * 404 would hide the damage) */
        CHECK_INT_EQ(srv_store_info(st, torn, &in, ERR), 0);
        srv_session_t *ts = NULL;
        CHECK_INT_EQ(srv_store_acquire(st, torn, &ts, ERR), SRV_STORE_EIO);
        CHECK_MSG(strstr(last_err, "truncated") && strstr(last_err, torn), "torn file: %s",
                  last_err);
        CHECK_INT_EQ(srv_store_info(st, ghost, &in, ERR), SRV_STORE_ENOTFOUND);
        size_t disk = 0;
        srv_store_stats(st, NULL, &disk, NULL);
        CHECK_INT_EQ(disk, 2);
        check_same(st, model, a, &ref, "after crash leftovers");
        srv_store_free(st);
    } else {
        free_ctx(&ref);
    }
    /* A session file damaged after startup: acquire says which and why. */
    st = open_store(dir, model, 0, 0, 0, NULL);
    if (st) {
        snprintf(p, sizeof p, "%s/%s", dir, a);
        unsigned char *bad = malloc(l0);
        memcpy(bad, v0, l0);
        bad[l0 - 100] ^= 1;
        f = fopen(p, "wb");
        fwrite(bad, 1, l0, f);
        fclose(f);
        free(bad);
        srv_session_t *s = NULL;
        CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), SRV_STORE_EIO);
        CHECK(strstr(last_err, a) && strstr(last_err, "checksum"));
        void *b = NULL;
        size_t bl = 0;
        CHECK_INT_EQ(srv_store_export(st, a, &b, &bl, ERR), SRV_STORE_EIO);
        unlink(p);
        CHECK_INT_EQ(srv_store_acquire(st, a, &s, ERR), SRV_STORE_ENOTFOUND);
        srv_store_free(st);
    }
    free(v0);
out:
    rm_rf(dir);
    free(dir);
}

/* ---- threads ---- */

typedef struct worker {
    srv_store_t *st;
    char (*ids)[33];
    int n_ids;
    uint64_t seed;
    int errors;
} worker_t;

static void *work(void *arg)
{
    worker_t *w = arg;
    core_rng_t r;
    core_rng_seed(&r, w->seed);
    for (int i = 0; i < 300; i++) {
        const char *id = w->ids[core_rng_u64(&r) % (uint64_t)w->n_ids];
        srv_session_t *s = NULL;
        int rc = srv_store_acquire(w->st, id, &s, NULL, 0);
        if (rc == SRV_STORE_EBUSY || rc == SRV_STORE_EFULL)
            continue;
        if (rc < 0) {
            w->errors++;
            continue;
        }
        srv_session_touch(s);
        srv_session_set_turn_open(s, (int)(core_rng_u64(&r) & 1));
        if (srv_store_release(w->st, s, (int)(core_rng_u64(&r) & 1), NULL, 0) < 0)
            w->errors++;
        if (i % 50 == 0) {
            srv_store_sweep(w->st, (int64_t)time(NULL), NULL, 0);
            srv_session_info_t in[4];
            size_t n;
            int more;
            srv_store_list_owned(w->st, NULL, NULL, 4, in, &n, &more, NULL, 0);
        }
    }
    return NULL;
}

TEST(threads)
{
    char *dir = mkdir_tmp();
    srv_store_t *st = open_store(dir, model, 3, 0, 0, NULL);
    if (!st)
        goto out;
    char ids[8][33];
    srv_seq_ctx_t refs[8];
    for (int i = 0; i < 8; i++) {
        make_session(st, model, 200 + (uint64_t)i, 0, ids[i]);
        refs[i] = snapshot(st, model, ids[i]);
    }
    pthread_t th[4];
    worker_t w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker_t){.st = st, .ids = ids, .n_ids = 8, .seed = 300 + (uint64_t)i};
        pthread_create(&th[i], NULL, work, &w[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_INT_EQ(w[i].errors, 0);
    }
    size_t mem = 0;
    srv_store_stats(st, &mem, NULL, NULL);
    CHECK(mem <= 3);
    for (int i = 0; i < 8; i++)
        check_same(st, model, ids[i], &refs[i], "after threads");
    srv_store_free(st);
out:
    rm_rf(dir);
    free(dir);
}

/* ---- turns and checkpoints ---- */

static srv_store_t *open_ckpt_store(const char *dir, size_t k, size_t max_disk_bytes)
{
    srv_store_opts_t o = {.dir = dir, .model = model, .max_checkpoints = k,
                          .max_disk_bytes = max_disk_bytes};
    srv_store_t *st = NULL;
    char err[512] = "";
    int rc = srv_store_new(&o, &st, err, sizeof err);
    CHECK_MSG(rc == 0, "store: %s", err);
    return st;
}

/* One turn on session id: opens it with input {tag, tag + 1}, advances the
 * state, writes it. A copy of the state before the turn into before (may
 * be NULL). */
static void one_turn(srv_store_t *st, const char *id, int tag, unsigned flags,
                     srv_seq_ctx_t *before)
{
    srv_session_t *s = NULL;
    int rc = srv_store_acquire(st, id, &s, ERR);
    CHECK_MSG(rc == 0, "acquire: %s", last_err);
    if (rc)
        return;
    if (before)
        *before = copy_ctx(model, srv_session_ctx(s));
    const int32_t in[2] = {tag, tag + 1};
    CHECK_INT_EQ(srv_store_turn_begin(st, s, in, 2, flags, ERR), 0);
    advance(model, srv_session_ctx(s), 5 + tag % 7, 1000 + (uint64_t)tag);
    srv_session_touch(s);
    CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
}

/* The checkpoint turns of session id are exactly want[n]. */
/* 1 when s is one or more decimal digits. */
static int all_digits(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return n > 0;
}

/* How many checkpoint files of session id for `turn` turns dir holds:
 * "<id>.<turn>" or "<id>.<turn>.<generation>" (after an import). */
static int ckpt_files_for(const char *dir, const char *id, int64_t turn)
{
    char pre[64];
    snprintf(pre, sizeof pre, "%s.%lld", id, (long long)turn);
    size_t pl = strlen(pre);
    DIR *d = opendir(dir);
    int k = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        if (strncmp(n, pre, pl) == 0 &&
            (n[pl] == '\0' || (n[pl] == '.' && all_digits(n + pl + 1, strlen(n + pl + 1)))))
            k++;
    }
    if (d)
        closedir(d);
    return k;
}

static void check_ckpts(srv_store_t *st, const char *dir, const char *id, int64_t turns,
                        const int64_t *want, size_t n, const char *what)
{
    srv_session_info_t in;
    CHECK_INT_EQ(srv_store_info(st, id, &in, ERR), 0);
    CHECK_MSG(in.turns == turns, "%s: %lld turns (want %lld)", what, (long long)in.turns,
              (long long)turns);
    int same = in.n_checkpoints == n;
    for (size_t i = 0; same && i < n; i++)
        same = in.checkpoints[i].turn == want[i] && in.checkpoints[i].tokens > 0;
    CHECK_MSG(same, "%s: %zu checkpoints, first %lld", what, in.n_checkpoints,
              in.n_checkpoints ? (long long)in.checkpoints[0].turn : -1LL);
    for (int64_t t = 0; t < turns + 3; t++) {
        int listed = 0;
        for (size_t i = 0; i < n; i++)
            listed |= want[i] == t;
        const int files = ckpt_files_for(dir, id, t);
        CHECK_MSG(files == listed, "%s: %d files for turn %lld, listed %d", what, files,
                  (long long)t, listed);
    }
}

/* 1 if dir holds only ".lock", session files and checkpoint files
 * ("<id>.<digits>" or "<id>.<digits>.<digits>"): no temp file or other name
 * left behind. */
static int dir_clean(const char *dir)
{
    DIR *d = opendir(dir);
    int ok = d != NULL;
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        size_t l = strlen(n), i = 33;
        if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, ".lock") || l == 32)
            continue;
        const char *dot = l > 33 ? strchr(n + 33, '.') : NULL;
        int ckpt =
            l > 33 && n[32] == '.' &&
            (dot ? all_digits(n + i, (size_t)(dot - n) - i) && all_digits(dot + 1, strlen(dot + 1))
                 : all_digits(n + i, l - i));
        CHECK_MSG(ckpt, "unexpected file %s/%s", dir, n);
        ok &= ckpt;
    }
    if (d)
        closedir(d);
    return ok;
}

/* The state before each turn is kept (a link of the file it replaces), the
 * newest K; a rollback renames one back and deletes the later ones; a
 * restart finds them, and deletes files a crash left past the count. */
TEST(turn_checkpoints_and_rollback)
{
    char *dir = mkdir_tmp();
    srv_store_t *st = open_ckpt_store(dir, 3, 0);
    if (!st)
        goto out;
    char id[33];
    make_session(st, model, 300, 1, id);
    srv_seq_ctx_t before[6] = {{0}};
    for (int t = 1; t <= 5; t++) {
        one_turn(st, id, t, SRV_TURN_REPLY | SRV_TURN_CHAT, &before[t]);
        if (t == 2) {
            const int64_t w[] = {0, 1};
            check_ckpts(st, dir, id, 2, w, 2, "after 2 turns");
        }
    }
    const int64_t w5[] = {2, 3, 4};
    check_ckpts(st, dir, id, 5, w5, 3, "after 5 turns");
    CHECK(dir_clean(dir));
    /* a checkpoint shares its file's inode with the state it was: no copy */
    srv_session_info_t in;
    CHECK_INT_EQ(srv_store_info(st, id, &in, ERR), 0);
    size_t dbytes = 0;
    srv_store_disk_stats(st, &dbytes, NULL);
    CHECK(dbytes >= 4 * in.state_bytes - 256 && dbytes <= 4 * in.state_bytes + 256);

    /* what is not there */
    CHECK_INT_EQ(srv_store_rollback(st, id, 4, NULL, ERR), SRV_STORE_ENOCKPT);
    CHECK(strstr(last_err, "no checkpoint after 1 turn for") != NULL);
    CHECK(strstr(last_err, "after 2 to 4 turns") != NULL);
    CHECK_INT_EQ(srv_store_rollback(st, id, 6, NULL, ERR), SRV_STORE_ENOCKPT);
    CHECK(strstr(last_err, "has had 5 turns") != NULL);
    CHECK_INT_EQ(srv_store_rollback(st, id, 0, NULL, ERR), SRV_STORE_EINVAL);
    CHECK_INT_EQ(srv_store_rollback(st, "nope", 1, NULL, ERR), SRV_STORE_EINVAL);
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_acquire(st, id, &s, ERR), 0);
    CHECK_INT_EQ(srv_store_rollback(st, id, 1, NULL, ERR), SRV_STORE_EBUSY);
    /* a turn opened and undone, twice (a release without persist undoes it) */
    const int32_t x[1] = {7};
    CHECK_INT_EQ(srv_store_turn_begin(st, s, x, 1, SRV_TURN_REPLY, ERR), 0);
    CHECK_INT_EQ(srv_store_turn_begin(st, s, x, 1, SRV_TURN_REPLY, ERR), SRV_STORE_EINVAL);
    CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    CHECK_INT_EQ(srv_store_acquire(st, id, &s, ERR), 0);
    CHECK_INT_EQ(srv_store_turn_begin(st, s, x, 1, SRV_TURN_REPLY, ERR), 0);
    CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    check_ckpts(st, dir, id, 5, w5, 3, "after undone turns");
    CHECK_INT_EQ(srv_store_acquire(st, id, &s, ERR), 0);
    unsigned fl = 0;
    const int32_t *li = NULL;
    size_t nl = 0;
    CHECK_INT_EQ(srv_session_last_turn(s, &fl, &li, &nl), 1);
    CHECK(fl == (SRV_TURN_REPLY | SRV_TURN_CHAT) && nl == 2 && li && li[0] == 5 && li[1] == 6);
    CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);

    /* back 2 turns: the state after 3 turns, as it was before turn 4 */
    CHECK_INT_EQ(srv_store_rollback(st, id, 2, &in, ERR), 0);
    CHECK_INT_EQ(in.turns, 3);
    const int64_t w3[] = {2};
    check_ckpts(st, dir, id, 3, w3, 1, "after the rollback");
    srv_seq_ctx_t ref = copy_ctx(model, &before[4]);
    check_same(st, model, id, &ref, "rolled back");
    CHECK_INT_EQ(srv_store_acquire(st, id, &s, ERR), 0);
    CHECK_INT_EQ(srv_session_last_turn(s, &fl, &li, &nl), 1);
    CHECK(nl == 2 && li && li[0] == 3); /* the last turn is turn 3 again */
    CHECK_INT_EQ(srv_store_info(st, id, &in, ERR), 0);
    CHECK_INT_EQ(in.turns, 3);
    CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    /* a new turn after it: its checkpoint is the rolled-back state */
    one_turn(st, id, 40, SRV_TURN_REPLY, NULL);
    const int64_t w4[] = {2, 3};
    check_ckpts(st, dir, id, 4, w4, 2, "a turn after the rollback");

    /* a restart finds them; files a crash left past the count, and an
     * orphan, are deleted; a file of another name is left alone */
    srv_store_free(st);
    char p1[512], p2[512], p3[512], p4[512];
    snprintf(p1, sizeof p1, "%s/%s.2", dir, id);
    snprintf(p2, sizeof p2, "%s/%s.4", dir, id);
    snprintf(p3, sizeof p3, "%s/0123456789abcdef0123456789abcdef.1", dir);
    snprintf(p4, sizeof p4, "%s/%s.04", dir, id);
    CHECK(link(p1, p2) == 0 && link(p1, p3) == 0 && link(p1, p4) == 0);
    st = open_ckpt_store(dir, 3, 0);
    if (!st)
        goto out;
    check_ckpts(st, dir, id, 4, w4, 2, "after a restart");
    CHECK(access(p3, F_OK) != 0);
    CHECK(access(p4, F_OK) == 0);
    ref = copy_ctx(model, &before[4]);
    CHECK_INT_EQ(srv_store_rollback(st, id, 1, &in, ERR), 0);
    check_same(st, model, id, &ref, "rolled back after a restart");
    /* fewer checkpoints than last time: the oldest go at startup */
    srv_store_free(st);
    st = open_ckpt_store(dir, 0, 0);
    if (!st)
        goto out;
    check_ckpts(st, dir, id, 3, NULL, 0, "reopened with K = 0");
    srv_store_free(st);
out:
    for (int t = 0; t < 6; t++)
        if (before[t].state)
            free_ctx(&before[t]);
    rm_rf(dir);
    free(dir);
}

/* A redo reads the checkpoint before the last turn into memory beside the
 * session, swaps it in; the release commits it (the checkpoint stays) or
 * puts the previous state back. */
TEST(redo_replaces_the_last_turn)
{
    char *dir = mkdir_tmp();
    srv_store_t *st = open_ckpt_store(dir, 4, 0);
    if (!st)
        goto out;
    char id[33];
    make_session(st, model, 310, 1, id);
    srv_seq_ctx_t b1 = {0}, b2 = {0};
    CHECK_INT_EQ(srv_store_redo_prepare(st, id, ERR), SRV_STORE_ENOCKPT); /* no turn yet */
    CHECK(strstr(last_err, "no turn to regenerate") != NULL);
    one_turn(st, id, 1, 0, &b1); /* input only */
    CHECK_INT_EQ(srv_store_redo_prepare(st, id, ERR), SRV_STORE_ENOCKPT);
    CHECK(strstr(last_err, "generated no reply") != NULL);
    one_turn(st, id, 2, SRV_TURN_REPLY, &b2);
    srv_seq_ctx_t now = snapshot(st, model, id);
    srv_session_t *s = NULL;
    /* not prepared: nothing to swap in */
    CHECK_INT_EQ(srv_store_acquire(st, id, &s, ERR), 0);
    CHECK_INT_EQ(srv_store_redo_begin(st, s, ERR), SRV_STORE_EEVICTED);
    CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    /* prepared, begun, undone: the session is as it was */
    CHECK_INT_EQ(srv_store_redo_prepare(st, id, ERR), 0);
    size_t m0 = 0, m1 = 0;
    CHECK_INT_EQ(srv_store_acquire(st, id, &s, ERR), 0);
    srv_store_stats(st, NULL, NULL, &m0);
    CHECK_INT_EQ(srv_store_redo_begin(st, s, ERR), 0);
    srv_store_stats(st, NULL, NULL, &m1);
    CHECK(m1 == m0); /* the prepared state moved in, the old one aside */
    srv_seq_ctx_t got = copy_ctx(model, srv_session_ctx(s));
    srv_seq_ctx_t want = copy_ctx(model, &b2);
    CHECK_MSG(same_continuation(model, &got, &want), "redo: not the checkpoint's state");
    free_ctx(&got);
    free_ctx(&want);
    CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    srv_seq_ctx_t r = copy_ctx(model, &now);
    check_same(st, model, id, &r, "redo undone");
    /* a prepared redo goes stale when the session changes */
    CHECK_INT_EQ(srv_store_redo_prepare(st, id, ERR), 0);
    CHECK_INT_EQ(srv_store_acquire(st, id, &s, ERR), 0);
    srv_session_touch(s);
    CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
    CHECK_INT_EQ(srv_store_acquire(st, id, &s, ERR), 0);
    CHECK_INT_EQ(srv_store_redo_begin(st, s, ERR), SRV_STORE_EEVICTED);
    CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    /* committed: a new reply, same turn count and checkpoints */
    CHECK_INT_EQ(srv_store_redo_prepare(st, id, ERR), 0);
    CHECK_INT_EQ(srv_store_acquire(st, id, &s, ERR), 0);
    CHECK_INT_EQ(srv_store_redo_begin(st, s, ERR), 0);
    advance(model, srv_session_ctx(s), 9, 4242);
    srv_seq_ctx_t redone = copy_ctx(model, srv_session_ctx(s));
    CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
    const int64_t w[] = {0, 1};
    check_ckpts(st, dir, id, 2, w, 2, "after a redo");
    check_same(st, model, id, &redone, "redone");
    /* and the redo is what a restart finds */
    srv_store_free(st);
    st = open_ckpt_store(dir, 4, 0);
    if (!st)
        goto out;
    check_ckpts(st, dir, id, 2, w, 2, "redo after a restart");
    CHECK_INT_EQ(srv_store_rollback(st, id, 1, NULL, ERR), 0);
    r = copy_ctx(model, &b2);
    check_same(st, model, id, &r, "rollback after a redo");
    srv_store_free(st);
out:
    free_ctx(&b1);
    free_ctx(&b2);
    free_ctx(&now);
    rm_rf(dir);
    free(dir);
}

/* An export carries the checkpoints (a version 2 blob); an import writes
 * them with the importing session's owner tag; a blob with bad checkpoint
 * metadata is refused whole. */
TEST(checkpoints_export_import)
{
    static const char tb[] = "0123456789abcdef0123456789abcdef";
    char *dir = mkdir_tmp(), *dir2 = mkdir_tmp();
    srv_store_t *st = open_ckpt_store(dir, 8, 0), *st2 = open_ckpt_store(dir2, 2, 0);
    if (!st || !st2)
        goto out;
    char id[33], id2[33];
    make_session(st, model, 320, 1, id);
    srv_seq_ctx_t before[4] = {{0}};
    for (int t = 1; t <= 3; t++)
        one_turn(st, id, 10 * t, SRV_TURN_REPLY, &before[t]);
    void *blob = NULL;
    size_t len = 0;
    CHECK_INT_EQ(srv_store_export(st, id, &blob, &len, ERR), 0);
    core_state_info_t bi;
    CHECK_INT_EQ(core_state_peek(blob, len, &bi, NULL), 0);
    CHECK_INT_EQ(bi.version, 2);
    CHECK_INT_EQ(bi.n_checkpoints, 3);
    /* evicted, the export is the same */
    CHECK_INT_EQ(srv_store_trim(st, 0, ERR), 0);
    void *blob_e = NULL;
    size_t len_e = 0;
    CHECK_INT_EQ(srv_store_export(st, id, &blob_e, &len_e, ERR), 0);
    CHECK(len_e == len && blob_e && memcmp(blob_e, blob, len) == 0);
    free(blob_e);

    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_create(st2, &s, ERR), 0);
    if (!s)
        goto out;
    CHECK_INT_EQ(srv_session_set_owner(s, tb, ERR), 0);
    memcpy(id2, srv_session_id(s), 33);
    CHECK_INT_EQ(srv_store_release(st2, s, 1, ERR), 0);
    char err[512] = "";
    CHECK_MSG(srv_store_import(st2, id2, blob, len, err, sizeof err) == 0, "import: %s", err);
    const int64_t w[] = {1, 2}; /* st2 keeps 2 */
    check_ckpts(st2, dir2, id2, 3, w, 2, "imported");
    CHECK(dir_clean(dir2));
    CHECK_INT_EQ(srv_store_rollback(st2, id2, 1, NULL, ERR), 0);
    srv_seq_ctx_t r = copy_ctx(model, &before[3]);
    check_same(st2, model, id2, &r, "imported checkpoint");
    srv_store_free(st2);
    st2 = open_ckpt_store(dir2, 2, 0);
    if (!st2)
        goto out;
    srv_session_info_t in;
    CHECK_INT_EQ(srv_store_info(st2, id2, &in, ERR), 0);
    CHECK_STR_EQ(in.owner, tb); /* the rolled-back file carries the session's tag */
    CHECK_INT_EQ(in.turns, 2);

    /* resealed blobs with bad checkpoints are refused, nothing changes */
    core_state_info_t ci;
    const void *part = NULL;
    size_t pl = 0;
    CHECK_INT_EQ(core_state_checkpoint(blob, len, 1, &part, &pl, NULL), 0);
    size_t off = (size_t)((const unsigned char *)part - (const unsigned char *)blob);
    CHECK_INT_EQ(core_state_peek(part, pl, &ci, NULL), 0);
    unsigned char *b = malloc(len);
    memcpy(b, blob, len);
    b[off + ci.owner_off + 56] = 9; /* checkpoint 1 claims 9 turns (the session has 3) */
    put32(b + off + pl - 4, core_crc32(0, b + off, pl - 4));
    put32(b + len - 4, core_crc32(0, b, len - 4));
    err[0] = 0;
    CHECK_INT_EQ(srv_store_import(st2, id2, b, len, err, sizeof err), SRV_STORE_EMISMATCH);
    CHECK_MSG(strstr(err, "checkpoint 1: its turn count (9)") != NULL, "got: %s", err);
    memcpy(b, blob, len);
    b[off + pl - 100] ^= 1; /* a flip inside checkpoint 1, the outer blob resealed */
    put32(b + len - 4, core_crc32(0, b, len - 4));
    CHECK_INT_EQ(srv_store_import(st2, id2, b, len, err, sizeof err), SRV_STORE_EMISMATCH);
    CHECK_MSG(strstr(err, "checkpoint 1: checksum mismatch") != NULL, "got: %s", err);
    const int64_t w2[] = {1};
    check_ckpts(st2, dir2, id2, 2, w2, 1, "after refused imports");
    /* a version 1 blob (no checkpoints) leaves none */
    void *b1 = NULL;
    size_t l1 = 0;
    char plain[33];
    make_session(st, model, 330, 1, plain);
    CHECK_INT_EQ(srv_store_export(st, plain, &b1, &l1, ERR), 0);
    CHECK_INT_EQ(((unsigned char *)b1)[4], 1);
    CHECK_MSG(srv_store_import(st2, id2, b1, l1, err, sizeof err) == 0, "import: %s", err);
    check_ckpts(st2, dir2, id2, 0, NULL, 0, "after a version 1 import");
    free(b1);
    free(b);
out:
    for (int t = 0; t < 4; t++)
        if (before[t].state)
            free_ctx(&before[t]);
    free(blob);
    srv_store_free(st);
    srv_store_free(st2);
    rm_rf(dir);
    rm_rf(dir2);
    free(dir);
    free(dir2);
}

/* A linear state with exact memory rows (--memory) is larger than one
 * without (a longer ring and the rows): an export still carries every
 * checkpoint of such a session (one over the store's bound on a checkpoint
 * would be left out) and imports whole, and its file reads back. */
TEST(memory_rows_fit_the_bounds)
{
    char *dir = mkdir_tmp();
    srv_store_opts_t o = {.dir = dir, .model = model_m, .max_checkpoints = 4};
    srv_store_t *st = NULL;
    char err[SRV_STORE_ERR_MAX] = "";
    CHECK_MSG(srv_store_new(&o, &st, err, sizeof err) == 0, "store: %s", err);
    void *blob = NULL;
    if (!st)
        goto out;
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_create(st, &s, ERR), 0);
    if (!s)
        goto out;
    for (int k = 0; k < 6; k++) /* past the window, the block, and a full memory */
        advance(model_m, srv_session_ctx(s), 250, 380 + (uint64_t)k);
    char id[33], id2[33];
    memcpy(id, srv_session_id(s), 33);
    CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
    for (int t = 1; t <= 2; t++) { /* two turns: checkpoints after 0 and 1 */
        CHECK_INT_EQ(srv_store_acquire(st, id, &s, ERR), 0);
        if (!s)
            goto out;
        const int32_t in[1] = {t};
        CHECK_INT_EQ(srv_store_turn_begin(st, s, in, 1, SRV_TURN_REPLY, ERR), 0);
        advance(model_m, srv_session_ctx(s), 9, 390 + (uint64_t)t);
        CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), 0);
    }
    srv_seq_ctx_t ref = snapshot(st, model_m, id);
    CHECK_INT_EQ(srv_store_trim(st, 0, ERR), 0); /* read back from its file */
    check_same(st, model_m, id, &ref, "memory rows, from the file");
    size_t len = 0;
    core_state_info_t bi = {0};
    CHECK_INT_EQ(srv_store_export(st, id, &blob, &len, ERR), 0);
    CHECK(blob && core_state_peek(blob, len, &bi, NULL) == 0 && bi.n_checkpoints == 2);
    CHECK_MSG(len <= srv_store_max_export(st), "export of %zu bytes, bound %zu", len,
              srv_store_max_export(st));
    make_session(st, model_m, 381, 1, id2);
    CHECK_MSG(srv_store_import(st, id2, blob, len, err, sizeof err) == 0, "import: %s", err);
    srv_session_info_t in;
    CHECK_INT_EQ(srv_store_info(st, id2, &in, ERR), 0);
    CHECK_INT_EQ(in.n_checkpoints, 2);
    srv_seq_ctx_t ref2 = snapshot(st, model_m, id);
    check_same(st, model_m, id2, &ref2, "memory rows, imported");
out:
    free(blob);
    srv_store_free(st);
    rm_rf(dir);
    free(dir);
}

/* Copies file from over file to in dir (a checkpoint a crash left). */
static void copy_file(const char *dir, const char *from, const char *to)
{
    size_t l = 0;
    unsigned char *b = read_all(dir, from, &l);
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, to);
    FILE *f = b ? fopen(p, "wb") : NULL;
    CHECK_MSG(f != NULL, "copy %s to %s", from, to);
    if (f) {
        CHECK(fwrite(b, 1, l, f) == l);
        fclose(f);
    }
    free(b);
}

/* What a crash leaves of an import, whichever side of its commit (the
 * rename of the new session file): the checkpoint files of the generation
 * the session file does not name are deleted at startup, those it names
 * stay; so the session has its old set or the new one, never a mix. */
TEST(import_crash_leftovers)
{
    char *dir = mkdir_tmp(), *dir2 = mkdir_tmp();
    srv_store_t *st = open_ckpt_store(dir, 3, 0), *src = open_ckpt_store(dir2, 3, 0);
    void *blob = NULL;
    if (!st || !src)
        goto out;
    char a[33], b[33], name[80], from[80];
    make_session(src, model, 370, 1, a);
    for (int t = 1; t <= 3; t++)
        one_turn(src, a, 40 + t, SRV_TURN_REPLY, NULL);
    size_t len = 0;
    CHECK_INT_EQ(srv_store_export(src, a, &blob, &len, ERR), 0);
    make_session(st, model, 371, 1, b);
    for (int t = 1; t <= 2; t++)
        one_turn(st, b, 50 + t, SRV_TURN_REPLY, NULL);
    srv_store_free(st);
    /* before the commit: the new set (generation 1) is written, the
     * session file is still the old one (generation 0) */
    for (int t = 0; t < 3; t++) {
        snprintf(name, sizeof name, "%s.%d.1", b, t);
        snprintf(from, sizeof from, "%s.%d", b, t < 2 ? t : 0);
        copy_file(dir, from, name);
    }
    st = open_ckpt_store(dir, 3, 0);
    if (!st)
        goto out;
    const int64_t old[] = {0, 1};
    check_ckpts(st, dir, b, 2, old, 2, "a crash before the commit");
    CHECK(dir_clean(dir));
    /* after the commit: the session file names generation 1, the old set
     * (generation 0) is still there */
    char err[SRV_STORE_ERR_MAX] = "";
    CHECK_MSG(srv_store_import(st, b, blob, len, err, sizeof err) == 0, "import: %s", err);
    const int64_t neu[] = {0, 1, 2};
    check_ckpts(st, dir, b, 3, neu, 3, "imported");
    srv_store_free(st);
    for (int t = 0; t < 2; t++) {
        snprintf(name, sizeof name, "%s.%d", b, t);
        snprintf(from, sizeof from, "%s.%d.1", b, t);
        copy_file(dir, from, name);
    }
    st = open_ckpt_store(dir, 3, 0);
    if (!st)
        goto out;
    check_ckpts(st, dir, b, 3, neu, 3, "a crash after the commit");
    for (int t = 0; t < 2; t++) {
        snprintf(name, sizeof name, "%s.%d", b, t);
        CHECK_MSG(!file_exists(dir, name), "%s is left", name);
    }
    CHECK(dir_clean(dir));
    /* the new set is the session's: back to the imported checkpoint 1 */
    CHECK_INT_EQ(srv_store_rollback(st, b, 2, NULL, ERR), 0);
    const int64_t back[] = {0};
    check_ckpts(st, dir, b, 1, back, 1, "rolled back");
out:
    free(blob);
    srv_store_free(st);
    srv_store_free(src);
    rm_rf(dir);
    rm_rf(dir2);
    free(dir);
    free(dir2);
}

/* A turn or a redo whose write fails is not in the session: the count,
 * the cached size and tokens, the checkpoints and the files are as before,
 * and the store goes on from the file. */
TEST(failed_writes_leave_turns_as_they_were)
{
    char *dir = mkdir_tmp();
    srv_store_t *st = open_ckpt_store(dir, 4, 0);
    srv_seq_ctx_t b2 = {0};
    if (!st)
        goto out;
    char id[33];
    make_session(st, model, 350, 1, id);
    one_turn(st, id, 1, SRV_TURN_REPLY, NULL);
    one_turn(st, id, 2, SRV_TURN_REPLY, &b2);
    srv_session_info_t in0, in;
    CHECK_INT_EQ(srv_store_info(st, id, &in0, ERR), 0);
    hook_t h = {.budget = 0};
    srv_store_set_write_fn(st, hook_write, &h);
    srv_session_t *s = NULL;
    CHECK_INT_EQ(srv_store_acquire(st, id, &s, ERR), 0);
    const int32_t x[3] = {4, 5, 6};
    CHECK_INT_EQ(srv_store_turn_begin(st, s, x, 3, SRV_TURN_REPLY, ERR), 0);
    advance(model, srv_session_ctx(s), 9, 351);
    CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), SRV_STORE_ENOSPACE);
    CHECK_INT_EQ(srv_store_info(st, id, &in, ERR), 0);
    CHECK(in.turns == in0.turns && in.tokens == in0.tokens &&
          in.state_bytes == in0.state_bytes && in.n_checkpoints == in0.n_checkpoints);
    const int64_t w[] = {0, 1};
    check_ckpts(st, dir, id, 2, w, 2, "after a failed turn");
    /* a redo whose reply cannot be saved (the failed write sent the
     * session back to its file: read it first, as the API does) */
    CHECK_INT_EQ(srv_store_redo_prepare(st, id, ERR), SRV_STORE_EEVICTED);
    CHECK_INT_EQ(srv_store_acquire(st, id, &s, ERR), 0);
    CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    CHECK_INT_EQ(srv_store_redo_prepare(st, id, ERR), 0);
    CHECK_INT_EQ(srv_store_acquire(st, id, &s, ERR), 0);
    CHECK_INT_EQ(srv_store_redo_begin(st, s, ERR), 0);
    advance(model, srv_session_ctx(s), 3, 352);
    CHECK_INT_EQ(srv_store_release(st, s, 1, ERR), SRV_STORE_ENOSPACE);
    CHECK_INT_EQ(srv_store_info(st, id, &in, ERR), 0);
    CHECK(in.turns == in0.turns && in.tokens == in0.tokens &&
          in.state_bytes == in0.state_bytes);
    check_ckpts(st, dir, id, 2, w, 2, "after a failed redo");
    srv_store_set_write_fn(st, NULL, NULL);
    /* the last turn is still the one the file holds */
    CHECK_INT_EQ(srv_store_acquire(st, id, &s, ERR), 0);
    unsigned fl = 0;
    const int32_t *li = NULL;
    size_t nl = 0;
    CHECK_INT_EQ(srv_session_last_turn(s, &fl, &li, &nl), 1);
    CHECK(nl == 2 && li && li[0] == 2);
    CHECK_INT_EQ(srv_store_release(st, s, 0, ERR), 0);
    CHECK_INT_EQ(srv_store_rollback(st, id, 1, NULL, ERR), 0);
    srv_seq_ctx_t r = copy_ctx(model, &b2);
    check_same(st, model, id, &r, "rollback after failed writes");
    srv_store_free(st);
out:
    if (b2.state)
        free_ctx(&b2);
    rm_rf(dir);
    free(dir);
}

/* The directory's budgets take checkpoints (oldest first, of the least
 * recently used sessions) before any session. */
TEST(disk_budget_takes_checkpoints_first)
{
    char *dir = mkdir_tmp();
    srv_store_t *st = open_ckpt_store(dir, 8, 0);
    char a[33], b[33];
    if (!st)
        goto out;
    make_session(st, model, 340, 1, a);
    srv_session_info_t in;
    CHECK_INT_EQ(srv_store_info(st, a, &in, ERR), 0);
    const size_t one = in.state_bytes + 8; /* and a turn's input */
    srv_store_free(st);
    /* room for 5 files: once b's turns need more, a (least recently used)
     * loses its checkpoints, oldest first, and no session goes */
    st = open_ckpt_store(dir, 8, 5 * one + one / 2);
    if (!st)
        goto out;
    for (int t = 1; t <= 3; t++)
        one_turn(st, a, t, SRV_TURN_REPLY, NULL);
    make_session(st, model, 341, 1, b);
    const int64_t wa[] = {0, 1, 2};
    check_ckpts(st, dir, a, 3, wa, 3, "a before b's turns");
    for (int t = 1; t <= 3; t++)
        one_turn(st, b, t, SRV_TURN_REPLY, NULL);
    check_ckpts(st, dir, a, 3, NULL, 0, "a");
    check_ckpts(st, dir, b, 3, wa, 3, "b");
    uint64_t evicted = 0;
    srv_store_disk_stats(st, NULL, &evicted);
    CHECK_INT_EQ(evicted, 0);
    srv_store_free(st);
out:
    rm_rf(dir);
    free(dir);
}

int main(void)
{
    const char *tiny = getenv("DARKSERVE_TINY_MODEL");
    if (!tiny) {
        printf("DARKSERVE_TINY_MODEL is not set\n");
        return 1;
    }
    core_model_opts_t o = {.attn_kind = CORE_ATTN_PERFORMER, .n_features = 16, .window = 4,
                           .seed = 5};
    core_model_opts_t ox = {.attn_kind = CORE_ATTN_EXACT};
    core_model_opts_t om = o;
    om.memory = 1024;
    core_error_t err = {0};
    if (core_model_load(tiny, &o, &model, &err) < 0 || core_model_load(tiny, &ox, &model_x, &err) < 0 ||
        core_model_load(tiny, &om, &model_m, &err) < 0) {
        printf("load: %s\n", err.msg);
        return 1;
    }
    V = core_model_info(model)->n_vocab;
    RUN(create_acquire_release_delete);
    RUN(ids_unique_and_validated);
    RUN(persist_and_reopen);
    RUN(directory_checks);
    RUN(lru_eviction_by_count_and_bytes);
    RUN(ttl_sweep);
    RUN(mem_stats_and_trim);
    RUN(disk_budget_by_count_and_bytes);
    RUN(owners_persist_and_filter);
    RUN(fork_is_an_independent_copy);
    RUN(export_import);
    RUN(pending_grammar_round_trip);
    RUN(user_turn_open_persists);
    RUN(import_checks_the_pending_grammar);
    RUN(write_failures_keep_the_previous_file);
    RUN(no_io_thread_leaves_disk_work_to_settle);
    RUN(acquire_in_memory_never_reads);
    RUN(crash_leftovers_at_startup);
    RUN(threads);
    RUN(turn_checkpoints_and_rollback);
    RUN(redo_replaces_the_last_turn);
    RUN(checkpoints_export_import);
    RUN(import_crash_leftovers);
    RUN(memory_rows_fit_the_bounds);
    RUN(disk_budget_takes_checkpoints_first);
    RUN(failed_writes_leave_turns_as_they_were);
    core_model_free(model);
    core_model_free(model_x);
    core_model_free(model_m);
    return CHECK_DONE();
}
