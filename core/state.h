/* core/state.h — a session's compute state as a versioned, checksummed blob.
 *
 * What a session needs to continue exactly where it stopped: the attention
 * state (exact: the KV cache rows of the tokens absorbed; linear kinds: S, z,
 * the running log-scales c per layer and KV head and the hybrid window), its
 * position, optionally the sampler's RNG and penalty history
 * (core_sampler_state_save), the pending tokens (absorbed into the history
 * but not yet fed through the model, see server/engine/engine.h) and an opaque owner
 * section (the session store's metadata). Loading a blob into a fresh state
 * and continuing is bit-identical to continuing the state it was saved from.
 *
 * The blob names the model (core_model_info_t.fingerprint) and the attention
 * configuration it was made with; loading it anywhere else is refused with a
 * message that says what differs. Knows nothing of files: callers bring bytes.
 *
 * Layout, little-endian (version 1; version 2 only adds the checkpoint
 * section, see below):
 *   0    "DSST"                 magic
 *   4    u32 version            CORE_STATE_VERSION
 *   8    u64 total              bytes of the whole blob, checksum included
 *   16   char fingerprint[32]   model fingerprint, NUL-padded
 *   48   u32 kind, n_layer, n_head, n_head_kv, head_dim, n_features, window,
 *        u32 sinks              linear kinds' S (0 in blobs from before sinks)
 *   80   u64 seed
 *   88   i64 max_ctx            exact attention capacity when saved (informative)
 *   96   u64 params digest      hash of the learned attention parameters
 *                               (core_state_params_digest); 0 for exact and
 *                               Performer
 *   104  i64 pos                tokens the attention state has absorbed,
 *                               0..CORE_ATTN_MAX_POS
 *   112  u64 attention bytes    A
 *   120  u32 sampler bytes      0 or core_sampler_state_size()
 *   124  u32 n_pending          P
 *   128  u32 owner bytes        O
 *   132  u32 checkpoints        C (version 2; reserved, 0, in version 1)
 *   136  owner[O] | pending i32[P] | sampler | attention payload[A] (attn_impl.h)
 *        | checkpoint section (version 2)
 *   end-4 u32 crc32 (IEEE) of every byte before it
 * The owner section comes first so that a store can read a session's
 * metadata with core_state_peek from the head of a file.
 *
 * Checkpoints (version 2): states the same session held earlier (a store's
 * turn checkpoints), carried so that an exported session keeps them. The
 * section is C entries, oldest first, each a u64 length L and L bytes: a
 * complete blob of its own (version 1, or 2 with no checkpoints: never
 * nested) for the same model and attention, with its own owner section and
 * checksum; the section's size is what the total leaves after the other
 * sections. A blob without checkpoints is written as version 1, byte for
 * byte what servers before version 2 wrote and read; both versions are
 * read.
 */
#ifndef DARKSERVE_CORE_STATE_H
#define DARKSERVE_CORE_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "core/attn/attn.h"
#include "core/err.h"
#include "core/sample.h"

#define CORE_STATE_VERSION 2u                     /* the newest version read and written */
#define CORE_STATE_HEADER_BYTES 136u
#define CORE_STATE_MAX_CHECKPOINTS 64              /* checkpoints in one blob */
#define CORE_STATE_FINGERPRINT_MAX 31              /* chars of a fingerprint */
#define CORE_STATE_MAX_PENDING ((size_t)1 << 24)   /* pending tokens in a blob */
#define CORE_STATE_MAX_OWNER ((size_t)64 << 10)    /* bytes of the owner section */

/* One complete state blob carried inside another (a checkpoint). */
typedef struct core_state_part {
    const void *blob; /* borrowed [len] */
    size_t len;
} core_state_part_t;

typedef struct core_state_desc {
    const char *fingerprint;         /* borrowed: the model's, <= CORE_STATE_FINGERPRINT_MAX chars */
    const core_attn_state_t *state;  /* borrowed */
    const core_sampler_t *sampler;   /* borrowed, NULL: no sampler section */
    const int32_t *pending;          /* borrowed [n_pending] ids >= 0, NULL if n_pending == 0 */
    size_t n_pending;                /* <= CORE_STATE_MAX_PENDING */
    const void *owner;               /* borrowed [owner_len], NULL if owner_len == 0 */
    size_t owner_len;                /* <= CORE_STATE_MAX_OWNER */
    const core_state_part_t *checkpoints; /* borrowed [n_checkpoints], oldest first; NULL if 0.
                                        Each a blob without checkpoints of its own (for
                                        the same model: not re-checked), copied verbatim */
    size_t n_checkpoints;            /* <= CORE_STATE_MAX_CHECKPOINTS; > 0 writes version 2 */
} core_state_desc_t;

/* Bytes core_state_save writes for state s (as it is now), with a sampler
 * section when smp is non-NULL, n_pending tokens and owner_len owner bytes.
 * 0 if n_pending or owner_len is over its limit. */
size_t core_state_size(const core_attn_state_t *s, const core_sampler_t *smp, size_t n_pending,
                       size_t owner_len);

/* Bytes core_state_save writes for d (its checkpoints included); 0 if a
 * count is over its limit or the size overflows. */
size_t core_state_desc_size(const core_state_desc_t *d);

/* Serializes d into buf (caller-owned, cap bytes) and sets *len to the bytes
 * written (= core_state_desc_size). CORE_ERANGE if cap is too small,
 * CORE_EINVAL for a bad descriptor (message names the field; a checkpoint
 * that is not a blob's frame, or has checkpoints of its own). */
int core_state_save(const core_state_desc_t *d, void *buf, size_t cap, size_t *len,
                    core_error_t *err);

/* Restores a blob (buf borrowed, len bytes) into state (and sampler).
 *   fingerprint  the running model's (borrowed); NULL skips that check.
 *   state        required; must belong to the core_attn_t the blob is for.
 *   sampler      NULL: the sampler section is validated only by the checksum
 *                and skipped. Otherwise its RNG and history are replaced when
 *                the blob has a sampler section, left alone when it has none.
 *   pending      NULL, or *pending = new malloc'd copy of the pending tokens
 *                (caller frees; NULL when there are none), *n_pending = count.
 *                pending and n_pending are both NULL or both non-NULL.
 *   owner        NULL, or *owner = the owner bytes, BORROWED from buf (NULL
 *                when absent), *owner_len = their count. Same pairing rule.
 * The checkpoints of a version 2 blob are checked like the blob itself
 * (frame, checksum, header, model and attention) but not loaded, and their
 * payloads' values are not checked: core_state_checkpoint gives each one to
 * load with this function.
 * On any error nothing is changed (not state, sampler, nor the outputs):
 *   CORE_EFORMAT       "truncated: N bytes, need M", "not a darkserve state
 *                      blob" (bad magic), trailing bytes, inconsistent sizes,
 *                      malformed payload, a malformed checkpoint section
 *                      ("checkpoint 2: ...")
 *   CORE_EUNSUPPORTED  a version other than 1 and 2
 *   CORE_ECHECKSUM     "checksum mismatch"
 *   CORE_EMISMATCH     "blob is for model <fp>, this server runs <fp>";
 *                      "blob has attention <kind m=.. W=.. seed=..>, this
 *                      server runs <...>"; another shape, other learned
 *                      parameters; an exact state longer than the context
 *   CORE_ENOMEM */
int core_state_load(const void *buf, size_t len, const char *fingerprint, core_attn_state_t *state,
                    core_sampler_t *sampler, int32_t **pending, size_t *n_pending,
                    const void **owner, size_t *owner_len, core_error_t *err);

/* What a blob's header says (core_state_peek). */
typedef struct core_state_info {
    uint32_t version;
    char fingerprint[CORE_STATE_FINGERPRINT_MAX + 1];
    core_attn_cfg_t cfg;     /* kind, shape, n_features, window, seed, max_ctx as saved */
    uint64_t params_digest;
    int64_t pos;             /* tokens absorbed by the attention state */
    size_t total;            /* bytes of the whole blob */
    size_t attn_bytes;
    int has_sampler;
    size_t n_pending;
    size_t owner_off;        /* = CORE_STATE_HEADER_BYTES */
    size_t owner_len;
    size_t n_checkpoints;    /* version 2: entries of the checkpoint section; else 0 */
    size_t checkpoints_off;  /* offset of that section */
    size_t checkpoints_bytes;
} core_state_info_t;

/* Reads the header of a blob whose first len bytes are in buf (borrowed; len
 * may be less than the blob, at least CORE_STATE_HEADER_BYTES): magic,
 * version and the consistency of the section sizes. The checksum and the
 * payload are NOT checked (for listing stored sessions cheaply). */
int core_state_peek(const void *buf, size_t len, core_state_info_t *out, core_error_t *err);

/* Everything core_state_load checks about the framing and compatibility
 * (size, magic, version, checksum, fingerprint unless NULL, attention config
 * of a, borrowed), without building a state; the payload's values are not
 * checked. For exporting a stored blob without loading it. */
int core_state_verify(const void *buf, size_t len, const char *fingerprint, const core_attn_t *a,
                      core_error_t *err);

/* Checkpoint i (0 = the oldest) of blob buf[len] (borrowed): *part points
 * into buf, *part_len its bytes. Walks the section's lengths within the
 * blob's bounds but checks no checksum: call it on a blob core_state_load
 * or core_state_verify accepted, then load the part with core_state_load.
 * CORE_ERANGE when the blob has no checkpoint i; CORE_EFORMAT for a
 * malformed blob. */
int core_state_checkpoint(const void *buf, size_t len, size_t i, const void **part,
                          size_t *part_len, core_error_t *err);

/* The hash of a's learned parameters that blobs carry at offset 96 and that
 * loading compares: DARKFormer's Mat, DARKFormer-IS's feature weights, v2
 * decays and mixing weights (when they differ from v1 behaviour) and a's
 * params salt (core_attn_set_params_salt: the model's LoRA). 0 for exact
 * attention and a plain Performer. */
uint64_t core_state_params_digest(const core_attn_t *a);

#endif
