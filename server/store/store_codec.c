/* server/store/store_codec.c — a session as a blob (server/store/store.h):
 * the compute context it restores into, the store's owner section (its
 * layout in store_impl.h) and the core/state.h blob around them, which is a
 * session's file, a shared store's value and what an export returns; and
 * the checks a blob from a client passes before an import uses it.
 *
 * It knows neither where a blob is kept nor the session table: it calls
 * only store_base.c (store_impl.h says who calls whom).
 */
#include "server/store/store.h"
#include "server/store/store_impl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/attn/attn.h"
#include "core/le.h"
#include "core/sample.h"
#include "core/state.h"
#include "core/text/grammar.h"

/* ---- compute contexts ---- */

void srv_sess_ctx_free(srv_seq_ctx_t *c)
{
    core_attn_state_free(c->state);
    core_sampler_free(c->sampler);
    free(c->pending);
    memset(c, 0, sizeof *c);
}

/* Fresh empty context: state of the model's attention, default sampler with
 * a random seed (sessions that never set a seed must not share one stream). */
int srv_sess_ctx_new(srv_store_t *st, srv_seq_ctx_t *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    core_error_t e = {0};
    core_sample_params_t p;
    core_sample_params_default(&p);
    if (srv_sess_random_bytes(&p.seed, sizeof p.seed, NULL, 0) < 0)
        p.seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)c;
    if (core_attn_state_new(st->attn, &c->state, &e) < 0 ||
        core_sampler_new(&p, &c->sampler, &e) < 0) {
        srv_sess_ctx_free(c);
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "new session state: %s", e.msg);
    }
    return 0;
}

/* Memory of context c (0 when it holds no state). */
size_t srv_sess_ctx_bytes(const srv_seq_ctx_t *c)
{
    if (!c->state)
        return 0;
    return core_attn_state_bytes(c->state) + core_sampler_state_size() +
           c->n_pending * sizeof(int32_t);
}

int64_t srv_sess_ctx_tokens(const srv_seq_ctx_t *c)
{
    return core_attn_state_pos(c->state) + (int64_t)c->n_pending;
}

/* c = independent copy of the context of src (in memory). */
int srv_sess_ctx_copy(srv_store_t *st, const srv_seq_ctx_t *src, srv_seq_ctx_t *c, char *err,
                      size_t errlen)
{
    int rc = srv_sess_ctx_new(st, c, err, errlen);
    if (rc < 0)
        return rc;
    core_error_t e = {0};
    core_sampler_t *smp = NULL;
    if (core_attn_state_copy(c->state, src->state, &e) < 0) {
        /* States of one attention can still differ in layout (linear
         * accumulator precision): the blob carries it, a copy does not. */
        size_t n = core_state_size(src->state, NULL, 0, 0), len = 0;
        unsigned char *buf = malloc(n ? n : 1);
        core_state_desc_t d = {.fingerprint = st->fp, .state = src->state};
        int rc2 = !buf || !n ? CORE_ENOMEM : core_state_save(&d, buf, n, &len, &e);
        if (rc2 == 0)
            rc2 = core_state_load(buf, len, st->fp, c->state, NULL, NULL, NULL, NULL, NULL, &e);
        free(buf);
        if (rc2 < 0) {
            srv_sess_ctx_free(c);
            return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "copying a session: %s", e.msg);
        }
    }
    if (src->sampler && core_sampler_clone(src->sampler, &smp, &e) < 0) {
        srv_sess_ctx_free(c);
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "copying a session: %s", e.msg);
    }
    if (smp) {
        core_sampler_free(c->sampler);
        c->sampler = smp;
    }
    if (src->n_pending) {
        c->pending = malloc(src->n_pending * sizeof *c->pending);
        if (!c->pending) {
            srv_sess_ctx_free(c);
            return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM,
                              "out of memory copying pending tokens");
        }
        memcpy(c->pending, src->pending, src->n_pending * sizeof *c->pending);
        c->n_pending = src->n_pending;
    }
    return 0;
}

/* ---- the owner section ---- */

/* 1 if s is "" or OWNER_LEN lowercase hex chars. */
int srv_sess_owner_tag_valid(const char *s)
{
    return s[0] == '\0' || srv_session_id_valid(s); /* same shape as an id */
}

int srv_sess_owner_parse(const void *p, size_t n, owner_t *o)
{
    const unsigned char *b = p;
    /* flags: bits 0-2; an assistant and a user turn cannot both be open */
    if (!p || n < OWNER_BYTES_V1 || core_le_get_u32(b + 4) > 7 ||
        (core_le_get_u32(b + 4) & 5u) == 5u)
        return -1;
    uint32_t v = core_le_get_u32(b);
    if (!(v == 1u && n == OWNER_BYTES_V1) && !(v == 2u && n == OWNER_BYTES_V2) &&
        !(v >= 3u && v <= OWNER_VERSION && n >= OWNER_BYTES_V3))
        return -1;
    char tag[OWNER_LEN + 1] = "";
    if (v >= 2u && b[OWNER_BYTES_V1] != 0) {
        memcpy(tag, b + OWNER_BYTES_V1, OWNER_LEN);
        tag[OWNER_LEN] = '\0';
        if (!srv_session_id_valid(tag))
            return -1;
    }
    int64_t turns = 0;
    unsigned lf = 0;
    size_t n_in = 0, pg_t = 0, pg_r = 0;
    uint64_t gen = 0;
    if (v >= 3u) {
        turns = (int64_t)core_le_get_u64(b + OWNER_BYTES_V2);
        lf = core_le_get_u32(b + OWNER_BYTES_V2 + 8);
        n_in = core_le_get_u32(b + OWNER_BYTES_V2 + 12);
        if (turns < 0 || lf > (SRV_TURN_REPLY | SRV_TURN_CHAT | TURN_KEPT) ||
            n_in > SRV_TURN_INPUT_MAX || (n_in && !(lf & TURN_KEPT)))
            return -1;
        size_t end = OWNER_BYTES_V3 + 4 * n_in;
        if (v >= 4u) {
            if (n < end + 8)
                return -1;
            pg_t = core_le_get_u32(b + end);
            pg_r = core_le_get_u32(b + end + 4);
            if (pg_t > SRV_PENDING_GRAMMAR_MAX || pg_r > SRV_PENDING_GRAMMAR_MAX - pg_t ||
                (!pg_t && pg_r))
                return -1;
            end += 8 + pg_t + pg_r;
        }
        if (v >= 5u) {
            if (n < end + 8)
                return -1;
            gen = core_le_get_u64(b + end);
            end += 8;
        }
        if (n != end)
            return -1;
        for (size_t i = 0; i < n_in; i++)
            if (core_le_get_u32(b + OWNER_BYTES_V3 + 4 * i) > (uint32_t)INT32_MAX)
                return -1;
    }
    uint32_t f = core_le_get_u32(b + 4);
    o->turn_open = (f & 1u) ? 1 : (f & 4u) ? 2 : 0;
    o->has_chat = (int)((f >> 1) & 1u);
    o->created = (int64_t)core_le_get_u64(b + 8);
    o->last_used = (int64_t)core_le_get_u64(b + 16);
    memcpy(o->owner, tag, sizeof tag);
    o->turns = turns;
    o->last_flags = lf;
    o->in = n_in ? b + OWNER_BYTES_V3 : NULL;
    o->n_in = n_in;
    o->pg = pg_t ? b + OWNER_BYTES_V3 + 4 * n_in + 8 : NULL;
    o->pg_text = pg_t;
    o->pg_reply = pg_r;
    o->gen = gen;
    return 0;
}

size_t srv_sess_owner_bytes(size_t n_in, size_t pg_len, uint64_t gen)
{
    return OWNER_BYTES_V3 + 4 * n_in + 8 + pg_len + (gen ? 8 : 0);
}

/* The metadata of session s as its file holds it (borrowing s's input). */
owner_t srv_sess_owner_of(const srv_session_t *s)
{
    owner_t o = {.created = s->created,
                 .last_used = s->last_used,
                 .turn_open = s->turn_open,
                 .has_chat = s->has_chat,
                 .turns = s->turns,
                 .last_flags = s->last_flags,
                 .pg = s->pg,
                 .pg_text = s->pg ? s->pg_text : 0,
                 .pg_reply = s->pg ? s->pg_reply : 0,
                 .gen = s->gen};
    memcpy(o.owner, s->owner, sizeof o.owner);
    return o;
}

/* A malloc'd copy of the input ids o->in (NULL when there are none). */
int srv_sess_owner_input(const owner_t *o, int32_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!o->n_in)
        return 0;
    int32_t *v = malloc(o->n_in * sizeof *v);
    if (!v)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for a turn's input");
    for (size_t i = 0; i < o->n_in; i++)
        v[i] = (int32_t)core_le_get_u32(o->in + 4 * i);
    *out = v;
    return 0;
}

/* A malloc'd copy of the pending grammar o->pg (NULL when there is none). */
int srv_sess_owner_pg(const owner_t *o, unsigned char **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!o->pg)
        return 0;
    unsigned char *v = malloc(o->pg_text + o->pg_reply);
    if (!v)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for a pending grammar");
    memcpy(v, o->pg, o->pg_text + o->pg_reply);
    *out = v;
    return 0;
}

/* ---- blobs ---- */

/* The blob of context c with metadata o (new malloc'd *out); in[n_in] is the
 * last turn's input (o->in is not used), parts[n_parts] its checkpoints
 * (an export). id names the session in messages. */
int srv_sess_serialize_meta(const srv_store_t *st, const char *id, const owner_t *o,
                            const int32_t *in, size_t n_in, const srv_seq_ctx_t *c,
                            const core_state_part_t *parts, size_t n_parts, unsigned char **out,
                            size_t *len, char *err, size_t errlen)
{
    const size_t pg_len = o->pg ? o->pg_text + o->pg_reply : 0;
    size_t ol = srv_sess_owner_bytes(n_in, pg_len, o->gen);
    unsigned char *own = malloc(ol);
    if (!own)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "session %s: out of memory", id);
    /* generation 0 is a version 4 section, as servers before generations wrote */
    core_le_put_u32(own, o->gen ? OWNER_VERSION : 4u);
    core_le_put_u32(own + 4, (uint32_t)(o->turn_open == 1 ? 1 : o->turn_open == 2 ? 4 : 0) |
                              (uint32_t)(o->has_chat ? 2 : 0));
    core_le_put_u64(own + 8, (uint64_t)o->created);
    core_le_put_u64(own + 16, (uint64_t)o->last_used);
    memset(own + OWNER_BYTES_V1, 0, OWNER_LEN);
    memcpy(own + OWNER_BYTES_V1, o->owner, strlen(o->owner));
    core_le_put_u64(own + OWNER_BYTES_V2, (uint64_t)o->turns);
    core_le_put_u32(own + OWNER_BYTES_V2 + 8, o->last_flags);
    core_le_put_u32(own + OWNER_BYTES_V2 + 12, (uint32_t)n_in);
    for (size_t i = 0; i < n_in; i++)
        core_le_put_u32(own + OWNER_BYTES_V3 + 4 * i, (uint32_t)in[i]);
    unsigned char *pgp = own + OWNER_BYTES_V3 + 4 * n_in;
    core_le_put_u32(pgp, (uint32_t)(pg_len ? o->pg_text : 0));
    core_le_put_u32(pgp + 4, (uint32_t)(pg_len ? o->pg_reply : 0));
    if (pg_len)
        memcpy(pgp + 8, o->pg, pg_len);
    if (o->gen)
        core_le_put_u64(pgp + 8 + pg_len, o->gen);
    core_state_desc_t d = {.fingerprint = st->fp,
                           .state = c->state,
                           .sampler = c->sampler,
                           .pending = c->pending,
                           .n_pending = c->n_pending,
                           .owner = own,
                           .owner_len = ol,
                           .checkpoints = parts,
                           .n_checkpoints = n_parts};
    size_t n = core_state_desc_size(&d);
    unsigned char *buf = n ? malloc(n) : NULL;
    int rc = 0;
    core_error_t e = {0};
    if (n == 0)
        rc = STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                        "session %s: state too large to save (%zu pending "
                        "tokens)",
                        id, c->n_pending);
    else if (!buf)
        rc = STORE_FAIL(err, errlen, SRV_STORE_ENOMEM,
                        "session %s: out of memory for a %zu-byte state", id, n);
    else if (core_state_save(&d, buf, n, len, &e) < 0)
        rc = STORE_FAIL(err, errlen, SRV_STORE_EINVAL, "session %s: %s", id, e.msg);
    free(own);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    return 0;
}

/* The blob of session s with context c (new malloc'd *out). s must be held
 * (busy or io); c is s->ctx or the context about to become it. */
int srv_sess_serialize_ctx(const srv_store_t *st, const srv_session_t *s, const srv_seq_ctx_t *c,
                           unsigned char **out, size_t *len, char *err, size_t errlen)
{
    owner_t o = srv_sess_owner_of(s);
    return srv_sess_serialize_meta(st, s->id, &o, s->last_in, s->n_last_in, c, NULL, 0, out, len,
                                   err, errlen);
}

int srv_sess_serialize(const srv_store_t *st, const srv_session_t *s, unsigned char **out,
                       size_t *len, char *err, size_t errlen)
{
    return srv_sess_serialize_ctx(st, s, &s->ctx, out, len, err, errlen);
}

/* Restores blob into c (a session's context, or a fresh one): on error c is
 * unchanged. The pending tokens are checked against the vocabulary before
 * anything is replaced. Codes: EMISMATCH (the blob is not for here or is
 * damaged; message from core), ENOMEM. *o gets the owner section if valid
 * (returns 1 then, else 0 with *o untouched). */
int srv_sess_restore(srv_store_t *st, const unsigned char *b, size_t len, srv_seq_ctx_t *c,
                     owner_t *o, int *have_owner, char *err, size_t errlen)
{
    core_error_t e = {0};
    core_state_info_t in;
    *have_owner = 0;
    if (core_state_peek(b, len, &in, NULL) == 0 && in.total == len) {
        size_t off = in.owner_off + in.owner_len;
        for (size_t i = 0; i < in.n_pending; i++) {
            uint32_t t = core_le_get_u32(b + off + 4 * i);
            if (t >= (uint32_t)st->n_vocab) {
                /* Damage or another model explains it better, if either applies. */
                if (core_state_verify(b, len, st->fp, st->attn, &e) < 0)
                    return STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH, "%s", e.msg);
                return STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH,
                                  "pending token %zu has id %u, the vocabulary "
                                  "has %d",
                                  i, t, st->n_vocab);
            }
        }
    }
    int32_t *pend = NULL;
    size_t np = 0, ol = 0;
    const void *own = NULL;
    int rc = core_state_load(b, len, st->fp, c->state, c->sampler, &pend, &np, &own, &ol, &e);
    if (rc < 0)
        return rc == CORE_ENOMEM ? STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "%s", e.msg)
                                 : STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH, "%s", e.msg);
    free(c->pending);
    c->pending = pend;
    c->n_pending = np;
    if (srv_sess_owner_parse(own, ol, o) == 0) {
        *have_owner = 1;
        /* a turn's input that this vocabulary cannot feed is not kept */
        for (size_t i = 0; i < o->n_in; i++)
            if (core_le_get_u32(o->in + 4 * i) >= (uint32_t)st->n_vocab) {
                o->last_flags &= ~TURN_KEPT;
                o->in = NULL;
                o->n_in = 0;
                break;
            }
    }
    return 0;
}

void srv_sess_meta_free(meta_t *m)
{
    free(m->in);
    free(m->pg);
    m->in = NULL;
    m->pg = NULL;
}

/* Loads blob buf[len] into a fresh context *c; its metadata into *m (may
 * be NULL; free with srv_sess_meta_free). what names the blob in messages ("session
 * file DIR/NAME"). */
int srv_sess_load_blob(srv_store_t *st, const unsigned char *buf, size_t len, const char *what,
                       srv_seq_ctx_t *c, meta_t *m, char *err, size_t errlen)
{
    if (m)
        memset(m, 0, sizeof *m);
    int rc = srv_sess_ctx_new(st, c, err, errlen);
    if (rc < 0)
        return rc;
    owner_t o;
    int have;
    rc = srv_sess_restore(st, buf, len, c, &o, &have, err, errlen);
    if (rc < 0) {
        srv_sess_ctx_free(c);
        if (rc != SRV_STORE_ENOMEM) {
            char msg[SRV_STORE_ERR_MAX];
            snprintf(msg, sizeof msg, "%s", err && errlen ? err : "");
            rc = STORE_FAIL(err, errlen, SRV_STORE_EIO, "%s: %s", what, msg);
        }
    } else if (m && have) {
        m->have = 1;
        m->o = o;
        m->o.in = NULL;
        if ((rc = srv_sess_owner_input(&o, &m->in, err, errlen)) < 0 ||
            (rc = srv_sess_owner_pg(&o, &m->pg, err, errlen)) < 0) {
            srv_sess_meta_free(m);
            srv_sess_ctx_free(c);
        }
        m->o.pg = m->pg;
    }
    return rc;
}

/* ---- sizes ---- */

static size_t sat_mul(size_t a, size_t b)
{
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

static size_t sat_add(size_t a, size_t b)
{
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

/* Upper bound of any blob of this configuration with at most `pending`
 * pending tokens and `owner` owner bytes (payloads in attn_*.c). */
static size_t max_blob_bytes(const core_attn_cfg_t *c, size_t pending, size_t owner)
{
    size_t L = (size_t)c->n_layer, kv = sat_mul((size_t)c->n_head_kv, (size_t)c->head_dim);
    size_t payload;
    if (c->kind == CORE_ATTN_EXACT) {
        payload = sat_mul(sat_mul(2 * L, (size_t)c->max_ctx), sat_mul(kv, sizeof(float)));
    } else {
        /* per (layer, KV head, feature) c in f64 and z and an S row in f64
         * at most; K and V rows in halves at most (the widest rows written
         * since the window was kept in halves: 8-bit rows are smaller; the
         * oldest payloads' f32 rows import while they fit) of the ring (the
         * window, one block more with exact memory) and of the sinks; exact
         * memory's λ word and per head a count and λ rows of a position, a
         * score and K and V halves (core/attn/attn_linear.c lin_ser_sizes,
         * mem_bytes) */
        const size_t heads = sat_mul(L, (size_t)c->n_head_kv), lambda = (size_t)c->memory;
        const size_t nz = sat_mul(heads, (size_t)c->n_features);
        const size_t rows =
            (size_t)c->window + (size_t)c->sinks + (lambda ? (size_t)CORE_ATTN_MEMORY_BLOCK : 0);
        payload = sat_add(sat_mul(nz, 16), sat_mul(sat_mul(nz, (size_t)c->head_dim), 8));
        payload = sat_add(payload, sat_mul(sat_mul(2 * L, rows), sat_mul(kv, 2)));
        if (lambda) {
            const size_t row = 8 + 4 + 2 * sizeof(uint16_t) * (size_t)c->head_dim;
            payload =
                sat_add(payload, sat_add(4, sat_mul(heads, sat_add(4, sat_mul(lambda, row)))));
        }
        payload = sat_add(payload, 8);
    }
    size_t fixed = CORE_STATE_HEADER_BYTES + owner + 4 * pending + core_sampler_state_size() + 4;
    return sat_add(fixed, payload);
}

void srv_sess_blob_bounds(const core_attn_cfg_t *c, size_t n_ckpt, size_t *blob, size_t *ckpt,
                          size_t *export)
{
    *blob = max_blob_bytes(c, CORE_STATE_MAX_PENDING, CORE_STATE_MAX_OWNER);
    *ckpt = max_blob_bytes(c, CKPT_PENDING_MAX,
                           srv_sess_owner_bytes(SRV_TURN_INPUT_MAX, SRV_PENDING_GRAMMAR_MAX, 1));
    *export = sat_add(*blob, sat_mul(n_ckpt, sat_add(*ckpt, 8)));
}

/* ---- a client's blob ---- */

/* The metadata of the owner section at b's head (a blob core_state_load
 * accepted): 0 and *o, or -1 when it has none this store reads. */
int srv_sess_blob_owner(const unsigned char *b, size_t len, owner_t *o)
{
    core_state_info_t in;
    if (core_state_peek(b, len, &in, NULL) < 0)
        return -1;
    return srv_sess_owner_parse(b + in.owner_off, in.owner_len, o);
}

/* Checks a pending grammar that a client's blob carries: it compiles, and
 * its reply so far follows it, as a later generate with continue_grammar
 * needs (that request would fail with an internal error otherwise). No
 * vocabulary: only the text is checked here, as the generate checks it.
 * EMISMATCH saying which, ENOMEM. */
int srv_sess_owner_pg_check(const owner_t *o, char *err, size_t errlen)
{
    if (!o->pg)
        return 0;
    core_error_t e = {0};
    core_grammar_t *g = NULL;
    core_grammar_state_t gs = {0};
    core_grammar_ws_t *ws = NULL;
    int compiled = 0;
    int rc = core_grammar_new((const char *)o->pg, o->pg_text, NULL, NULL, &g, &e);
    if (rc == 0)
        rc = core_grammar_state_init(&gs, g, &e);
    if (rc == 0) {
        compiled = 1;
        ws = core_grammar_ws_new();
        rc = ws ? core_grammar_accept_bytes(&gs, ws, o->pg + o->pg_text, o->pg_reply, &e)
                : CORE_ENOMEM;
    }
    core_grammar_ws_free(ws);
    core_grammar_state_clear(&gs);
    core_grammar_free(g);
    if (rc == CORE_ENOMEM)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM,
                          "out of memory checking a pending grammar");
    if (rc < 0 && !compiled)
        return STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH,
                          "the pending grammar (%zu bytes) is not a valid grammar: %s", o->pg_text,
                          e.msg);
    if (rc < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH,
                          "the pending reply (%zu bytes) does not follow the pending grammar: %s",
                          o->pg_reply, e.msg);
    return 0;
}

/* Checks the checkpoints of an imported blob (which core_state_verify
 * accepted) before anything changes: each loads (payload and pending
 * tokens checked) into scratch, names its turn count, the counts rise and
 * stay below the blob's own (turns), and a pending grammar follows its
 * grammar. *first = the first of the newest max_ckpt, which are kept, and
 * *first_turn its turn count (INT64_MAX when none is kept). EMISMATCH
 * with the reason. */
int srv_sess_blob_check(srv_store_t *st, const unsigned char *blob, size_t len, int64_t turns,
                        srv_seq_ctx_t *scratch, size_t *first, int64_t *first_turn, char *err,
                        size_t errlen)
{
    core_state_info_t in;
    int64_t turn_of[CORE_STATE_MAX_CHECKPOINTS];
    *first = 0;
    *first_turn = INT64_MAX;
    if (core_state_peek(blob, len, &in, NULL) < 0 || in.n_checkpoints == 0)
        return 0;
    int64_t prev = -1;
    for (size_t i = 0; i < in.n_checkpoints; i++) {
        const void *p = NULL;
        size_t pl = 0;
        core_error_t e = {0};
        owner_t o;
        int have = 0;
        if (core_state_checkpoint(blob, len, i, &p, &pl, &e) < 0)
            return STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH, "checkpoint %zu: %s", i, e.msg);
        int rc = srv_sess_restore(st, p, pl, scratch, &o, &have, err, errlen);
        if (rc == 0 && have)
            rc = srv_sess_owner_pg_check(&o, err, errlen);
        if (rc < 0) {
            char msg[SRV_STORE_ERR_MAX];
            snprintf(msg, sizeof msg, "%s", err && errlen ? err : "");
            return rc == SRV_STORE_ENOMEM
                       ? rc
                       : STORE_FAIL(err, errlen, rc, "checkpoint %zu: %s", i, msg);
        }
        if (!have || o.turns <= prev || o.turns >= turns)
            return STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH,
                              "checkpoint %zu: its turn count (%lld) must "
                              "rise from one checkpoint to the next and stay below the "
                              "session's (%lld)",
                              i, have ? (long long)o.turns : -1LL, (long long)turns);
        prev = turn_of[i] = o.turns;
    }
    if (in.n_checkpoints > st->max_ckpt)
        *first = in.n_checkpoints - st->max_ckpt;
    if (*first < in.n_checkpoints)
        *first_turn = turn_of[*first];
    return 0;
}
