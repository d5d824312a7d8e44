/* core/sample.h — token sampling and stop strings.
 *
 * Three objects:
 *   core_sampler_t    one sequence's sampling state: the parameters in force,
 *                     the RNG stream and a bounded ring of the last
 *                     CORE_SAMPLE_HISTORY tokens (for the penalties). The RNG
 *                     state and the ring are part of a session's saved state
 *                     (core_sampler_state_save/load), the parameters are not:
 *                     they come with each request.
 *   core_sample_ws_t  scratch memory (O(V)) for one sampling call at a time.
 *                     Owned by the thread that samples (the scheduler), shared
 *                     by all the sequences it serves, so a sampler stays small.
 *   core_stop_t       stop-string matcher over the decoded text stream.
 *
 * The sampling pipeline (llama.cpp's order), on V logits:
 *   0. logit bias: z_t += bias for every (t, bias) of params.bias (ids >= V
 *      are ignored); then, with a mask (core_sampler_sample_masked, e.g. a
 *      grammar's), every token whose bit is 0 gets -inf, so it can never be
 *      drawn whatever the later steps do.
 *   1. penalties over the last repeat_last_n tokens of the ring, per distinct
 *      token t seen c times there:
 *        repeat_penalty r (llama.cpp): z_t = z_t > 0 ? z_t / r : z_t * r
 *        then OpenAI: z_t -= c * frequency_penalty + (c > 0) * presence_penalty
 *      Tokens of the ring that are >= V are ignored.
 *   2. temperature == 0: greedy, the argmax of the penalized logits (lowest id
 *      on ties); steps 3-7 are skipped and no random number is drawn.
 *   3. top-k: keep the k largest (order: logit descending, id ascending).
 *   4. top-p: softmax (temperature 1) over the tokens kept so far; keep the
 *      shortest prefix, in that order, whose cumulative probability is >= p.
 *   5. min-p: keep tokens with p_i >= min_p * p_max, i.e.
 *      z_i >= z_max + log(min_p) (the argmax always survives 3-5).
 *   6. temperature: w_i = exp((z_i - z_max) / temperature) over the survivors.
 *   7. draw: one u = core_rng_uniform() per sample; walking the survivors in
 *      ascending token id, the first token whose cumulative weight exceeds
 *      u * sum(w) is chosen.
 * The same parameters, seed, logits and history give the same tokens.
 *
 * Reported log-probabilities (core_sample_result_t): log-softmax of the
 * penalized logits divided by the temperature (1 when greedy), over the WHOLE
 * vocabulary — the distribution after bias, mask, penalties and temperature,
 * before the top-k / top-p / min-p truncation (a masked token has -inf). This is what OpenAI-style `logprobs`
 * report; the alternatives are the n_logprobs most likely tokens of that
 * distribution, whether or not the truncation kept them.
 */
#ifndef DARKSERVE_CORE_SAMPLE_H
#define DARKSERVE_CORE_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

#define CORE_SAMPLE_HISTORY 256           /* ring size: tokens kept for penalties */
#define CORE_SAMPLE_MAX_LOGPROBS 20       /* most alternatives one sample reports */
#define CORE_SAMPLE_MAX_VOCAB (1 << 22)   /* largest V accepted (bounds the scratch) */
#define CORE_SAMPLE_MAX_BIAS 1024         /* logit bias entries */
#define CORE_SAMPLE_BIAS_LIMIT 100.0f     /* |bias| <= this (OpenAI's range) */

typedef struct core_logit_bias {
    int32_t id;  /* >= 0; an id >= V is ignored */
    float bias;  /* [-100, 100], added to the token's logit */
} core_logit_bias_t;

typedef struct core_sample_params {
    float temperature;       /* >= 0; 0 = greedy (so is any T whose 1/T
                                overflows a float) */
    int32_t top_k;           /* >= 0; 0 = off (k >= V is off too) */
    float top_p;             /* (0, 1]; 1 = off */
    float min_p;             /* [0, 1]; 0 = off */
    float repeat_penalty;    /* > 0; 1 = off */
    int32_t repeat_last_n;   /* window of every penalty: the last n tokens of the
                                ring, 0..CORE_SAMPLE_HISTORY, -1 = whole ring */
    float presence_penalty;  /* [-2, 2]; 0 = off */
    float frequency_penalty; /* [-2, 2]; 0 = off */
    uint64_t seed;           /* RNG seed used by core_sampler_new / _seed */
    int32_t n_logprobs;      /* 0..CORE_SAMPLE_MAX_LOGPROBS alternatives to report */
    int32_t no_logprob;      /* 0 or 1: nothing is reported (n_logprobs 0, the
                                result's logprob NaN), so a greedy token costs no
                                pass of exponentials over the vocabulary */
    int32_t n_bias;          /* 0..CORE_SAMPLE_MAX_BIAS entries of bias */
    core_logit_bias_t bias[CORE_SAMPLE_MAX_BIAS]; /* step 0; an id listed twice adds twice */
} core_sample_params_t;

/* Neutral parameters: temperature 1, every filter and penalty off,
 * repeat_last_n 64, seed 0, no alternatives, no bias. */
void core_sample_params_default(core_sample_params_t *p);

/* 0, or CORE_EINVAL with a message that names the offending field. */
int core_sample_params_validate(const core_sample_params_t *p, core_error_t *err);

typedef struct core_sample_logprob {
    int32_t id;
    float logprob;
} core_sample_logprob_t;

typedef struct core_sample_result {
    int32_t token;   /* the chosen token */
    float logprob;   /* its log-probability (see the header comment) */
    int32_t n_top;   /* = params.n_logprobs, capped at V */
    core_sample_logprob_t top[CORE_SAMPLE_MAX_LOGPROBS]; /* descending logprob,
                                                            ascending id on ties */
} core_sample_result_t;

typedef struct core_sampler core_sampler_t;
typedef struct core_sample_ws core_sample_ws_t;

/* ---- workspace ---- */

/* New empty workspace (grows to the largest V it is used with). Caller owns it. */
core_sample_ws_t *core_sample_ws_new(void);
void core_sample_ws_free(core_sample_ws_t *ws); /* NULL is a no-op */

/* ---- sampler ---- */

/* New sampler with a copy of p (validated), its RNG seeded from p->seed and an
 * empty history. *out is owned by the caller (core_sampler_free). */
int core_sampler_new(const core_sample_params_t *p, core_sampler_t **out, core_error_t *err);
void core_sampler_free(core_sampler_t *s); /* NULL is a no-op */

/* Fork: a new sampler with the same parameters, RNG position and history.
 * Both then produce the same tokens from the same logits. Caller owns *out. */
int core_sampler_clone(const core_sampler_t *s, core_sampler_t **out, core_error_t *err);

/* Replaces the parameters (validated first; s is unchanged on error). Does not
 * touch the RNG or the history: call core_sampler_seed to restart the stream. */
int core_sampler_set_params(core_sampler_t *s, const core_sample_params_t *p, core_error_t *err);
const core_sample_params_t *core_sampler_params(const core_sampler_t *s); /* borrowed */

/* Restarts the RNG stream from seed. */
void core_sampler_seed(core_sampler_t *s, uint64_t seed);

/* Appends a token to the history ring (the oldest falls out when full).
 * core_sampler_sample does this itself for the token it picks; call this for
 * tokens that should count for penalties without being sampled (e.g. a
 * prompt). CORE_EINVAL for a negative id. */
int core_sampler_accept(core_sampler_t *s, int32_t token, core_error_t *err);
void core_sampler_clear_history(core_sampler_t *s);
/* Copies up to cap history tokens, oldest first, into out (caller-owned);
 * returns how many the ring holds (<= CORE_SAMPLE_HISTORY). */
size_t core_sampler_history(const core_sampler_t *s, int32_t *out, size_t cap);

/* Samples one token from logits [V] (borrowed, unchanged; NaN or +inf is
 * CORE_EINVAL, -inf bans a token, at least one must be finite), appends it to
 * the history and fills *res (caller-owned). ws is used as scratch. */
int core_sampler_sample(core_sampler_t *s, core_sample_ws_t *ws, const float *logits, int64_t V,
                        core_sample_result_t *res, core_error_t *err);
/* The same with a mask: allow[(V + 63) / 64] (borrowed; bit t % 64 of word
 * t / 64) says which tokens may be drawn; NULL allows all. Every other
 * setting applies as without it, over the allowed tokens. When no allowed
 * token has a finite logit: CORE_EINVAL, nothing drawn. */
int core_sampler_sample_masked(core_sampler_t *s, core_sample_ws_t *ws, const float *logits,
                               int64_t V, const uint64_t *allow, core_sample_result_t *res,
                               core_error_t *err);

/* The distribution step 7 would draw from, without drawing or touching the
 * history: the surviving token ids in ascending order and their normalized
 * probabilities into ids/probs (caller-owned, cap entries; CORE_ERANGE if more
 * survive). Greedy gives the argmax with probability 1. For tests and
 * diagnostics. */
int core_sampler_dist(const core_sampler_t *s, core_sample_ws_t *ws, const float *logits,
                      int64_t V, int32_t *ids, double *probs, size_t cap, size_t *n_out,
                      core_error_t *err);
/* core_sampler_dist under a mask (as core_sampler_sample_masked). */
int core_sampler_dist_masked(const core_sampler_t *s, core_sample_ws_t *ws, const float *logits,
                             int64_t V, const uint64_t *allow, int32_t *ids, double *probs,
                             size_t cap, size_t *n_out, core_error_t *err);

/* ---- saved state: RNG position + history ring ----
 *
 * Layout (version 1, little-endian, fixed size):
 *   0    "DSSM"                 magic
 *   4    u32 version            1
 *   8    u32 capacity           CORE_SAMPLE_HISTORY
 *   12   u32 count              tokens held, <= capacity
 *   16   u64 rng[4]             xoshiro state, not all zero
 *   48   i32 tokens[capacity]   oldest first; count valid ids >= 0, rest 0
 *   48+4*capacity  u32 crc32    (IEEE) of every byte before it
 * The parameters are not saved.
 */
size_t core_sampler_state_size(void);
/* Writes core_sampler_state_size() bytes into buf (caller-owned, cap bytes;
 * CORE_ERANGE if too small). */
int core_sampler_state_save(const core_sampler_t *s, void *buf, size_t cap, core_error_t *err);
/* Replaces s's RNG and history from buf (borrowed, exactly len bytes). Any
 * malformed input (size, magic, version, checksum, counts, ids) is
 * CORE_EFORMAT / CORE_ECHECKSUM / CORE_EUNSUPPORTED and leaves s unchanged. */
int core_sampler_state_load(core_sampler_t *s, const void *buf, size_t len, core_error_t *err);

/* ---- stop strings ----
 *
 * Fed the generated text piece by piece, the matcher finds the first place
 * where any stop string ends (whatever the piece boundaries: the result does
 * not depend on how the text is split). Among stop strings that end at the
 * same byte the longest wins. Text that could still turn out to be the start
 * of a stop string is held back until it is decided. Matching is on bytes;
 * for UTF-8 stop strings and UTF-8 text a match starts on a character
 * boundary. On a match the stop string and everything after it are dropped
 * (OpenAI semantics) and the matcher stays matched until reset.
 */
#define CORE_STOP_MAX 16        /* stop strings per matcher */
#define CORE_STOP_MAX_LEN 256   /* bytes per stop string */
#define CORE_STOP_MAX_FEED (1 << 20) /* bytes per core_stop_feed call */

typedef struct core_stop core_stop_t;

typedef struct core_stop_result {
    const char *text; /* bytes safe to emit now; borrowed from the matcher, valid
                         until its next call. Not NUL-terminated; may be
                         NULL when len is 0. */
    size_t len;
    int matched;      /* 1: a stop string was found; text ends right before it */
    int which;        /* index of the matched stop string, -1 if none */
} core_stop_result_t;

/* New matcher over n (<= CORE_STOP_MAX) stop strings stops[i] (borrowed,
 * copied), of lens[i] bytes each (lens may be NULL: NUL-terminated strings).
 * An empty or too long stop string is CORE_EINVAL naming its index. n = 0
 * gives a matcher that passes everything through. Caller owns *out. */
int core_stop_new(const char *const *stops, const size_t *lens, size_t n, core_stop_t **out,
                  core_error_t *err);
void core_stop_free(core_stop_t *m); /* NULL is a no-op */
/* Forgets the held text and any match. */
void core_stop_reset(core_stop_t *m);
/* Feeds len bytes of text (borrowed). After a match it returns no text and
 * matched = 1 again. CORE_EINVAL if len > CORE_STOP_MAX_FEED. */
int core_stop_feed(core_stop_t *m, const char *piece, size_t len, core_stop_result_t *res,
                   core_error_t *err);
/* End of the text (EOS, length limit): returns the held-back text. */
void core_stop_flush(core_stop_t *m, core_stop_result_t *res);
/* Bytes currently held back. */
size_t core_stop_pending(const core_stop_t *m);

#endif
