/* server/store/store_blob.c — a session as a blob (server/store/store.h): the
 * core/state.h blob with the store's owner section (its layout in
 * store_impl.h), which is a session's file, a shared store's value and what
 * an export returns; its (de)serialization, and export and import.
 *
 * Nothing here knows where a blob is kept: files are read and written
 * through store_dir.c.
 */
#include "server/store/store.h"
#include "server/store/store_impl.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/le.h"
#include "core/state.h"
#include "core/text/grammar.h"

/* ---- the owner section ---- */

/* 1 if s is "" or OWNER_LEN lowercase hex chars. */
int srv_sess_owner_tag_valid(const char *s)
{
    return s[0] == '\0' || srv_session_id_valid(s); /* same shape as an id */
}

int srv_sess_owner_parse(const void *p, size_t n, owner_t *o)
{
    const unsigned char *b = p;
    if (!p || n < OWNER_BYTES_V1 || core_le_get_u32(b + 4) > 3)
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
    o->turn_open = (int)(f & 1u);
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

/* ---- blobs ---- */

/* The blob of context c with metadata o (new malloc'd *out); in[n_in] is the
 * last turn's input (o->in is not used), parts[n_parts] its checkpoints
 * (an export). id names the session in messages. */
static int serialize_meta(const srv_store_t *st, const char *id, const owner_t *o,
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
    core_le_put_u32(own + 4, (uint32_t)(o->turn_open ? 1 : 0) | (uint32_t)(o->has_chat ? 2 : 0));
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
    return serialize_meta(st, s->id, &o, s->last_in, s->n_last_in, c, NULL, 0, out, len, err,
                          errlen);
}

int srv_sess_serialize(const srv_store_t *st, const srv_session_t *s, unsigned char **out,
                       size_t *len, char *err, size_t errlen)
{
    return srv_sess_serialize_ctx(st, s, &s->ctx, out, len, err, errlen);
}

/* A malloc'd copy of the input ids o->in (NULL when there are none). */
static int owner_input(const owner_t *o, int32_t **out, char *err, size_t errlen)
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

/* Restores blob into c (a session's context, or a fresh one): on error c is
 * unchanged. The pending tokens are checked against the vocabulary before
 * anything is replaced. Codes: EMISMATCH (the blob is not for here or is
 * damaged; message from core), ENOMEM. *o gets the owner section if valid
 * (returns 1 then, else 0 with *o untouched). */
static int restore(srv_store_t *st, const unsigned char *b, size_t len, srv_seq_ctx_t *c,
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
    rc = restore(st, buf, len, c, &o, &have, err, errlen);
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
        if ((rc = owner_input(&o, &m->in, err, errlen)) < 0 ||
            (rc = srv_sess_owner_pg(&o, &m->pg, err, errlen)) < 0) {
            srv_sess_meta_free(m);
            srv_sess_ctx_free(c);
        }
        m->o.pg = m->pg;
    }
    return rc;
}

/* ---- export ---- */

/* The checkpoint files of s (held) read back as blobs for an export:
 * parts[*n] (each blob malloc'd; free with parts_free). A file that is
 * gone or damaged is left out (it is no state of the session's), and one
 * over max_ckpt_blob (so that the export stays within what an import
 * takes). */
static int export_parts(srv_store_t *st, srv_session_t *s, core_state_part_t *parts, size_t *n,
                        char *err, size_t errlen)
{
    *n = 0;
    for (size_t k = 0; k < s->n_ckpt; k++) {
        char name[CKPT_NAME_MAX];
        srv_sess_ckpt_name(name, s->id, s->ckpt[k].turn, s->ckpt[k].gen);
        unsigned char *b = NULL;
        size_t l = 0;
        int rc = srv_sess_read_file(st, name, &b, &l, err, errlen);
        if (rc == SRV_STORE_ENOMEM)
            return rc;
        core_error_t e = {0};
        if (rc < 0 || l > st->max_ckpt_blob || core_state_verify(b, l, st->fp, st->attn, &e) < 0) {
            free(b);
            continue;
        }
        parts[(*n)++] = (core_state_part_t){.blob = b, .len = l};
    }
    return 0;
}

static void parts_free(core_state_part_t *parts, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free((void *)(uintptr_t)parts[i].blob);
}

int srv_store_export(srv_store_t *st, const char *id, void **blob, size_t *len, char *err,
                     size_t errlen)
{
    *blob = NULL;
    *len = 0;
    if (!srv_session_id_valid(id))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                          "malformed session id (expected 32 lowercase hex chars)");
    if (st->be)
        return srv_sess_remote_export(st, id, blob, len, err, errlen);
    srv_session_t *s = NULL;
    pthread_mutex_lock(&st->mu);
    int rc = srv_sess_take(st, id, &s, err, errlen);
    pthread_mutex_unlock(&st->mu);
    if (rc < 0)
        return rc;
    unsigned char *buf = NULL;
    size_t n = 0, np = 0;
    core_state_part_t parts[SRV_STORE_MAX_CHECKPOINTS];
    if (s->n_ckpt)
        rc = export_parts(st, s, parts, &np, err, errlen);
    if (rc < 0) {
        /* out of memory */
    } else if (np) {
        /* the state and its checkpoints in one version 2 blob */
        srv_seq_ctx_t c = {0};
        meta_t m = {0};
        if (!s->ctx.state)
            rc = srv_sess_load_file(st, s->id, &c, &m, err, errlen);
        if (rc == 0) {
            owner_t o = srv_sess_owner_of(s);
            const int32_t *in = s->last_in;
            size_t n_in = s->n_last_in;
            if (!s->ctx.state) {
                o.last_flags = m.o.last_flags;
                in = m.in;
                n_in = m.o.n_in;
                o.pg = m.pg;
                o.pg_text = m.o.pg_text;
                o.pg_reply = m.o.pg_reply;
            }
            rc = serialize_meta(st, s->id, &o, in, n_in, s->ctx.state ? &s->ctx : &c, parts, np,
                                &buf, &n, err, errlen);
        }
        srv_sess_ctx_free(&c);
        srv_sess_meta_free(&m);
    } else if (s->ctx.state) {
        rc = srv_sess_serialize(st, s, &buf, &n, err, errlen);
    } else if ((rc = srv_sess_read_file(st, s->id, &buf, &n, err, errlen)) == 0) {
        core_error_t e = {0};
        if (core_state_verify(buf, n, st->fp, st->attn, &e) < 0) {
            free(buf);
            buf = NULL;
            rc = STORE_FAIL(err, errlen, SRV_STORE_EIO, "session file %s/%s: %s", st->dir, s->id,
                            e.msg);
        }
    }
    parts_free(parts, np);
    pthread_mutex_lock(&st->mu);
    srv_sess_give_back(st, s);
    pthread_mutex_unlock(&st->mu);
    if (rc < 0)
        return rc;
    *blob = buf;
    *len = n;
    return 0;
}

/* ---- import ---- */

/* The metadata of the owner section at b's head (a blob core_state_load
 * accepted): 0 and *o, or -1 when it has none this store reads. */
static int blob_owner(const unsigned char *b, size_t len, owner_t *o)
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
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory checking a pending grammar");
    if (rc < 0 && !compiled)
        return STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH,
                          "the pending grammar (%zu bytes) is not a valid grammar: %s",
                          o->pg_text, e.msg);
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
 * grammar. *first = the first of the newest max_ckpt, which are kept.
 * EMISMATCH with the reason. */
static int import_check(srv_store_t *st, const unsigned char *blob, size_t len, int64_t turns,
                        srv_seq_ctx_t *scratch, size_t *first, char *err, size_t errlen)
{
    core_state_info_t in;
    *first = 0;
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
        int rc = restore(st, p, pl, scratch, &o, &have, err, errlen);
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
        prev = o.turns;
    }
    if (in.n_checkpoints > st->max_ckpt)
        *first = in.n_checkpoints - st->max_ckpt;
    return 0;
}

/* A checkpoint file an import wrote. */
typedef struct staged {
    int64_t turn, tokens;
    size_t bytes;
} staged_t;

/* Deletes the checkpoint files an import wrote, out[n] of generation gen:
 * the import did not happen. Best effort: a file left behind is of a
 * generation no session file has, which startup deletes. */
static void import_unstage(srv_store_t *st, const char *id, const staged_t *out, size_t n,
                           uint64_t gen)
{
    for (size_t i = 0; i < n; i++) {
        char name[CKPT_NAME_MAX];
        srv_sess_ckpt_name(name, id, out[i].turn, gen);
        unlinkat(st->dirfd, name, 0);
    }
}

/* Writes the imported blob's checkpoints from index first on as files of
 * session s (held) under generation gen, whose names no file of s's has,
 * with s's owner tag and creation time: out[*n] (caller-owned, room for
 * every checkpoint) lists them. On an error the files written so far are
 * deleted again and the error is returned: the import is all or nothing. */
static int import_stage(srv_store_t *st, const srv_session_t *s, const unsigned char *blob,
                        size_t len, size_t first, uint64_t gen, srv_seq_ctx_t *scratch,
                        staged_t *out, size_t *n, char *err, size_t errlen)
{
    core_state_info_t in;
    *n = 0;
    if (core_state_peek(blob, len, &in, NULL) < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH, "the state blob is damaged");
    int rc = 0;
    for (size_t i = first; rc == 0 && i < in.n_checkpoints; i++) {
        const void *p = NULL;
        size_t pl = 0, wl = 0;
        owner_t o;
        int have = 0;
        unsigned char *buf = NULL;
        int32_t *ids = NULL;
        /* import_check loaded each of them already: only memory can fail here */
        if (core_state_checkpoint(blob, len, i, &p, &pl, NULL) < 0 ||
            (rc = restore(st, p, pl, scratch, &o, &have, err, errlen)) < 0 || !have ||
            (rc = owner_input(&o, &ids, err, errlen)) < 0) {
            rc = rc < 0 ? rc : STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH,
                                          "checkpoint %zu of the state blob is damaged", i);
            break;
        }
        memcpy(o.owner, s->owner, sizeof o.owner);
        o.created = s->created;
        o.gen = gen;
        char name[CKPT_NAME_MAX];
        srv_sess_ckpt_name(name, s->id, o.turns, gen);
        rc = serialize_meta(st, s->id, &o, ids, o.n_in, scratch, NULL, 0, &buf, &wl, err, errlen);
        free(ids);
        if (rc == 0)
            rc = srv_sess_write_file(st, name, buf, wl, err, errlen);
        free(buf);
        if (rc == 0)
            out[(*n)++] = (staged_t){
                .turn = o.turns, .tokens = srv_sess_ctx_tokens(scratch), .bytes = wl};
    }
    if (rc < 0) {
        import_unstage(st, s->id, out, *n, gen);
        *n = 0;
    }
    return rc;
}

/* An import replaces the session's state and its whole set of checkpoints
 * at once, atomic across a crash (store_impl.h "Generations"): the blob's
 * checkpoints are written under a generation that no file of the session
 * has, then the new session file, naming that generation, is renamed over
 * the old one. That rename is the commit: before it the old file and the
 * old set are untouched, after it the old set is deleted (startup deletes
 * what a crash left of either). */
int srv_store_import(srv_store_t *st, const char *id, const void *blob, size_t len, char *err,
                     size_t errlen)
{
    int rc;
    srv_session_t *s = NULL;
    int reserved = 0;
    srv_seq_ctx_t scratch = {0}, c = {0}, old = {0};
    staged_t *staged = NULL;
    size_t n_staged = 0;
    if (!srv_session_id_valid(id)) {
        rc = STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                        "malformed session id (expected 32 lowercase hex chars)");
        goto out;
    }
    if (!blob || len > st->max_export) {
        rc = STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH,
                        "state blob of %zu bytes is larger than any state of this "
                        "server (%zu)",
                        len, st->max_export);
        goto out;
    }
    if (st->be) {
        rc = srv_sess_remote_import(st, id, blob, len, err, errlen);
        goto out;
    }
    pthread_mutex_lock(&st->mu);
    rc = srv_sess_take(st, id, &s, err, errlen);
    if (rc == 0 && !s->ctx.state) {
        /* Evicted: the blob's context is swapped in below. */
        if ((rc = srv_sess_make_room(st, 1, err, errlen)) < 0) {
            srv_sess_give_back(st, s);
        } else {
            reserved = 1;
            st->n_mem++;
        }
    }
    pthread_mutex_unlock(&st->mu);
    if (rc < 0)
        goto out;

    owner_t o = {0};
    int have = 0;
    size_t first = 0, wlen = 0;
    int32_t *in = NULL;
    unsigned char *pg = NULL, *buf = NULL;
    core_error_t ve = {0};
    core_state_info_t bi;
    /* the whole blob, checkpoints included, is checked before anything
     * changes */
    if (core_state_verify(blob, len, st->fp, st->attn, &ve) < 0 ||
        core_state_peek(blob, len, &bi, &ve) < 0) {
        rc = STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH, "%s", ve.msg);
        goto done;
    }
    have = blob_owner(blob, len, &o) == 0;
    if ((rc = srv_sess_ctx_new(st, &scratch, err, errlen)) < 0 ||
        (rc = import_check(st, blob, len, have ? o.turns : 0, &scratch, &first, err, errlen)) < 0 ||
        (rc = srv_sess_ctx_new(st, &c, err, errlen)) < 0 ||
        (rc = restore(st, blob, len, &c, &o, &have, err, errlen)) < 0)
        goto done;
    if (have && (rc = srv_sess_owner_pg_check(&o, err, errlen)) < 0)
        goto done;
    if (!have) /* a blob without the store's section: a session with no turn yet */
        o = (owner_t){0};
    if ((rc = owner_input(&o, &in, err, errlen)) < 0 ||
        (rc = srv_sess_owner_pg(&o, &pg, err, errlen)) < 0)
        goto done;
    /* the session's own owner tag and creation time stay */
    memcpy(o.owner, s->owner, sizeof o.owner);
    o.created = s->created;
    o.last_used = (int64_t)time(NULL);
    o.pg = pg;
    o.gen = 0; /* not the blob's: the generation is this directory's business */
    if (st->dirfd >= 0) {
        pthread_mutex_lock(&st->mu);
        /* above any generation whose files a failed import may have left */
        o.gen = (s->gen > s->gen_used ? s->gen : s->gen_used) + 1;
        s->gen_used = o.gen;
        pthread_mutex_unlock(&st->mu);
        if (st->max_ckpt && bi.n_checkpoints > first &&
            !(staged = calloc(bi.n_checkpoints - first, sizeof *staged))) {
            rc = STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for an import");
            goto done;
        }
        if (staged && (rc = import_stage(st, s, blob, len, first, o.gen, &scratch, staged,
                                         &n_staged, err, errlen)) < 0)
            goto done;
        rc = serialize_meta(st, s->id, &o, in, o.n_in, &c, NULL, 0, &buf, &wlen, err, errlen);
        if (rc == 0) /* the commit */
            rc = srv_sess_write_file(st, s->id, buf, wlen, err, errlen);
        free(buf);
        if (rc < 0) {
            import_unstage(st, s->id, staged, n_staged, o.gen);
            goto done;
        }
    }

    pthread_mutex_lock(&st->mu);
    /* the old set belongs to the state the session left: deleted after the
     * commit (what cannot be deleted now, startup deletes) */
    srv_sess_ckpt_drop_from(st, s, 0);
    for (size_t i = 0; i < n_staged; i++)
        if (srv_sess_ckpt_add(st, s, staged[i].turn, staged[i].tokens, staged[i].bytes, o.gen,
                              NULL, 0) < 0) {
            import_unstage(st, s->id, staged + i, n_staged - i, o.gen);
            break;
        }
    s->turn_open = o.turn_open;
    s->has_chat = o.has_chat;
    s->turns = o.turns;
    s->gen = o.gen;
    free(s->last_in);
    s->last_in = in;
    s->n_last_in = o.n_in;
    s->last_flags = o.last_flags;
    in = NULL;
    srv_sess_pg_set(s, pg, o.pg_text, o.pg_reply);
    pg = NULL;
    s->last_used = o.last_used;
    srv_sess_ctx_free(&s->prep);
    old = s->ctx;
    s->ctx = c;
    memset(&c, 0, sizeof c);
    if (reserved) {
        s->mem_bytes = 0;
        reserved = 0; /* the reservation became the session's */
    }
    if (st->dirfd >= 0) {
        srv_sess_disk_written(st, s, wlen);
        s->dirty = 0;
    } else {
        s->dirty = 1;
    }
    pthread_mutex_unlock(&st->mu);
done:
    free(in);
    free(pg);
    free(staged);
    srv_sess_ctx_free(&c);
    srv_sess_ctx_free(&old);
    srv_sess_ctx_free(&scratch);
    pthread_mutex_lock(&st->mu);
    if (reserved)
        st->n_mem--;
    srv_sess_refresh(st, s);
    s->tick = ++st->tick;
    srv_sess_give_back(st, s);
    srv_sess_make_room(st, 0, NULL, 0);
    srv_sess_trim_disk(st, s, NULL, 0);
    pthread_mutex_unlock(&st->mu);
out:
    return rc;
}
