/* core/attn_linear.c — linear (random-feature) attention kinds.
 * Placeholder until the DARKFormer kernels land: every linear kind is refused
 * at construction with a clear error. */
#include "core/attn_impl.h"

static int linear_init(core_attn_t *a, const core_gguf_t *adapter, core_error_t *err)
{
    (void)adapter;
    return core_error_set(err, CORE_EUNSUPPORTED, "attention kind '%s' is not implemented yet",
                          core_attn_kind_name(a->cfg.kind));
}

const core_attn_vtbl_t core_attn_linear_vtbl = {.init = linear_init};
