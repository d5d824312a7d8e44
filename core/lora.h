/* core/lora.h — low-rank updates of the attention projections that a
 * DARKFormer adapter may carry (stage 2 of its training, tools/distill.py,
 * docs/ADAPTER.md): for q, k, v and o of every layer, y += B·(A·x), the
 * same as multiplying by W + B·A without touching the quantized W.
 *
 * Tensors (all F32, every layer or none):
 *   darkformer.blk.N.lora_q_a  [in][r]   (GGUF ne order: in, r; rows of A)
 *   darkformer.blk.N.lora_q_b  [r][out]  (ne: r, out; rows of B)
 * and likewise lora_k_*, lora_v_*, lora_o_*; in/out are D → H·Hd for q,
 * D → Hkv·Hd for k and v, H·Hd → D for o. One rank r for all, at most
 * CORE_LORA_MAX_RANK. The model owns the loaded copy (core_model_load).
 */
#ifndef DARKSERVE_CORE_LORA_H
#define DARKSERVE_CORE_LORA_H

#include <stdint.h>

#include "core/err.h"
#include "core/gguf.h"

#define CORE_LORA_MAX_RANK 256

enum { CORE_LORA_Q, CORE_LORA_K, CORE_LORA_V, CORE_LORA_O, CORE_LORA_N };

typedef struct core_lora core_lora_t;

/* Reads the LoRA tensors of adapter g for a network of n_layer layers,
 * model width d, query width qd (H·Hd) and key/value width kvd. *out is
 * NULL (and 0 returned) when g has none. Errors name the tensor: missing
 * for some layers or projections (CORE_ENOTFOUND), wrong type or shape, a
 * rank that differs, a non-finite element (CORE_EFORMAT). */
int core_lora_load(const core_gguf_t *g, int n_layer, int64_t d, int64_t qd, int64_t kvd,
                   core_lora_t **out, core_error_t *err);
void core_lora_free(core_lora_t *lo); /* NULL is a no-op */
int core_lora_rank(const core_lora_t *lo);
/* A 64-bit hash of the rank and every element (their bit patterns), never 0
 * for a loaded LoRA; 0 for NULL. The model salts its attention's parameter
 * digest with it (core_attn_set_params_salt). */
uint64_t core_lora_digest(const core_lora_t *lo);

/* y[t] += B·(A·x[t]) for rows t < n of projection which (CORE_LORA_*) of
 * layer. scratch holds n × rank floats. */
void core_lora_add(const core_lora_t *lo, int layer, int which, int64_t n, const float *x,
                   int64_t ldx, float *y, int64_t ldy, float *scratch);

#endif
