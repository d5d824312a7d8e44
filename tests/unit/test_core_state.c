/* core/state.c on the tiny fixture model (env DARKSERVE_TINY_MODEL), for every
 * attention kind: a state saved, loaded into another state and continued
 * gives logits bit-identical to continuing the original; blob sizes; every
 * refusal with its own message and nothing changed after it; the sampler,
 * pending and owner sections. The reference for "correct" is the original
 * state continued in place, so nothing here depends on stored outputs. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/attn/attn.h"
#include "core/attn/attn_linear.h"
#include "core/attn/features.h"
#include "core/model.h"
#include "core/rng.h"
#include "core/sample.h"
#include "core/state.h"
#include "core/crc32.h"
#include "core/tensor.h"
#include "tests/unit/check.h"
#include "tests/unit/helpers.h"

#define M_FEAT 32
#define SEED 7

static const char *tiny_path;
static char adapter_a[128], adapter_b[128], adapter_is[128];

/* ---- helpers ---- */

/* Adapter with random non-identity Mat (noise > 0 around I) and a random
 * Λ (eigenvalues spread up to lam_top) for every layer and KV head. */
static int write_adapter(const char *path, core_attn_kind_t kind, const core_model_info_t *in,
                         int W, uint64_t rseed)
{
    int hd = in->head_dim;
    size_t tot = (size_t)in->n_layer * in->n_head_kv * hd * hd;
    float *mat = malloc(tot * sizeof(float)), *lam = malloc(tot * sizeof(float));
    double *bm = malloc((size_t)hd * hd * sizeof(double));
    core_rng_t r;
    core_rng_seed(&r, rseed);
    for (size_t b = 0; b < tot; b += (size_t)hd * hd) {
        double dmax = 0;
        for (int i = 0; i < hd * hd; i++)
            bm[i] = core_rng_normal(&r) * (i % hd < 3 ? 1.0 : 0.2);
        for (int i = 0; i < hd; i++)
            for (int j = 0; j < hd; j++) {
                double acc = 0;
                for (int t = 0; t < hd; t++)
                    acc += bm[i * hd + t] * bm[j * hd + t];
                lam[b + (size_t)i * hd + j] = (float)acc;
                if (i == j && acc > dmax)
                    dmax = acc;
            }
        for (int i = 0; i < hd * hd; i++) {
            lam[b + i] = (float)(lam[b + i] * 0.3 / dmax);
            mat[b + i] = (float)((i / hd == i % hd ? 1.0 : 0.0) + 0.3 * core_rng_normal(&r));
        }
    }
    core_features_adapter_desc_t d = {.kind = kind, .n_layer = in->n_layer,
                                      .n_head_kv = in->n_head_kv, .head_dim = hd,
                                      .n_features = M_FEAT, .window = W, .seed = SEED,
                                      .base_fingerprint = in->fingerprint, .mat = mat,
                                      .lambda = lam};
    core_error_t err = {0};
    int rc = core_features_adapter_write(&d, path, &err);
    CHECK_MSG(rc == 0, "adapter: %s", err.msg);
    free(mat);
    free(lam);
    free(bm);
    return rc;
}

static core_model_t *load(core_attn_kind_t kind, int W, const char *adapter, int64_t max_ctx)
{
    core_model_opts_t o = {.attn_kind = kind, .n_features = M_FEAT, .window = W,
                           .max_ctx = max_ctx, .seed = SEED, .adapter_path = adapter};
    core_model_t *m = NULL;
    core_error_t err = {0};
    int rc = core_model_load(tiny_path, &o, &m, &err);
    CHECK_MSG(rc == 0, "load %s W=%d: %s", core_attn_kind_name(kind), W, err.msg);
    return m;
}

static core_attn_state_t *new_state(core_model_t *m)
{
    core_attn_state_t *s = NULL;
    core_error_t err = {0};
    int rc = core_attn_state_new(core_model_attn(m), &s, &err);
    CHECK_MSG(rc == 0, "state: %s", err.msg);
    return s;
}

/* Feeds n tokens in forwards of at most 300; logits of the last into last
 * (may be NULL). */
static int feed(core_model_t *m, core_attn_state_t *s, const int32_t *tok, int64_t n, float *last)
{
    for (int64_t i = 0; i < n; i += 300) {
        int64_t c = n - i < 300 ? n - i : 300;
        int want = last && i + c == n;
        core_batch_seq_t sq = {.state = s, .tokens = tok + i, .n_tokens = c,
                               .logits_mode = want ? CORE_LOGITS_LAST : CORE_LOGITS_NONE,
                               .logits = want ? last : NULL};
        core_error_t err = {0};
        int rc = core_model_forward(m, &sq, 1, &err);
        CHECK_MSG(rc == 0, "forward: %s", err.msg);
        if (rc)
            return rc;
    }
    return 0;
}

static void rand_tokens(uint64_t seed, int32_t *t, int64_t n, int V)
{
    core_rng_t r;
    core_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++)
        t[i] = (int32_t)(core_rng_u64(&r) % (uint64_t)V);
}

static int32_t argmax(const float *x, int V)
{
    int32_t b = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static core_sampler_t *new_sampler(uint64_t seed)
{
    core_sample_params_t p;
    core_sample_params_default(&p);
    p.seed = seed;
    core_sampler_t *s = NULL;
    core_error_t err = {0};
    CHECK_INT_EQ(core_sampler_new(&p, &s, &err), 0);
    return s;
}

/* Saves (state, sampler, pending, owner) into a new buffer. */
static unsigned char *save(core_model_t *m, const core_attn_state_t *s, const core_sampler_t *smp,
                           const int32_t *pend, size_t np, const char *owner, size_t *len)
{
    core_state_desc_t d = {.fingerprint = core_model_info(m)->fingerprint, .state = s,
                           .sampler = smp, .pending = pend, .n_pending = np, .owner = owner,
                           .owner_len = owner ? strlen(owner) : 0};
    size_t n = core_state_size(s, smp, np, d.owner_len);
    unsigned char *buf = malloc(n + 16);
    core_error_t err = {0};
    *len = 0;
    int rc = core_state_save(&d, buf, n + 16, len, &err);
    CHECK_MSG(rc == 0, "save: %s", err.msg);
    CHECK_INT_EQ(*len, n);
    return buf;
}

static unsigned char *sampler_bytes(const core_sampler_t *s)
{
    unsigned char *b = malloc(core_sampler_state_size());
    CHECK_INT_EQ(core_sampler_state_save(s, b, core_sampler_state_size(), NULL), 0);
    return b;
}

/* ---- bit-identical continuation, every kind ---- */

/* Runs prompt_len tokens on A (fp64 accumulators if asked), saves, loads into
 * B (after dirtying B with other tokens when dirty_dest), then 20 greedy
 * steps on both: logits must be memcmp-equal at every step. */
static void continue_case(core_model_t *m, int prompt_len, int fp64_src, int dirty_dest)
{
    const core_model_info_t *in = core_model_info(m);
    const int V = in->n_vocab;
    core_attn_t *a = core_model_attn(m);
    const core_attn_cfg_t *cfg = core_attn_config(a);
    const char *what = core_attn_kind_name(cfg->kind);
    core_error_t err = {0};
    if (fp64_src) {
        core_attn_linear_opts_t o = {64, 1, 0};
        CHECK_INT_EQ(core_attn_linear_set_opts(a, &o, &err), 0);
    }
    core_attn_state_t *A = new_state(m);
    if (fp64_src) {
        core_attn_linear_opts_t o = {64, 0, 0};
        CHECK_INT_EQ(core_attn_linear_set_opts(a, &o, &err), 0);
    }
    core_attn_state_t *B = new_state(m);
    int32_t *prompt = malloc((size_t)prompt_len * sizeof *prompt);
    float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    rand_tokens(100 + (uint64_t)prompt_len, prompt, prompt_len, V);
    if (!A || !B || feed(m, A, prompt, prompt_len, la))
        goto out;
    if (dirty_dest) {
        int32_t junk[7];
        rand_tokens(5, junk, 7, V);
        feed(m, B, junk, 7, NULL);
    }
    core_sampler_t *sa = new_sampler(11), *sb = new_sampler(99);
    for (int i = 0; i < prompt_len; i++)
        core_sampler_accept(sa, prompt[i], NULL);
    const int32_t pend[3] = {4, 0, (int32_t)(V - 1)};
    size_t len = 0;
    unsigned char *blob = save(m, A, sa, pend, 3, "owner-meta", &len);

    int32_t *gp = NULL;
    size_t gn = 0, ol = 0;
    const void *own = NULL;
    int rc = core_state_load(blob, len, in->fingerprint, B, sb, &gp, &gn, &own, &ol, &err);
    CHECK_MSG(rc == 0, "%s W=%d load: %s", what, cfg->window, err.msg);
    CHECK_INT_EQ(core_attn_state_pos(B), prompt_len);
    CHECK_INT_EQ(gn, 3);
    CHECK(gp && memcmp(gp, pend, sizeof pend) == 0);
    CHECK_INT_EQ(ol, strlen("owner-meta"));
    CHECK(own && memcmp(own, "owner-meta", ol) == 0);
    unsigned char *ba = sampler_bytes(sa), *bb = sampler_bytes(sb);
    CHECK(memcmp(ba, bb, core_sampler_state_size()) == 0);
    /* B re-saved is the same blob (also in the accumulator precision of A). */
    size_t len2 = 0;
    unsigned char *blob2 = save(m, B, sb, pend, 3, "owner-meta", &len2);
    CHECK(len2 == len && memcmp(blob, blob2, len) == 0);

    int32_t tok = argmax(la, V);
    int same = 1;
    for (int step = 0; step < 20 && same; step++) {
        if (feed(m, A, &tok, 1, la) || feed(m, B, &tok, 1, lb))
            break;
        same = memcmp(la, lb, (size_t)V * sizeof(float)) == 0;
        CHECK_MSG(same, "%s W=%d prompt %d fp64 %d: logits differ at step %d", what, cfg->window,
                  prompt_len, fp64_src, step);
        tok = argmax(la, V);
    }
    free(gp);
    free(blob);
    free(blob2);
    free(ba);
    free(bb);
    core_sampler_free(sa);
    core_sampler_free(sb);
out:
    free(prompt);
    free(la);
    free(lb);
    core_attn_state_free(A);
    core_attn_state_free(B);
}

static core_model_t *load_kind(core_attn_kind_t kind, int W)
{
    const char *ad = kind == CORE_ATTN_DARKFORMER      ? adapter_a
                     : kind == CORE_ATTN_DARKFORMER_IS ? adapter_is
                                                       : NULL;
    return load(kind, W, ad, 0);
}

TEST(continuation_exact)
{
    core_model_t *m = load(CORE_ATTN_EXACT, 0, NULL, 0);
    if (!m)
        return;
    continue_case(m, 1, 0, 0);
    continue_case(m, 100, 0, 1);
    continue_case(m, 257, 0, 0); /* past the cache's first growth chunk */
    core_model_free(m);
}

static void continuation_linear(core_attn_kind_t kind)
{
    for (int W = 0; W <= 4; W += 4) {
        core_model_t *m = load_kind(kind, W);
        if (!m)
            continue;
        continue_case(m, 3, 0, 0);   /* W=4: window not yet full */
        continue_case(m, 100, 0, 1); /* across a prefill chunk, ring wrapped */
        continue_case(m, 70, 1, 1);  /* double accumulators, loaded into a float state */
        core_model_free(m);
    }
}

TEST(continuation_performer)
{
    continuation_linear(CORE_ATTN_PERFORMER);
}

TEST(continuation_darkformer)
{
    continuation_linear(CORE_ATTN_DARKFORMER);
}

TEST(continuation_darkformer_is)
{
    continuation_linear(CORE_ATTN_DARKFORMER_IS);
}

/* ---- sizes ---- */

static size_t size_after(core_model_t *m, int64_t n)
{
    int V = core_model_info(m)->n_vocab;
    int32_t *t = malloc((size_t)n * sizeof *t);
    rand_tokens(77, t, n, V);
    core_attn_state_t *s = new_state(m);
    size_t sz = 0, len = 0;
    if (s && feed(m, s, t, n, NULL) == 0) {
        sz = core_state_size(s, NULL, 0, 0);
        unsigned char *b = save(m, s, NULL, NULL, 0, NULL, &len);
        CHECK_INT_EQ(len, sz);
        free(b);
    }
    core_attn_state_free(s);
    free(t);
    return sz;
}

TEST(linear_size_independent_of_tokens)
{
    const core_attn_kind_t kinds[] = {CORE_ATTN_PERFORMER, CORE_ATTN_DARKFORMER,
                                      CORE_ATTN_DARKFORMER_IS};
    for (size_t k = 0; k < 3; k++) {
        for (int W = 0; W <= 4; W += 4) {
            core_model_t *m = load_kind(kinds[k], W);
            if (!m)
                continue;
            const core_model_info_t *in = core_model_info(m);
            size_t s1 = size_after(m, 1000), s5 = size_after(m, 5000);
            CHECK_MSG(s1 == s5 && s1 > 0, "%s W=%d: %zu bytes after 1000 tokens, %zu after 5000",
                      core_attn_kind_name(kinds[k]), W, s1, s5);
            /* Independent count of what the blob must hold: header, crc, the
             * payload's two u32, c (f64), S and z (f32), W window rows of
             * keys and values as halves. */
            size_t nh = (size_t)in->n_layer * in->n_head_kv, hd = (size_t)in->head_dim;
            size_t want = CORE_STATE_HEADER_BYTES + 4 + 8 + nh * M_FEAT * 8 +
                          nh * M_FEAT * hd * 4 + nh * M_FEAT * 4 + 2 * nh * (size_t)W * hd * 2;
            CHECK_INT_EQ(s1, want);
            core_model_free(m);
        }
    }
    core_model_t *m = load(CORE_ATTN_EXACT, 0, NULL, 0);
    if (m) {
        const core_model_info_t *in = core_model_info(m);
        size_t s = size_after(m, 300);
        CHECK_INT_EQ(s, CORE_STATE_HEADER_BYTES + 4 + 2 * (size_t)in->n_layer * 300 *
                            in->n_head_kv * in->head_dim * 4);
        core_model_free(m);
    }
}

/* ---- refusals ---- */

typedef struct victim {
    core_model_t *m;
    core_attn_state_t *s;
    core_sampler_t *smp;
    unsigned char *snap; /* its blob before any refusal */
    size_t snap_len;
} victim_t;

static void victim_init(victim_t *v, core_model_t *m)
{
    memset(v, 0, sizeof *v);
    v->m = m;
    v->s = new_state(m);
    v->smp = new_sampler(3);
    int32_t t[5] = {1, 2, 3, 4, 5};
    feed(m, v->s, t, 5, NULL);
    core_sampler_accept(v->smp, 9, NULL);
    v->snap = save(m, v->s, v->smp, NULL, 0, NULL, &v->snap_len);
}

static int victim_unchanged(victim_t *v)
{
    size_t len = 0;
    unsigned char *b = save(v->m, v->s, v->smp, NULL, 0, NULL, &len);
    int same = len == v->snap_len && memcmp(b, v->snap, len) == 0;
    free(b);
    return same;
}

static void victim_free(victim_t *v)
{
    core_attn_state_free(v->s);
    core_sampler_free(v->smp);
    free(v->snap);
}

/* Loads buf into the victim; checks the code, that the message contains
 * want (if non-NULL), and that nothing changed. Returns the code. */
static int refuse(victim_t *v, const void *buf, size_t len, const char *fp, int code,
                  const char *want, const char *ctx)
{
    core_error_t err = {0};
    int32_t *pend = (int32_t *)(uintptr_t)0x1;
    size_t np = 12345, ol = 54321;
    const void *own = (const void *)(uintptr_t)0x2;
    int rc = core_state_load(buf, len, fp ? fp : core_model_info(v->m)->fingerprint, v->s,
                             v->smp, &pend, &np, &own, &ol, &err);
    int ok = rc == code && (!want || strstr(err.msg, want)) && np == 12345 && ol == 54321 &&
             pend == (int32_t *)(uintptr_t)0x1 && own == (const void *)(uintptr_t)0x2;
    CHECK_MSG(ok, "%s: rc %d (want %d), message \"%s\" (want \"%s\")", ctx, rc, code, err.msg,
              want ? want : "");
    CHECK_MSG(victim_unchanged(v), "%s: state changed by a refused load", ctx);
    return rc;
}

/* A performer W=4 blob with every section: refused truncated at every length,
 * with bit flips, bad magic, a future version, another fingerprint. */
/* blob (len bytes, no checkpoints) with its linear payload's window and
 * sink rows (every half after the payload's first acc bytes, at off_attn)
 * written as f32 and the half-rows flag cleared, as payloads were before the
 * rows became halves: llen bytes, header sizes and checksum to match. */
static unsigned char *f32_rows_blob(const unsigned char *blob, size_t len, size_t off_attn,
                                    size_t acc, size_t llen)
{
    unsigned char *b = calloc(llen, 1);
    memcpy(b, blob, off_attn + acc);
    b[off_attn + 1] = 0; /* word 0 = accumulator bytes | 0x100 */
    size_t nrow = (len - 4 - off_attn - acc) / 2;
    for (size_t i = 0; i < nrow; i++) {
        uint16_t h = (uint16_t)(blob[off_attn + acc + 2 * i] | blob[off_attn + acc + 2 * i + 1] << 8);
        float f = core_fp16_to_fp32(h);
        uint32_t u;
        memcpy(&u, &f, 4);
        put_le32(b + off_attn + acc + 4 * i, u);
    }
    uint64_t total = llen, attn = llen - 4 - off_attn;
    for (int i = 0; i < 8; i++) {
        b[8 + i] = (unsigned char)(total >> (8 * i));
        b[112 + i] = (unsigned char)(attn >> (8 * i));
    }
    reseal(b, llen);
    return b;
}

TEST(refusals_framing)
{
    core_model_t *m = load_kind(CORE_ATTN_PERFORMER, 4);
    if (!m)
        return;
    const core_model_info_t *in = core_model_info(m);
    core_attn_state_t *s = new_state(m);
    core_sampler_t *smp = new_sampler(1);
    int32_t t[40];
    rand_tokens(8, t, 40, in->n_vocab);
    feed(m, s, t, 40, NULL);
    const int32_t pend[2] = {7, 8};
    size_t len = 0;
    unsigned char *blob = save(m, s, smp, pend, 2, "meta", &len);
    victim_t v;
    victim_init(&v, m);
    char want[160], ctx[64];

    for (size_t n = 0; n < len; n++) {
        snprintf(want, sizeof want, "truncated: %zu bytes, need %zu", n,
                 n >= 16 ? len : (size_t)CORE_STATE_HEADER_BYTES + 4);
        snprintf(ctx, sizeof ctx, "truncated to %zu", n);
        if (refuse(&v, blob, n, NULL, CORE_EFORMAT, want, ctx) != CORE_EFORMAT)
            break;
    }
    unsigned char *b = malloc(len + 1);
    memcpy(b, blob, len);
    b[len] = 0;
    refuse(&v, b, len + 1, NULL, CORE_EFORMAT, "trailing bytes", "one byte too many");

    /* Every bit of the header past the frame fields and of the first bytes
     * of every section, then a stride through the payload and the crc. */
    for (size_t i = 16; i < len; i += i < 400 ? 1 : 97) {
        for (int bit = 0; bit < 8; bit += i < 400 ? 1 : 3) {
            memcpy(b, blob, len);
            b[i] ^= (unsigned char)(1u << bit);
            snprintf(ctx, sizeof ctx, "bit %d of byte %zu", bit, i);
            if (refuse(&v, b, len, NULL, CORE_ECHECKSUM, "checksum mismatch", ctx) !=
                CORE_ECHECKSUM)
                goto flips_done;
        }
    }
flips_done:
    for (size_t i = len - 4; i < len; i++) {
        memcpy(b, blob, len);
        b[i] ^= 0x80;
        refuse(&v, b, len, NULL, CORE_ECHECKSUM, "checksum mismatch", "flip in the crc");
    }
    memcpy(b, blob, len);
    b[0] = 'X';
    refuse(&v, b, len, NULL, CORE_EFORMAT, "not a darkserve state blob (bad magic)", "magic");
    memcpy(b, blob, len);
    put_le32(b + 4, CORE_STATE_VERSION + 1);
    reseal(b, len);
    snprintf(want, sizeof want, "state blob version %u is not supported (this server reads 1 to %u)",
             CORE_STATE_VERSION + 1, CORE_STATE_VERSION);
    refuse(&v, b, len, NULL, CORE_EUNSUPPORTED, want, "future version");
    /* A position past 2^48 (the hardening issue's 2^63 - 1: a ring slot from
     * pos % W went negative and wrote out of bounds) is refused up front. */
    const int64_t bad_pos[] = {INT64_MAX, CORE_ATTN_MAX_POS + 1, -1};
    for (int i = 0; i < 3; i++) {
        memcpy(b, blob, len);
        put_le32(b + 104, (uint32_t)((uint64_t)bad_pos[i] & 0xffffffffu));
        put_le32(b + 108, (uint32_t)((uint64_t)bad_pos[i] >> 32));
        reseal(b, len);
        snprintf(want, sizeof want, "position %lld outside [0, 2^48]", (long long)bad_pos[i]);
        refuse(&v, b, len, NULL, CORE_EFORMAT, want, "position out of range");
    }
    /* The total field claims another extent (frame fields precede the crc). */
    memcpy(b, blob, len);
    put_le32(b + 8, (uint32_t)(len + 256));
    snprintf(want, sizeof want, "truncated: %zu bytes, need %zu", len, len + 256);
    refuse(&v, b, len, NULL, CORE_EFORMAT, want, "total field larger");
    put_le32(b + 8, (uint32_t)(len - 256));
    snprintf(want, sizeof want, "trailing bytes: %zu bytes, the blob is %zu", len, len - 256);
    refuse(&v, b, len, NULL, CORE_EFORMAT, want, "total field smaller");

    const char *other = "0123456789abcdef";
    snprintf(want, sizeof want, "blob is for model %s, this server runs %s", in->fingerprint,
             other);
    refuse(&v, blob, len, other, CORE_EMISMATCH, want, "other model");

    /* Resealed inconsistencies: the checksum is no authentication. */
    core_state_info_t info;
    CHECK_INT_EQ(core_state_peek(blob, len, &info, NULL), 0);
    size_t off_pend = info.owner_off + info.owner_len;
    memcpy(b, blob, len);
    put_le32(b + off_pend + 4, 0x80000001u);
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "pending token 1", "negative pending id");
    memcpy(b, blob, len);
    put_le32(b + 124, 3); /* one more pending token than the sections hold */
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "do not add up", "section sizes");
    memcpy(b, blob, len);
    put_le32(b + 120, 16);
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "sampler section", "sampler size");
    memcpy(b, blob, len);
    put_le32(b + 124, (uint32_t)CORE_STATE_MAX_PENDING + 1);
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "over the limits", "pending limit");
    memcpy(b, blob, len);
    b[16 + 20] = 'x'; /* after the fingerprint's NUL */
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "fingerprint padding", "fingerprint padding");
    /* Attention payload: the first running log-scale set to +inf, then NaN in S. */
    size_t off_attn = off_pend + 4 * info.n_pending + core_sampler_state_size();
    memcpy(b, blob, len);
    const double pinf = INFINITY;
    memcpy(b + off_attn + 8, &pinf, 8);
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "bad scale", "+inf scale");
    /* a head's first scale made the odd one out (finite among -inf, or
     * -inf among finite): a head holds keys on all features or on none */
    memcpy(b, blob, len);
    double c0;
    memcpy(&c0, b + off_attn + 8, 8);
    const double odd = c0 > -INFINITY ? -INFINITY : 0.0;
    memcpy(b + off_attn + 8, &odd, 8);
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "head 0 has scales both -inf and finite",
           "mixed scales");
    size_t nz = (size_t)in->n_layer * in->n_head_kv * M_FEAT;
    memcpy(b, blob, len);
    const float fnan = NAN;
    memcpy(b + off_attn + 8 + nz * 8 + 40, &fnan, 4);
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "non-finite S", "NaN in S");
    /* The first window row's key an infinite half (c, S, z come before
     * the window rows), then a NaN one. */
    const size_t off_rows = off_attn + 8 + nz * 8 + nz * (size_t)in->head_dim * 4 + nz * 4;
    const unsigned char half_inf[2] = {0x00, 0x7c}, half_nan[2] = {0x01, 0xfe};
    memcpy(b, blob, len);
    memcpy(b + off_rows, half_inf, 2);
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "non-finite or out-of-range window row in layer 0",
           "infinite window key");
    memcpy(b, blob, len);
    memcpy(b + off_rows + 6, half_nan, 2);
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "non-finite or out-of-range window row in layer 0",
           "NaN window key");
    /* The same state with f32 window rows (payloads written before the
     * rows were halves) loads, and saves again as the original blob; a key
     * past half precision's range there is refused. */
    size_t acc = 8 + nz * 8 + nz * (size_t)in->head_dim * 4 + nz * 4;
    size_t nrow = (len - 4 - off_attn - acc) / 2, llen = len + 2 * nrow;
    unsigned char *lb = f32_rows_blob(blob, len, off_attn, acc, llen);
    core_attn_state_t *ls = new_state(m);
    core_sampler_t *lsmp = new_sampler(2);
    core_error_t lerr = {0};
    int lrc = core_state_load(lb, llen, NULL, ls, lsmp, NULL, NULL, NULL, NULL, &lerr);
    CHECK_MSG(lrc == 0, "f32 window rows: %s", lerr.msg);
    size_t rlen = 0;
    unsigned char *again = lrc == 0 ? save(m, ls, lsmp, pend, 2, "meta", &rlen) : NULL;
    CHECK_MSG(again && rlen == len && memcmp(again, blob, len) == 0,
              "f32 window rows: saved again, %zu bytes, not the original %zu", rlen, len);
    free(again);
    core_attn_state_free(ls);
    core_sampler_free(lsmp);
    const float huge = 1e30f;
    memcpy(lb + off_attn + acc + 4 * 5, &huge, 4);
    reseal(lb, llen);
    refuse(&v, lb, llen, NULL, CORE_EFORMAT, "non-finite or out-of-range window row in layer 0",
           "huge f32 window key");
    free(lb);
    memcpy(b, blob, len);
    put_le32(b + off_attn, 5);
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "accumulator size 5", "precision");
    memcpy(b, blob, len);
    put_le32(b + off_attn + 4, 3);
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "3 window rows", "window rows");
    /* Sampler section: its own checks run under ours. */
    memcpy(b, blob, len);
    b[off_pend + 8 + 20] ^= 1;
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_ECHECKSUM, "sampler state", "sampler crc");

    /* The intact blob still loads into the victim after all that. */
    core_error_t err = {0};
    CHECK_INT_EQ(core_state_load(blob, len, in->fingerprint, v.s, v.smp, NULL, NULL, NULL, NULL,
                                 &err), 0);
    CHECK_INT_EQ(core_attn_state_pos(v.s), 40);
    free(b);
    free(blob);
    victim_free(&v);
    core_sampler_free(smp);
    core_attn_state_free(s);
    core_model_free(m);
}

static core_attn_t *attn_like(const core_attn_cfg_t *base, core_attn_kind_t kind, int M, int W,
                              uint64_t seed, int64_t max_ctx, const char *adapter)
{
    core_attn_cfg_t c = *base;
    c.kind = kind;
    c.n_features = M;
    c.window = W;
    c.seed = seed;
    c.max_ctx = max_ctx;
    core_gguf_t *g = NULL;
    core_attn_t *a = NULL;
    core_error_t err = {0};
    if (adapter && core_gguf_open(adapter, &g, &err) < 0) {
        CHECK_MSG(0, "adapter: %s", err.msg);
        return NULL;
    }
    int rc = core_attn_new(&c, g, &a, &err);
    CHECK_MSG(rc == 0, "attn: %s", err.msg);
    /* core_attn_new copies what it needs from the adapter (features.c). */
    core_gguf_close(g);
    return a;
}

/* Loads blob into a fresh state of a; expects code + message. */
static void refuse_attn(const unsigned char *blob, size_t len, const char *fp, core_attn_t *a,
                        int code, const char *want, const char *ctx, int payload)
{
    if (!a)
        return;
    core_attn_state_t *s = NULL;
    core_error_t err = {0};
    CHECK_INT_EQ(core_attn_state_new(a, &s, &err), 0);
    int rc = core_state_load(blob, len, fp, s, NULL, NULL, NULL, NULL, NULL, &err);
    CHECK_MSG(rc == code && strstr(err.msg, want), "%s: rc %d, \"%s\" (want \"%s\")", ctx, rc,
              err.msg, want);
    CHECK_INT_EQ(core_attn_state_pos(s), 0);
    /* verify stops short of the payload's values. */
    rc = core_state_verify(blob, len, fp, a, &err);
    if (payload)
        CHECK_MSG(rc == 0, "%s verify: rc %d, \"%s\"", ctx, rc, err.msg);
    else
        CHECK_MSG(rc == code && strstr(err.msg, want), "%s verify: rc %d, \"%s\"", ctx, rc,
                  err.msg);
    core_attn_state_free(s);
}

TEST(refusals_attention_config)
{
    core_model_t *pm = load_kind(CORE_ATTN_PERFORMER, 4);
    core_model_t *dm = load_kind(CORE_ATTN_DARKFORMER, 4);
    core_model_t *em = load(CORE_ATTN_EXACT, 0, NULL, 0);
    if (!pm || !dm || !em)
        goto out;
    const core_model_info_t *in = core_model_info(pm);
    const char *fp = in->fingerprint;
    const core_attn_cfg_t *base = core_attn_config(core_model_attn(pm));
    int32_t t[100];
    rand_tokens(9, t, 100, in->n_vocab);
    size_t plen = 0, dlen = 0, elen = 0;
    core_attn_state_t *ps = new_state(pm), *ds = new_state(dm), *es = new_state(em);
    feed(pm, ps, t, 30, NULL);
    feed(dm, ds, t, 30, NULL);
    feed(em, es, t, 100, NULL);
    unsigned char *pb = save(pm, ps, NULL, NULL, 0, NULL, &plen);
    unsigned char *db = save(dm, ds, NULL, NULL, 0, NULL, &dlen);
    unsigned char *eb = save(em, es, NULL, NULL, 0, NULL, &elen);
    char want[200];
    const char *have = "blob has attention performer m=32 W=4 S=0 seed=7, this server runs";

    core_attn_t *a = attn_like(base, CORE_ATTN_PERFORMER, 64, 4, SEED, 0, NULL);
    snprintf(want, sizeof want, "%s performer m=64 W=4 S=0 seed=7", have);
    refuse_attn(pb, plen, fp, a, CORE_EMISMATCH, want, "other m", 0);
    core_attn_free(a);
    a = attn_like(base, CORE_ATTN_PERFORMER, M_FEAT, 0, SEED, 0, NULL);
    snprintf(want, sizeof want, "%s performer m=32 W=0 S=0 seed=7", have);
    refuse_attn(pb, plen, fp, a, CORE_EMISMATCH, want, "other W", 0);
    core_attn_free(a);
    a = attn_like(base, CORE_ATTN_PERFORMER, M_FEAT, 4, SEED + 1, 0, NULL);
    snprintf(want, sizeof want, "%s performer m=32 W=4 S=0 seed=8", have);
    refuse_attn(pb, plen, fp, a, CORE_EMISMATCH, want, "other seed", 0);
    core_attn_free(a);
    snprintf(want, sizeof want, "%s darkformer m=32 W=4 S=0 seed=7", have);
    refuse_attn(pb, plen, fp, core_model_attn(dm), CORE_EMISMATCH, want, "other kind", 0);
    snprintf(want, sizeof want, "%s exact", have);
    refuse_attn(pb, plen, fp, core_model_attn(em), CORE_EMISMATCH, want, "linear into exact", 0);
    refuse_attn(eb, elen, fp, core_model_attn(pm), CORE_EMISMATCH,
                "blob has attention exact, this server runs performer m=32 W=4 S=0 seed=7",
                "exact into linear", 0);
    a = attn_like(base, CORE_ATTN_EXACT, 0, 0, 0, 64, NULL);
    refuse_attn(eb, elen, fp, a, CORE_EMISMATCH,
                "exact attention state of 100 tokens does not fit this server's context of 64",
                "exact longer than the context", 0);
    core_attn_free(a);
    /* Exact does not care about the seed, M or W fields, nor a larger context. */
    a = attn_like(base, CORE_ATTN_EXACT, 5, 3, 99, 200, NULL);
    if (a) {
        core_attn_state_t *s = NULL;
        core_error_t err = {0};
        CHECK_INT_EQ(core_attn_state_new(a, &s, &err), 0);
        CHECK_INT_EQ(core_state_load(eb, elen, fp, s, NULL, NULL, NULL, NULL, NULL, &err), 0);
        CHECK_INT_EQ(core_attn_state_pos(s), 100);
        core_attn_state_free(s);
        core_attn_free(a);
    }
    core_attn_cfg_t shape = *base;
    shape.n_layer = base->n_layer - 1;
    a = attn_like(&shape, CORE_ATTN_PERFORMER, M_FEAT, 4, SEED, 0, NULL);
    snprintf(want, sizeof want, "blob has attention shape L=%d H=%d Hkv=%d Hd=%d, this server runs "
             "L=%d H=%d Hkv=%d Hd=%d", base->n_layer, base->n_head, base->n_head_kv,
             base->head_dim, base->n_layer - 1, base->n_head, base->n_head_kv, base->head_dim);
    refuse_attn(pb, plen, fp, a, CORE_EMISMATCH, want, "other shape", 0);
    core_attn_free(a);
    /* Same DARKFormer settings, another adapter's matrices. */
    a = attn_like(base, CORE_ATTN_DARKFORMER, M_FEAT, 4, SEED, 0, adapter_b);
    refuse_attn(db, dlen, fp, a, CORE_EMISMATCH,
                "blob has other darkformer parameters than this server's adapter", "other Mat", 0);
    core_attn_free(a);
    /* ... and the same adapter accepts it. */
    a = attn_like(base, CORE_ATTN_DARKFORMER, M_FEAT, 4, SEED, 0, adapter_a);
    if (a) {
        core_attn_state_t *s = NULL;
        core_error_t err = {0};
        CHECK_INT_EQ(core_attn_state_new(a, &s, &err), 0);
        CHECK_INT_EQ(core_state_load(db, dlen, fp, s, NULL, NULL, NULL, NULL, NULL, &err), 0);
        CHECK_INT_EQ(core_state_verify(db, dlen, fp, a, &err), 0);
        core_attn_state_free(s);
        core_attn_free(a);
    }
    /* Exact payload: NaN key. */
    unsigned char *b = malloc(elen);
    memcpy(b, eb, elen);
    const float fnan = NAN;
    memcpy(b + CORE_STATE_HEADER_BYTES + 4 * 7, &fnan, 4);
    reseal(b, elen);
    refuse_attn(b, elen, fp, core_model_attn(em), CORE_EFORMAT, "non-finite key in layer 0",
                "NaN key", 1);
    /* ... a finite value past half precision's range (it would overflow
     * the next forward), and the largest one allowed is accepted. */
    memcpy(b, eb, elen);
    const float big = 1e30f, edge = -CORE_ATTN_MAX_KV;
    memcpy(b + CORE_STATE_HEADER_BYTES + 4 * 7, &big, 4);
    reseal(b, elen);
    refuse_attn(b, elen, fp, core_model_attn(em), CORE_EFORMAT,
                "out-of-range key in layer 0, token 0 (keys and values must be finite, "
                "|x| <= 65504)", "huge key", 1);
    memcpy(b, eb, elen);
    memcpy(b + CORE_STATE_HEADER_BYTES + 4 * 7, &edge, 4);
    reseal(b, elen);
    if (em) {
        core_attn_state_t *s = new_state(em);
        core_error_t err = {0};
        CHECK_MSG(core_state_load(b, elen, fp, s, NULL, NULL, NULL, NULL, NULL, &err) == 0, "%s",
                  err.msg);
        core_attn_state_free(s);
    }
    free(b);
    free(pb);
    free(db);
    free(eb);
    core_attn_state_free(ps);
    core_attn_state_free(ds);
    core_attn_state_free(es);
out:
    core_model_free(pm);
    core_model_free(dm);
    core_model_free(em);
}

/* ---- sections ---- */

TEST(sampler_pending_owner_round_trip)
{
    core_model_t *m = load_kind(CORE_ATTN_DARKFORMER_IS, 0);
    if (!m)
        return;
    const core_model_info_t *in = core_model_info(m);
    const int V = in->n_vocab;
    core_attn_state_t *s = new_state(m), *s2 = new_state(m);
    core_sampler_t *sa = new_sampler(42), *sb = new_sampler(7);
    core_sample_params_t p;
    core_sample_params_default(&p);
    p.temperature = 0.9f;
    p.top_k = 50;
    p.repeat_penalty = 1.3f;
    core_sampler_set_params(sa, &p, NULL);
    core_sampler_set_params(sb, &p, NULL);
    core_sample_ws_t *ws = core_sample_ws_new();
    float *logits = malloc((size_t)V * sizeof(float));
    core_rng_t r;
    core_rng_seed(&r, 3);
    for (int i = 0; i < V; i++)
        logits[i] = (float)core_rng_normal(&r);
    core_sample_result_t res;
    for (int i = 0; i < 300; i++) /* more than the history ring holds */
        core_sampler_sample(sa, ws, logits, V, &res, NULL);

    /* Sections at their limits and empty. */
    size_t np = 1000;
    int32_t *pend = malloc(np * sizeof *pend);
    rand_tokens(4, pend, (int64_t)np, V);
    char *owner = malloc(CORE_STATE_MAX_OWNER + 1);
    for (size_t i = 0; i < CORE_STATE_MAX_OWNER; i++)
        owner[i] = (char)('a' + i % 26);
    owner[CORE_STATE_MAX_OWNER] = 0;
    size_t len = 0;
    unsigned char *blob = save(m, s, sa, pend, np, owner, &len);
    core_state_info_t info;
    CHECK_INT_EQ(core_state_peek(blob, CORE_STATE_HEADER_BYTES, &info, NULL), 0);
    CHECK_INT_EQ(info.total, len);
    CHECK_INT_EQ(info.n_pending, np);
    CHECK_INT_EQ(info.owner_len, CORE_STATE_MAX_OWNER);
    CHECK_INT_EQ(info.has_sampler, 1);
    CHECK_INT_EQ(info.pos, 0);
    CHECK_INT_EQ(info.cfg.kind, CORE_ATTN_DARKFORMER_IS);
    CHECK_INT_EQ(info.cfg.n_features, M_FEAT);
    CHECK_STR_EQ(info.fingerprint, in->fingerprint);

    int32_t *gp = NULL;
    size_t gn = 0, ol = 0;
    const void *own = NULL;
    core_error_t err = {0};
    CHECK_INT_EQ(core_state_load(blob, len, in->fingerprint, s2, sb, &gp, &gn, &own, &ol, &err), 0);
    CHECK_INT_EQ(gn, np);
    CHECK(gp && memcmp(gp, pend, np * sizeof *pend) == 0);
    CHECK_INT_EQ(ol, CORE_STATE_MAX_OWNER);
    CHECK(own == blob + CORE_STATE_HEADER_BYTES && memcmp(own, owner, ol) == 0);
    int same = 1;
    for (int i = 0; i < 50; i++) {
        core_sample_result_t ra, rb;
        core_sampler_sample(sa, ws, logits, V, &ra, NULL);
        core_sampler_sample(sb, ws, logits, V, &rb, NULL);
        same &= ra.token == rb.token;
    }
    CHECK_MSG(same, "sampler continuation differs");
    free(gp);

    /* Over the limits. */
    core_state_desc_t d = {.fingerprint = in->fingerprint, .state = s, .owner = owner,
                           .owner_len = CORE_STATE_MAX_OWNER + 1};
    size_t wl = 0;
    CHECK_INT_EQ(core_state_size(s, NULL, 0, CORE_STATE_MAX_OWNER + 1), 0);
    CHECK_INT_EQ(core_state_save(&d, blob, len, &wl, &err), CORE_EINVAL);
    CHECK(strstr(err.msg, "owner section") != NULL);
    d.owner_len = 0;
    d.fingerprint = "0123456789abcdef0123456789abcdef"; /* 32 chars */
    CHECK_INT_EQ(core_state_save(&d, blob, len, &wl, &err), CORE_EINVAL);
    d.fingerprint = in->fingerprint;
    const int32_t bad[1] = {-3};
    d.pending = bad;
    d.n_pending = 1;
    CHECK_INT_EQ(core_state_save(&d, blob, len, &wl, &err), CORE_EINVAL);
    d.n_pending = 0;
    CHECK_INT_EQ(core_state_save(&d, blob, 10, &wl, &err), CORE_ERANGE);

    /* No sections: loading leaves the sampler alone and reports none. */
    free(blob);
    blob = save(m, s, NULL, NULL, 0, NULL, &len);
    unsigned char *before = sampler_bytes(sb);
    gp = (int32_t *)(uintptr_t)1;
    own = (const void *)(uintptr_t)1;
    CHECK_INT_EQ(core_state_load(blob, len, in->fingerprint, s2, sb, &gp, &gn, &own, &ol, &err), 0);
    CHECK(gp == NULL && gn == 0 && own == NULL && ol == 0);
    unsigned char *after = sampler_bytes(sb);
    CHECK(memcmp(before, after, core_sampler_state_size()) == 0);
    CHECK_INT_EQ(core_state_load(blob, len, in->fingerprint, s2, NULL, &gp, NULL, NULL, NULL, &err),
                 CORE_EINVAL);

    free(before);
    free(after);
    free(blob);
    free(owner);
    free(pend);
    free(logits);
    core_sample_ws_free(ws);
    core_sampler_free(sa);
    core_sampler_free(sb);
    core_attn_state_free(s);
    core_attn_state_free(s2);
    core_model_free(m);
}

/* ---- checkpoints (version 2) ---- */

/* Saves s with parts[n] as its checkpoints. */
static unsigned char *save_ckpt(core_model_t *m, const core_attn_state_t *s, const char *owner,
                                const core_state_part_t *parts, size_t n, size_t *len)
{
    core_state_desc_t d = {.fingerprint = core_model_info(m)->fingerprint, .state = s,
                           .owner = owner, .owner_len = owner ? strlen(owner) : 0,
                           .checkpoints = parts, .n_checkpoints = n};
    size_t cap = core_state_desc_size(&d);
    unsigned char *buf = malloc(cap ? cap : 1);
    core_error_t err = {0};
    *len = 0;
    int rc = core_state_save(&d, buf, cap, len, &err);
    CHECK_MSG(rc == 0, "save with checkpoints: %s", err.msg);
    CHECK_INT_EQ(*len, cap);
    return buf;
}

/* A version 2 blob built by hand from a version 1 blob and raw entries
 * (what core_state_save would refuse to write), resealed. */
static unsigned char *raw_v2(const unsigned char *v1, size_t v1_len, const core_state_part_t *p,
                             size_t n, size_t *len)
{
    size_t total = v1_len;
    for (size_t i = 0; i < n; i++)
        total += 8 + p[i].len;
    unsigned char *b = malloc(total);
    memcpy(b, v1, v1_len - 4);
    size_t off = v1_len - 4;
    for (size_t i = 0; i < n; i++) {
        put_le32(b + off, (uint32_t)p[i].len);
        put_le32(b + off + 4, 0);
        memcpy(b + off + 8, p[i].blob, p[i].len);
        off += 8 + p[i].len;
    }
    put_le32(b + 4, 2);
    put_le32(b + 8, (uint32_t)total);
    put_le32(b + 132, (uint32_t)n);
    reseal(b, total);
    *len = total;
    return b;
}

TEST(checkpoints_round_trip_and_refusals)
{
    core_model_t *m = load_kind(CORE_ATTN_PERFORMER, 4);
    if (!m)
        return;
    const core_model_info_t *in = core_model_info(m);
    core_attn_state_t *s = new_state(m);
    int32_t t[40];
    rand_tokens(21, t, 40, in->n_vocab);
    size_t l1 = 0, l2 = 0, len = 0;
    feed(m, s, t, 10, NULL);
    unsigned char *c1 = save(m, s, NULL, NULL, 0, "turn 1", &l1);
    feed(m, s, t + 10, 10, NULL);
    unsigned char *c2 = save(m, s, NULL, NULL, 0, "turn 2", &l2);
    feed(m, s, t + 20, 20, NULL);
    core_state_part_t parts[2] = {{c1, l1}, {c2, l2}};
    unsigned char *blob = save_ckpt(m, s, "now", parts, 2, &len);
    CHECK_INT_EQ(c1[4], 1); /* no checkpoints: version 1, as before */
    CHECK_INT_EQ(blob[4], 2);

    core_state_info_t info;
    CHECK_INT_EQ(core_state_peek(blob, len, &info, NULL), 0);
    CHECK_INT_EQ(info.version, 2);
    CHECK_INT_EQ(info.n_checkpoints, 2);
    CHECK_INT_EQ(info.checkpoints_bytes, 16 + l1 + l2);
    CHECK_INT_EQ(info.checkpoints_off + info.checkpoints_bytes + 4, len);
    core_error_t err = {0};
    victim_t v;
    victim_init(&v, m);
    const void *own = NULL;
    size_t ol = 0;
    CHECK_INT_EQ(core_state_load(blob, len, in->fingerprint, v.s, NULL, NULL, NULL, &own, &ol,
                                 &err), 0);
    CHECK_INT_EQ(core_attn_state_pos(v.s), 40);
    CHECK(ol == 3 && memcmp(own, "now", 3) == 0);
    CHECK_INT_EQ(core_state_verify(blob, len, in->fingerprint, core_model_attn(m), &err), 0);
    for (size_t i = 0; i < 2; i++) {
        const void *pp = NULL;
        size_t pl = 0;
        CHECK_INT_EQ(core_state_checkpoint(blob, len, i, &pp, &pl, &err), 0);
        CHECK(pl == parts[i].len && memcmp(pp, parts[i].blob, pl) == 0);
        core_attn_state_t *cs = new_state(m);
        CHECK_INT_EQ(core_state_load(pp, pl, in->fingerprint, cs, NULL, NULL, NULL, &own, &ol,
                                     &err), 0);
        CHECK_INT_EQ(core_attn_state_pos(cs), 10 * (int64_t)(i + 1));
        CHECK(ol == 6 && memcmp(own, i ? "turn 2" : "turn 1", 6) == 0);
        core_attn_state_free(cs);
    }
    const void *pp = NULL;
    size_t pl = 0;
    CHECK_INT_EQ(core_state_checkpoint(blob, len, 2, &pp, &pl, &err), CORE_ERANGE);
    CHECK_INT_EQ(core_state_checkpoint(c1, l1, 0, &pp, &pl, &err), CORE_ERANGE);
    CHECK_INT_EQ(core_state_checkpoint(blob, len - 1, 0, &pp, &pl, &err), CORE_EFORMAT);
    victim_free(&v);
    victim_init(&v, m);

    /* What save refuses: a part that is not a blob, one with checkpoints
     * of its own, too many parts. */
    core_state_desc_t d = {.fingerprint = in->fingerprint, .state = s};
    size_t wl = 0;
    unsigned char *out = malloc(len * 2);
    core_state_part_t bad[1] = {{"DSSTxxxx", 8}};
    d.checkpoints = bad;
    d.n_checkpoints = 1;
    CHECK_INT_EQ(core_state_save(&d, out, len * 2, &wl, &err), CORE_EINVAL);
    CHECK(strstr(err.msg, "checkpoint 0 is not a state blob") != NULL);
    core_state_part_t nested[1] = {{blob, len}};
    d.checkpoints = nested;
    CHECK_INT_EQ(core_state_save(&d, out, len * 2, &wl, &err), CORE_EINVAL);
    CHECK(strstr(err.msg, "checkpoint 0 is not a state blob without checkpoints") != NULL);
    d.n_checkpoints = CORE_STATE_MAX_CHECKPOINTS + 1;
    CHECK_INT_EQ(core_state_desc_size(&d), 0);
    CHECK_INT_EQ(core_state_save(&d, out, len * 2, &wl, &err), CORE_EINVAL);
    free(out);

    /* What load refuses, resealed (the checksum is no authentication). */
    char want[160], ctx[64];
    unsigned char *b = malloc(len);
    memcpy(b, blob, len);
    put_le32(b + 132, 3); /* one more than the section holds */
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "checkpoint 2: truncated length field", "count + 1");
    memcpy(b, blob, len);
    put_le32(b + 132, 1); /* one fewer */
    reseal(b, len);
    snprintf(want, sizeof want, "checkpoint section: %zu bytes after the last checkpoint",
             8 + l2);
    refuse(&v, b, len, NULL, CORE_EFORMAT, want, "count - 1");
    memcpy(b, blob, len);
    put_le32(b + 132, 0);
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "do not add up", "no count, a section");
    memcpy(b, blob, len);
    put_le32(b + 132, CORE_STATE_MAX_CHECKPOINTS + 1);
    reseal(b, len);
    snprintf(want, sizeof want, "%d checkpoints (limit %d)", CORE_STATE_MAX_CHECKPOINTS + 1,
             CORE_STATE_MAX_CHECKPOINTS);
    refuse(&v, b, len, NULL, CORE_EFORMAT, want, "count over the limit");
    memcpy(b, blob, len);
    put_le32(b + 132, 1000); /* entries that cannot fit the section */
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "checkpoints (limit", "count huge");
    memcpy(b, blob, len);
    put_le32(b + 4, 1); /* version 1 with the count set */
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "reserved field is not 0", "version 1 with a count");
    size_t off0 = info.checkpoints_off;
    memcpy(b, blob, len);
    put_le32(b + off0 + 4, 1); /* entry 0's length past 2^32 */
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "checkpoint 0: length", "length huge");
    memcpy(b, blob, len);
    put_le32(b + off0, (uint32_t)(l1 - 1)); /* one byte short: its frame says otherwise */
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "checkpoint 0: truncated", "length short");
    memcpy(b, blob, len);
    put_le32(b + off0, (uint32_t)(l1 + 1)); /* one byte long */
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "checkpoint 0: trailing bytes", "length long");
    memcpy(b, blob, len);
    put_le32(b + off0, 10);
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "checkpoint 0: truncated", "length tiny");
    memcpy(b, blob, len);
    b[off0 + 8 + 8 + l2 + 200] ^= 1; /* inside checkpoint 1; the blob resealed */
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_ECHECKSUM, "checkpoint 1: checksum mismatch", "flip in 1");
    memcpy(b, blob, len);
    b[off0 + 8] = 'X';
    reseal(b, len);
    refuse(&v, b, len, NULL, CORE_EFORMAT, "checkpoint 0: not a darkserve state blob", "magic");
    /* Truncations through the section: each a frame error, never a read
     * past the end. */
    for (size_t n = off0; n < len; n += 37) {
        snprintf(ctx, sizeof ctx, "truncated to %zu", n);
        refuse(&v, blob, n, NULL, CORE_EFORMAT, "truncated", ctx);
    }
    free(b);

    /* Hand-built: a nested checkpoint, one for another model, one of
     * another attention. */
    size_t vl = 0, nl = 0;
    unsigned char *v1 = save(m, s, NULL, NULL, 0, NULL, &vl);
    core_state_part_t np1[1] = {{blob, len}};
    unsigned char *nb = raw_v2(v1, vl, np1, 1, &nl);
    refuse(&v, nb, nl, NULL, CORE_EFORMAT, "checkpoint 0: has checkpoints of its own", "nested");
    free(nb);
    unsigned char *other = malloc(l1);
    memcpy(other, c1, l1);
    memcpy(other + 16, "0123456789abcdef", 17);
    reseal(other, l1);
    core_state_part_t op[1] = {{other, l1}};
    nb = raw_v2(v1, vl, op, 1, &nl);
    snprintf(want, sizeof want, "checkpoint 0: blob is for model 0123456789abcdef, this server "
             "runs %s", in->fingerprint);
    refuse(&v, nb, nl, NULL, CORE_EMISMATCH, want, "other model");
    free(nb);
    core_model_t *em = load(CORE_ATTN_EXACT, 0, NULL, 0);
    if (em) {
        core_attn_state_t *es = new_state(em);
        size_t el = 0;
        unsigned char *eb = save(em, es, NULL, NULL, 0, NULL, &el);
        core_state_part_t ep[1] = {{eb, el}};
        nb = raw_v2(v1, vl, ep, 1, &nl);
        refuse(&v, nb, nl, NULL, CORE_EMISMATCH, "checkpoint 0: blob has attention exact", "exact");
        free(nb);
        free(eb);
        core_attn_state_free(es);
        core_model_free(em);
    }
    /* Zero checkpoints in a version 2 blob: read as it says. */
    nb = raw_v2(v1, vl, NULL, 0, &nl);
    CHECK_INT_EQ(core_state_load(nb, nl, in->fingerprint, v.s, NULL, NULL, NULL, NULL, NULL, &err),
                 0);
    free(nb);
    free(other);
    free(v1);
    victim_free(&v);
    free(blob);
    free(c1);
    free(c2);
    core_attn_state_free(s);
    core_model_free(m);
}

/* ---- checksum ---- */

static uint32_t crc_bitwise(const unsigned char *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int b = 0; b < 8; b++)
            c = c & 1u ? (c >> 1) ^ 0xedb88320u : c >> 1;
    }
    return ~c;
}

TEST(crc32)
{
    /* The standard check value of CRC-32/ISO-HDLC. */
    CHECK_INT_EQ(core_crc32(0, "123456789", 9), 0xcbf43926u);
    CHECK_INT_EQ(core_crc32(0, "", 0), 0);
    unsigned char buf[1000];
    core_rng_t r;
    core_rng_seed(&r, 1);
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)core_rng_u64(&r);
    for (size_t n = 0; n <= 40; n++) {
        CHECK_INT_EQ(core_crc32(0, buf + 3, n), crc_bitwise(buf + 3, n));
        CHECK_INT_EQ(core_crc32(core_crc32(0, buf, n), buf + n, 1000 - n),
                     crc_bitwise(buf, 1000));
    }
}

int main(void)
{
    tiny_path = getenv("DARKSERVE_TINY_MODEL");
    if (!tiny_path) {
        printf("DARKSERVE_TINY_MODEL is not set\n");
        return 1;
    }
    core_model_t *m = load(CORE_ATTN_EXACT, 0, NULL, 0);
    if (!m)
        return 1;
    snprintf(adapter_a, sizeof adapter_a, "/tmp/darkserve_state_a_%d.gguf", (int)getpid());
    snprintf(adapter_b, sizeof adapter_b, "/tmp/darkserve_state_b_%d.gguf", (int)getpid());
    snprintf(adapter_is, sizeof adapter_is, "/tmp/darkserve_state_is_%d.gguf", (int)getpid());
    int rc = write_adapter(adapter_a, CORE_ATTN_DARKFORMER, core_model_info(m), 4, 1);
    rc |= write_adapter(adapter_b, CORE_ATTN_DARKFORMER, core_model_info(m), 4, 2);
    rc |= write_adapter(adapter_is, CORE_ATTN_DARKFORMER_IS, core_model_info(m), 0, 3);
    core_model_free(m);
    if (rc == 0) {
        RUN(crc32);
        RUN(continuation_exact);
        RUN(continuation_performer);
        RUN(continuation_darkformer);
        RUN(continuation_darkformer_is);
        RUN(linear_size_independent_of_tokens);
        RUN(refusals_framing);
        RUN(refusals_attention_config);
        RUN(sampler_pending_owner_round_trip);
        RUN(checkpoints_round_trip_and_refusals);
    }
    unlink(adapter_a);
    unlink(adapter_b);
    unlink(adapter_is);
    return CHECK_DONE();
}
