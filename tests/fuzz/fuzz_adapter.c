/* tests/fuzz/fuzz_adapter.c — libFuzzer target for the DARKFormer adapter
 * loader: the input is opened as a GGUF (from memory), its darkformer.*
 * settings read (core_features_adapter_info) and, when they are sane, given
 * to core_attn_new for the tiny model's shape, which reads and validates
 * every per-layer tensor (M, lambda, decay, mix) as a model load does. An
 * adapter that is accepted must give a usable state.
 *
 * Build and run: make fuzz FUZZ_TARGETS=adapter (tests/fuzz/README.md).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn/attn.h"
#include "core/attn/features.h"
#include "core/gguf.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static core_attn_cfg_t base; /* the tiny model's shape */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    core_model_t *m = fuzz_load_tiny(CORE_ATTN_PERFORMER, 4, NULL);
    base = *core_attn_config(core_model_attn(m));
    core_model_free(m);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (base.n_layer == 0)
        LLVMFuzzerInitialize(NULL, NULL);
    core_gguf_t *g = NULL;
    core_error_t err = {0};
    if (core_gguf_open_memory(data, size, &g, &err) < 0) {
        FUZZ_REQUIRE(err.msg[0] != '\0');
        return 0;
    }
    core_features_adapter_info_t ai = {.kind = CORE_ATTN_DARKFORMER, .n_features = 16,
                                       .window = 4};
    if (core_features_adapter_info(g, &ai, &err) == 0) {
        core_attn_cfg_t c = base;
        c.kind = ai.kind == CORE_ATTN_DARKFORMER_IS ? CORE_ATTN_DARKFORMER_IS
                                                    : CORE_ATTN_DARKFORMER;
        /* the sizes a server would accept from flags, kept small here */
        c.n_features = ai.n_features > 0 && ai.n_features <= 64 ? ai.n_features : 16;
        c.window = ai.window >= 0 && ai.window <= 16 ? ai.window : 4;
        c.sinks = ai.sinks >= 0 && ai.sinks <= 8 ? ai.sinks : 0;
        c.prerope = ai.prerope ? 1 : 0;
        c.seed = ai.seed;
        core_attn_t *a = NULL;
        if (core_attn_new(&c, g, &a, &err) == 0) {
            core_attn_state_t *s = NULL;
            FUZZ_REQUIRE(core_attn_state_new(a, &s, &err) == 0);
            FUZZ_REQUIRE(core_attn_state_bytes(s) > 0);
            core_attn_state_free(s);
            core_attn_free(a);
        } else {
            FUZZ_REQUIRE(err.msg[0] != '\0');
        }
    } else {
        FUZZ_REQUIRE(err.msg[0] != '\0');
    }
    core_gguf_close(g);
    return 0;
}
