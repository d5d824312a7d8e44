/* tests/fuzz/fuzz_common.h — shared by the core fuzz targets: the fixture
 * model they run on and the invariant macro. A target aborts on a broken
 * invariant, which libFuzzer and the corpus replay (tests/fuzz/replay.h,
 * `make unit`) both report. The model is $DARKSERVE_TINY_MODEL, or
 * build/fixtures/tiny.gguf from the repository root. */
#ifndef DARKSERVE_TESTS_FUZZ_COMMON_H
#define DARKSERVE_TESTS_FUZZ_COMMON_H

#include <stdio.h>
#include <stdlib.h>

#include "core/model.h"

#define FUZZ_REQUIRE(cond)                                                                      \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);  \
            abort();                                                                            \
        }                                                                                       \
    } while (0)

static inline const char *fuzz_tiny_path(void)
{
    const char *p = getenv("DARKSERVE_TINY_MODEL");
    return p && *p ? p : "build/fixtures/tiny.gguf";
}

/* The tiny model with this attention (aborts when it cannot load: a setup
 * error, not a finding). */
static inline core_model_t *fuzz_load_tiny(core_attn_kind_t kind, int window, const char *adapter)
{
    core_model_opts_t o = {.attn_kind = kind, .n_features = 16, .window = window,
                           .max_ctx = 256, .seed = 7, .adapter_path = adapter};
    core_model_t *m = NULL;
    core_error_t err = {0};
    if (core_model_load(fuzz_tiny_path(), &o, &m, &err) < 0) {
        fprintf(stderr, "fuzz setup: cannot load %s: %s\n", fuzz_tiny_path(), err.msg);
        abort();
    }
    return m;
}

#endif
