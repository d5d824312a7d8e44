/* server/attn_select.h — which attention a model is loaded with: the one rule
 * shared by `darkserve serve` and the CLI commands that load a model.
 *
 * --attn auto (the default) means DARKFormer with the adapter that belongs to
 * the model: the --adapter given, else the one core_model_adapter_find()
 * finds beside the model; with neither, the best training-free configuration
 * (performer kind with the linear branch off: exact attention to the sinks
 * and a window of SRV_ATTN_FALLBACK_WINDOW tokens), and a note saying so;
 * a model with sliding-window layers (core_model_file_local_layers:
 * gemma3) gets exact attention instead, with a note (a linear kind would
 * apply to its global layers only, and needs their adapter).
 * An explicit kind is taken as given (no discovery). Numbers come from
 * core_features_resolve(): flags win, then the adapter, then the defaults.
 *
 * Knows nothing of logging or of how the caller reports: it returns the
 * choice and the sentences to print.
 */
#ifndef DARKSERVE_SERVER_ATTN_SELECT_H
#define DARKSERVE_SERVER_ATTN_SELECT_H

#include <stddef.h>
#include <stdint.h>

#include "core/attn/attn.h"
#include "core/err.h"
#include "core/attn/features.h"
#include "core/model.h"

/* Value of srv_attn_request_t.kind for "auto" (== SRV_CFG_ATTN_AUTO). */
#define SRV_ATTN_AUTO 6
/* Window of the training-free fallback when --window is not given: the best
 * measured sinks + window configuration without an adapter (docs/QUALITY.md). */
#define SRV_ATTN_FALLBACK_WINDOW 256

typedef struct srv_attn_request {
    int kind;            /* core_attn_kind_t, or SRV_ATTN_AUTO */
    const char *adapter; /* --adapter; NULL or "" = none (borrowed) */
    int n_features;      /* 0 = the adapter's, else the default */
    int window;          /* -1 = the adapter's, else the default */
    int sinks;           /* -1 = the adapter's, else the default */
    int memory;          /* λ exact memory rows; -1 = the adapter's, else the default */
    int kv_bits;         /* exact rows' bits (8, 16); -1 or 0 = the adapter's, else the default */
    const char *memory_keep;  /* "recall" | "recent"; NULL or "" = the adapter's, else recall */
    const char *memory_heads; /* "all" or layer.head pairs; NULL or "" = the adapter's, else all */
    int prerope;         /* -1 = the adapter's, else 0 */
    int decay_off;       /* 1: no learned decay */
    int linear;          /* -1 = unset (on, off for the fallback), 0 off, 1 on */
    int64_t max_ctx;     /* exact KV capacity; 0 = the model's */
} srv_attn_request_t;

/* Filled by srv_attn_select. Not to be copied: mo.adapter_path points into
 * adapter. */
typedef struct srv_attn_choice {
    core_model_opts_t mo;                /* ready for core_model_load */
    char adapter[CORE_MODEL_PATH_MAX];   /* adapter in use, "" = none */
    char memory_heads[CORE_ATTN_HEADS_SPEC_MAX]; /* mo.memory_heads points here */
    int discovered;                      /* 1: auto found the adapter beside the model */
    int fallback;                        /* 1: auto found none: training-free fallback */
    char note[CORE_ERROR_MSG_MAX + 160]; /* fallback: why and what to do, one sentence */
} srv_attn_choice_t;

/* "exact", "performer", "darkformer", "darkformer-is", "flexformer-s",
 * "flexformer-n" or "auto" -> *kind;
 * CORE_EINVAL otherwise. */
int srv_attn_parse(const char *name, int *kind);

/* Chooses the attention for model_path (borrowed) from rq (borrowed) into
 * *out (caller-owned). Returns 0, or a negative core code with a message
 * naming the adapter (unreadable, bad keys) or the model path (too long to
 * look beside). */
int srv_attn_select(const char *model_path, const srv_attn_request_t *rq, srv_attn_choice_t *out,
                    core_error_t *err);

/* "darkformer (features 128, window 256, sinks 4, exact context 8192,
 * adapter PATH)" for a loaded attention (ac borrowed; adapter may be NULL or
 * "" = none) into buf[cap]. */
void srv_attn_describe(const core_attn_cfg_t *ac, const char *adapter, char *buf, size_t cap);

/* What the prompt rows of m multiply in, for the startup line of `serve`
 * and the CLI commands (asked_int8: --prompt-precision int8 was given):
 * a static string, or NULL when they run as always (f32, no tiles).
 * *warn is set when int8 was asked for and cannot run here. */
const char *srv_prompt_rows_note(const core_model_t *m, int asked_int8, int *warn);

#endif
