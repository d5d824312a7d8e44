/* ctx_helpers.h — independent copies of a session's context (state,
 * sampler, pending tokens) for the store tests (test_srv_store.c,
 * test_srv_store_remote.c), which compare what the store kept with a copy
 * taken before. Include after check.h, core/model.h, core/state.h and
 * server/engine/engine.h. */
#ifndef DARKSERVE_TESTS_CTX_HELPERS_H
#define DARKSERVE_TESTS_CTX_HELPERS_H

#include <stdlib.h>

/* An independent copy of c, a context of model m's attention. */
static inline srv_seq_ctx_t copy_ctx(core_model_t *m, const srv_seq_ctx_t *c)
{
    srv_seq_ctx_t r = {0};
    core_error_t err = {0};
    CHECK_INT_EQ(core_attn_state_new(core_model_attn(m), &r.state, &err), 0);
    if (core_attn_state_copy(r.state, c->state, &err) == CORE_EMISMATCH) {
        /* Another accumulator precision: copy through a blob. */
        const char *fp = core_model_info(m)->fingerprint;
        size_t n = core_state_size(c->state, NULL, 0, 0), len = 0;
        unsigned char *b = malloc(n);
        core_state_desc_t d = {.fingerprint = fp, .state = c->state};
        CHECK_INT_EQ(core_state_save(&d, b, n, &len, &err), 0);
        CHECK_INT_EQ(core_state_load(b, len, fp, r.state, NULL, NULL, NULL, NULL, NULL, &err), 0);
        free(b);
    }
    CHECK_INT_EQ(core_sampler_clone(c->sampler, &r.sampler, &err), 0);
    CHECK_INT_EQ(srv_seq_ctx_set_pending(&r, c->pending, c->n_pending), 0);
    return r;
}

static inline void free_ctx(srv_seq_ctx_t *c)
{
    core_attn_state_free(c->state);
    core_sampler_free(c->sampler);
    srv_seq_ctx_clear_pending(c);
}

#endif
