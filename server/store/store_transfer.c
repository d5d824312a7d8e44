/* server/store/store_transfer.c — export and import (server/store/store.h): a
 * session's state with its checkpoints as one blob, out and in. An import
 * replaces the state and the whole set of checkpoints at once, atomic
 * across a crash (store.h "Crashes").
 *
 * It calls the table, the directory, the codec and the remote mode below
 * it, never the public calls of store.c (store_impl.h says who calls whom).
 */
#include "server/store/store.h"
#include "server/store/store_impl.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/state.h"

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
            rc = srv_sess_serialize_meta(st, s->id, &o, in, n_in, s->ctx.state ? &s->ctx : &c,
                                         parts, np, &buf, &n, err, errlen);
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
        srv_sess_dir_remove(st, name);
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
            (rc = srv_sess_restore(st, p, pl, scratch, &o, &have, err, errlen)) < 0 || !have ||
            (rc = srv_sess_owner_input(&o, &ids, err, errlen)) < 0) {
            rc = rc < 0 ? rc
                        : STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH,
                                     "checkpoint %zu of the state blob is damaged", i);
            break;
        }
        memcpy(o.owner, s->owner, sizeof o.owner);
        o.created = s->created;
        o.gen = gen;
        char name[CKPT_NAME_MAX];
        srv_sess_ckpt_name(name, s->id, o.turns, gen);
        rc = srv_sess_serialize_meta(st, s->id, &o, ids, o.n_in, scratch, NULL, 0, &buf, &wl, err,
                                     errlen);
        free(ids);
        if (rc == 0)
            rc = srv_sess_write_file(st, name, buf, wl, err, errlen);
        free(buf);
        if (rc == 0)
            out[(*n)++] =
                (staged_t){.turn = o.turns, .tokens = srv_sess_ctx_tokens(scratch), .bytes = wl};
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
    int64_t first_turn = INT64_MAX;
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
    have = srv_sess_blob_owner(blob, len, &o) == 0;
    if ((rc = srv_sess_ctx_new(st, &scratch, err, errlen)) < 0 ||
        (rc = srv_sess_blob_check(st, blob, len, have ? o.turns : 0, &scratch, &first, &first_turn,
                                  err, errlen)) < 0 ||
        (rc = srv_sess_ctx_new(st, &c, err, errlen)) < 0 ||
        (rc = srv_sess_restore(st, blob, len, &c, &o, &have, err, errlen)) < 0)
        goto done;
    if (have && (rc = srv_sess_owner_pg_check(&o, err, errlen)) < 0)
        goto done;
    if (!have) /* a blob without the store's section: a session with no turn yet */
        o = (owner_t){0};
    if ((rc = srv_sess_owner_input(&o, &in, err, errlen)) < 0 ||
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
        if (s->n_ckpt == 0 && first_turn >= s->turns && s->gen_used == s->gen) {
            /* no old set to delete after the commit, and the new one's
             * names are free: the session file's generation stays (its
             * size too), and before the commit the new files are past the
             * old file's turn count, which startup deletes */
            o.gen = s->gen;
        } else {
            /* above any generation whose files a failed import may have left */
            o.gen = (s->gen > s->gen_used ? s->gen : s->gen_used) + 1;
            s->gen_used = o.gen;
        }
        pthread_mutex_unlock(&st->mu);
        if (st->max_ckpt && bi.n_checkpoints > first &&
            !(staged = calloc(bi.n_checkpoints - first, sizeof *staged))) {
            rc = STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for an import");
            goto done;
        }
        if (!staged || (rc = import_stage(st, s, blob, len, first, o.gen, &scratch, staged,
                                          &n_staged, err, errlen)) == 0) {
            rc = srv_sess_serialize_meta(st, s->id, &o, in, o.n_in, &c, NULL, 0, &buf, &wlen, err,
                                         errlen);
            if (rc == 0) /* the commit */
                rc = srv_sess_write_file(st, s->id, buf, wlen, err, errlen);
            free(buf);
            if (rc < 0)
                import_unstage(st, s->id, staged, n_staged, o.gen);
        }
        if (rc < 0) {
            /* files of this generation may be left (if deleting them
             * failed): the next import takes another one */
            pthread_mutex_lock(&st->mu);
            if (s->gen_used < o.gen + 1)
                s->gen_used = o.gen + 1;
            pthread_mutex_unlock(&st->mu);
            goto done;
        }
    }

    pthread_mutex_lock(&st->mu);
    /* the old set belongs to the state the session left: deleted after the
     * commit (what cannot be deleted now, startup deletes) */
    srv_sess_ckpt_drop_from(st, s, 0);
    for (size_t i = 0; i < n_staged; i++)
        if (srv_sess_ckpt_add(st, s, staged[i].turn, staged[i].tokens, staged[i].bytes, o.gen, NULL,
                              0) < 0) {
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
