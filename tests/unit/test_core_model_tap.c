/* core_model_set_tap on the tiny fixture model (env DARKSERVE_TINY_MODEL):
 * the hook sees every layer of every sequence of a batch with the right
 * positions, what it sees is what attention sees (q and k rotated by RoPE of
 * their own positions, checked against the rotation computed here from the
 * layer-0 vectors at position 0), batching does not change what it sees, it
 * never changes the logits, and removing it stops the calls. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/model.h"

static core_model_t *tiny;
static int L, H, HKV, HD, V;

#define MAX_CALLS 64
#define MAX_ROWS 8

typedef struct call {
    int layer, seq;
    int64_t pos0, n;
    float q[MAX_ROWS * 64], k[MAX_ROWS * 32], v[MAX_ROWS * 32]; /* [n][H*Hd], [n][Hkv*Hd] */
} call_t;

typedef struct rec {
    int n_calls;
    call_t calls[MAX_CALLS];
} rec_t;

static void record(void *ud, int layer, int seq, int64_t pos0, int64_t n, const float *q,
                   const float *k, const float *v)
{
    rec_t *r = ud;
    if (r->n_calls >= MAX_CALLS || n > MAX_ROWS) {
        r->n_calls = MAX_CALLS + 1; /* overflow: the checks below fail */
        return;
    }
    call_t *c = &r->calls[r->n_calls++];
    c->layer = layer;
    c->seq = seq;
    c->pos0 = pos0;
    c->n = n;
    memcpy(c->q, q, (size_t)(n * H * HD) * sizeof(float));
    memcpy(c->k, k, (size_t)(n * HKV * HD) * sizeof(float));
    memcpy(c->v, v, (size_t)(n * HKV * HD) * sizeof(float));
}

static core_attn_state_t *new_state(void)
{
    core_attn_state_t *s = NULL;
    core_error_t err = {0};
    if (core_attn_state_new(core_model_attn(tiny), &s, &err) < 0)
        printf("  state: %s\n", err.msg);
    return s;
}

static int run1(core_attn_state_t *s, const int32_t *tok, int64_t n, float *logits)
{
    core_batch_seq_t sq = {.state = s, .tokens = tok, .n_tokens = n,
                           .logits_mode = logits ? CORE_LOGITS_ALL : CORE_LOGITS_NONE,
                           .logits = logits};
    core_error_t err = {0};
    int rc = core_model_forward(tiny, &sq, 1, &err);
    if (rc < 0)
        printf("  forward: %s\n", err.msg);
    return rc;
}

TEST(sees_every_layer_of_every_sequence)
{
    static rec_t r, alone;
    const int32_t a[5] = {11, 22, 33, 44, 55}, pre[3] = {7, 8, 9}, b[2] = {101, 102};
    core_attn_state_t *sa = new_state(), *sb = new_state(), *sc = new_state();
    CHECK(sa && sb && sc);
    if (!sa || !sb || !sc)
        goto done;
    CHECK(run1(sb, pre, 3, NULL) == 0);
    CHECK(run1(sc, pre, 3, NULL) == 0);
    memset(&r, 0, sizeof r);
    core_model_set_tap(tiny, record, &r);
    core_batch_seq_t seqs[2] = {
        {.state = sa, .tokens = a, .n_tokens = 5, .logits_mode = CORE_LOGITS_NONE},
        {.state = sb, .tokens = b, .n_tokens = 2, .logits_mode = CORE_LOGITS_NONE},
    };
    core_error_t err = {0};
    CHECK(core_model_forward(tiny, seqs, 2, &err) == 0);
    CHECK_INT_EQ(r.n_calls, 2 * L);
    for (int i = 0; i < r.n_calls && i < 2 * L; i++) {
        const call_t *c = &r.calls[i];
        CHECK_INT_EQ(c->layer, i / 2);
        CHECK_INT_EQ(c->seq, i % 2);
        CHECK_INT_EQ(c->pos0, i % 2 ? 3 : 0);
        CHECK_INT_EQ(c->n, i % 2 ? 2 : 5);
    }
    /* The same sequence run alone is seen with the same rows. */
    memset(&alone, 0, sizeof alone);
    core_model_set_tap(tiny, record, &alone);
    CHECK(run1(sc, b, 2, NULL) == 0);
    CHECK_INT_EQ(alone.n_calls, L);
    for (int l = 0; l < L && l < alone.n_calls && 2 * l + 1 < r.n_calls; l++) {
        const call_t *x = &alone.calls[l], *y = &r.calls[2 * l + 1];
        CHECK_INT_EQ(x->seq, 0);
        CHECK_INT_EQ(x->pos0, 3);
        double e = 0, s = 0;
        for (int j = 0; j < 2 * H * HD; j++) {
            e = fmax(e, fabs((double)x->q[j] - y->q[j]));
            s = fmax(s, fabs((double)y->q[j]));
        }
        for (int j = 0; j < 2 * HKV * HD; j++) {
            e = fmax(e, fabs((double)x->k[j] - y->k[j]));
            e = fmax(e, fabs((double)x->v[j] - y->v[j]));
        }
        CHECK_MSG(e <= 1e-4 * (s + 1e-30), "layer %d: batched vs alone differ by %g (scale %g)",
                  l, e, s);
    }
done:
    core_model_set_tap(tiny, NULL, NULL);
    core_attn_state_free(sa);
    core_attn_state_free(sb);
    core_attn_state_free(sc);
}

/* Rotates consecutive pairs (the GGUF llama convention) of nh heads by pos. */
static void rope_ref(double *x, const float *src, int nh, int64_t pos, double base)
{
    for (int h = 0; h < nh; h++)
        for (int i = 0; i < HD / 2; i++) {
            double ang = (double)pos * pow(base, -2.0 * i / HD);
            double a = src[h * HD + 2 * i], b = src[h * HD + 2 * i + 1];
            x[h * HD + 2 * i] = a * cos(ang) - b * sin(ang);
            x[h * HD + 2 * i + 1] = a * sin(ang) + b * cos(ang);
        }
}

TEST(q_and_k_are_seen_after_rope)
{
    /* Layer 0's q, k, v depend on the token only; the position enters
     * through RoPE alone, so token X at position p must be R(p)·(X at 0).
     * Both calls bring several tokens: a call of one token is a decode row,
     * whose products take 8-bit activations (core/model.c). */
    static rec_t r0, r1;
    const int32_t x[2] = {42, 7}, yx[4] = {5, 6, 7, 42};
    core_attn_state_t *s0 = new_state(), *s1 = new_state();
    CHECK(s0 && s1);
    if (!s0 || !s1)
        goto done;
    memset(&r0, 0, sizeof r0);
    memset(&r1, 0, sizeof r1);
    core_model_set_tap(tiny, record, &r0);
    CHECK(run1(s0, x, 2, NULL) == 0);
    core_model_set_tap(tiny, record, &r1);
    CHECK(run1(s1, yx, 4, NULL) == 0);
    CHECK(r0.n_calls == L && r1.n_calls == L);
    if (r0.n_calls != L || r1.n_calls != L)
        goto done;
    const call_t *c0 = &r0.calls[0], *c1 = &r1.calls[0];
    double base = core_model_info(tiny)->rope_base;
    double qr[64], kr[32];
    rope_ref(qr, c0->q, H, 3, base);
    rope_ref(kr, c0->k, HKV, 3, base);
    const float *q3 = c1->q + 3 * H * HD, *k3 = c1->k + 3 * HKV * HD, *v3 = c1->v + 3 * HKV * HD;
    double eq = 0, ek = 0, ev = 0, sq = 0, moved = 0;
    for (int j = 0; j < H * HD; j++) {
        eq = fmax(eq, fabs(q3[j] - qr[j]));
        sq = fmax(sq, fabs(qr[j]));
        moved = fmax(moved, fabs(q3[j] - c0->q[j]));
    }
    for (int j = 0; j < HKV * HD; j++) {
        ek = fmax(ek, fabs(k3[j] - kr[j]));
        ev = fmax(ev, fabs(v3[j] - c0->v[j]));
    }
    CHECK_MSG(eq <= 1e-5 * sq && ek <= 1e-5 * sq + 1e-6, "q err %g, k err %g (scale %g)", eq, ek,
              sq);
    CHECK_MSG(ev <= 1e-6 * (sq + 1), "v at position 3 differs from position 0 by %g", ev);
    /* and the rotation is visible at all (position 3 is not position 0) */
    CHECK_MSG(moved > 1e-3 * sq, "q at position 3 equals q at position 0 (%g)", moved);
done:
    core_model_set_tap(tiny, NULL, NULL);
    core_attn_state_free(s0);
    core_attn_state_free(s1);
}

TEST(tap_changes_no_logits_and_can_be_removed)
{
    static rec_t r;
    const int32_t t[6] = {1, 200, 300, 400, 500, 600};
    float *with = malloc((size_t)6 * (size_t)V * sizeof *with);
    float *without = malloc((size_t)6 * (size_t)V * sizeof *without);
    core_attn_state_t *s = new_state();
    CHECK(with && without && s);
    if (!with || !without || !s)
        goto done;
    memset(&r, 0, sizeof r);
    core_model_set_tap(tiny, record, &r);
    CHECK(run1(s, t, 6, with) == 0);
    CHECK_INT_EQ(r.n_calls, L);
    core_model_set_tap(tiny, NULL, &r);
    core_attn_state_reset(s);
    CHECK(run1(s, t, 6, without) == 0);
    CHECK_INT_EQ(r.n_calls, L); /* no call after removal */
    CHECK(memcmp(with, without, (size_t)6 * (size_t)V * sizeof *with) == 0);
done:
    core_model_set_tap(tiny, NULL, NULL);
    core_attn_state_free(s);
    free(with);
    free(without);
}

int main(void)
{
    const char *path = getenv("DARKSERVE_TINY_MODEL");
    core_error_t err = {0};
    if (!path) {
        printf("DARKSERVE_TINY_MODEL is not set (run through make unit)\n");
        return 1;
    }
    if (core_model_load(path, NULL, &tiny, &err) < 0) {
        printf("cannot load %s: %s\n", path, err.msg);
        return 1;
    }
    const core_model_info_t *in = core_model_info(tiny);
    L = in->n_layer;
    H = in->n_head;
    HKV = in->n_head_kv;
    HD = in->head_dim;
    V = in->n_vocab;
    if (L * 2 > MAX_CALLS || H * HD > 64 || HKV * HD > 32) {
        printf("the tiny model is larger than this test's buffers\n");
        return 1;
    }
    RUN(sees_every_layer_of_every_sequence);
    RUN(q_and_k_are_seen_after_rope);
    RUN(tap_changes_no_logits_and_can_be_removed);
    core_model_free(tiny);
    return CHECK_DONE();
}
