/* server/store/store_turns.c — turns and checkpoints (server/store/store.h "Turns
 * and checkpoints"): opening and ending a turn, rollback, and redo
 * (regenerate).
 *
 * It calls the table, the directory and the codec below it, never the
 * public calls of store.c (store_impl.h says who calls whom).
 */
#include "server/store/store.h"
#include "server/store/store_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

/* ---- checkpoints ---- */

/* Index of s's checkpoint for `turn` turns, or -1. */
static ssize_t ckpt_find(const srv_session_t *s, int64_t turn)
{
    for (size_t k = 0; k < s->n_ckpt; k++)
        if (s->ckpt[k].turn == turn)
            return (ssize_t)k;
    return -1;
}

/* "after turns a..b" of s's checkpoints, for messages. */
static const char *ckpt_range(const srv_session_t *s, char *buf, size_t n)
{
    if (s->n_ckpt == 0 && s->st->be)
        snprintf(buf, n, "sessions in a shared store keep none");
    else if (s->n_ckpt == 0)
        snprintf(buf, n, "it keeps none");
    else if (s->n_ckpt == 1)
        snprintf(buf, n, "it keeps one, after %lld turn%s", (long long)s->ckpt[0].turn,
                 s->ckpt[0].turn == 1 ? "" : "s");
    else
        snprintf(buf, n, "it keeps them after %lld to %lld turns", (long long)s->ckpt[0].turn,
                 (long long)s->ckpt[s->n_ckpt - 1].turn);
    return buf;
}

/* ---- turns ---- */

/* Caller holds mu: the turn s opened is over; abort = 1 undoes it (its
 * count and last-turn record go back). */
void srv_sess_turn_end(srv_store_t *st, srv_session_t *s, int abort)
{
    if (!s->in_turn)
        return;
    if (abort) {
        s->turns = s->turns0;
        free(s->last_in);
        s->last_in = s->prev_in;
        s->n_last_in = s->n_prev_in;
        s->last_flags = s->prev_flags;
        s->dirty = s->dirty0;
    } else {
        free(s->prev_in);
    }
    s->prev_in = NULL;
    s->n_prev_in = 0;
    s->in_turn = 0;
    s->turn_link = 0;
    srv_sess_refresh(st, s);
}

/* Caller holds mu: a redo ends; undo = 1 puts back the state it replaced,
 * else that state is dropped (the redo was written, or reverted to the
 * file). */
void srv_sess_redo_end(srv_store_t *st, srv_session_t *s, int undo)
{
    if (!s->redo)
        return;
    if (undo && s->aside.state) {
        srv_sess_ctx_free(&s->ctx);
        s->ctx = s->aside;
        memset(&s->aside, 0, sizeof s->aside);
        s->turn_open = s->aside_turn_open;
        s->has_chat = s->aside_has_chat;
        s->dirty = s->dirty0;
    }
    srv_sess_ctx_free(&s->aside);
    s->redo = 0;
    srv_sess_refresh(st, s);
}

int srv_store_turn_begin(srv_store_t *st, srv_session_t *s, const int32_t *input, size_t n,
                         unsigned flags, char *err, size_t errlen)
{
    if (!s || !s->busy || s->in_turn || (n && !input))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                          "turn begin: session not held, or a turn is open");
    const int keep = n <= SRV_TURN_INPUT_MAX;
    int32_t *in = NULL;
    if (keep && n) {
        in = malloc(n * sizeof *in);
        if (!in)
            return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for a turn's input");
        memcpy(in, input, n * sizeof *in);
    }
    pthread_mutex_lock(&st->mu);
    s->in_turn = 1;
    s->turns0 = s->turns;
    s->tokens0 = srv_sess_ctx_tokens(&s->ctx);
    s->bytes0 = s->state_bytes;
    s->dirty0 = s->dirty;
    /* the file holds the state as it is now: the turn's checkpoint */
    s->turn_link = st->max_ckpt > 0 && s->on_disk && !s->dirty && !s->redo;
    s->prev_flags = s->last_flags;
    s->prev_in = s->last_in;
    s->n_prev_in = s->n_last_in;
    s->last_in = in;
    s->n_last_in = keep ? n : 0;
    s->last_flags = (flags & (SRV_TURN_REPLY | SRV_TURN_CHAT)) | (keep ? TURN_KEPT : 0u);
    s->turns++;
    s->dirty = 1;
    srv_sess_ctx_free(&s->prep);
    srv_sess_refresh(st, s);
    pthread_mutex_unlock(&st->mu);
    return 0;
}

/* ---- rollback ---- */

/* Caller holds mu and s: the checkpoint of s for `turn` turns (index *k),
 * or ENOCKPT saying why not; what names the request in the message. */
static int ckpt_for(const srv_session_t *s, int64_t turn, const char *what, ssize_t *k, char *err,
                    size_t errlen)
{
    char r[96];
    if (turn < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOCKPT,
                          "session %s has had %lld turn%s: %s cannot go "
                          "back further (%s)",
                          s->id, (long long)s->turns, s->turns == 1 ? "" : "s", what,
                          ckpt_range(s, r, sizeof r));
    *k = ckpt_find(s, turn);
    if (*k < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOCKPT,
                          "session %s has no checkpoint after %lld turn%s "
                          "for %s (%s)",
                          s->id, (long long)turn, turn == 1 ? "" : "s", what,
                          ckpt_range(s, r, sizeof r));
    return 0;
}

int srv_store_rollback(srv_store_t *st, const char *id, int64_t n, srv_session_info_t *info,
                       char *err, size_t errlen)
{
    if (!srv_session_id_valid(id))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                          "malformed session id (expected 32 lowercase hex chars)");
    if (n < 1)
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL, "a rollback goes back at least one turn");
    srv_session_t *s = NULL;
    ssize_t k = -1;
    pthread_mutex_lock(&st->mu);
    int rc = srv_sess_take(st, id, &s, err, errlen);
    if (rc == 0 &&
        (rc = ckpt_for(s, n > s->turns ? -1 : s->turns - n, "a rollback", &k, err, errlen)) < 0)
        srv_sess_give_back(st, s);
    pthread_mutex_unlock(&st->mu);
    if (rc < 0)
        return rc;
    const ckpt_t ck = s->ckpt[k];
    const int in_mem = s->ctx.state != NULL;
    char name[CKPT_NAME_MAX];
    srv_sess_ckpt_name(name, id, ck.turn, ck.gen);
    /* read and checked whole before anything changes */
    srv_seq_ctx_t c;
    meta_t m;
    rc = srv_sess_load_file(st, name, &c, &m, err, errlen);
    /* the commit: the checkpoint's file becomes the session's */
    if (rc == 0 && (rc = srv_sess_dir_rename(st, name, id, err, errlen)) < 0) {
        srv_sess_ctx_free(&c);
        srv_sess_meta_free(&m);
    }
    srv_seq_ctx_t old = {0};
    int32_t *old_in = NULL;
    unsigned char *old_pg = NULL;
    pthread_mutex_lock(&st->mu);
    if (rc == SRV_STORE_ENOTFOUND) { /* the file went behind our back */
        srv_sess_ckpt_forget(st, s, (size_t)k);
        rc = STORE_FAIL(err, errlen, SRV_STORE_ENOCKPT, "the checkpoint file %s/%s is gone",
                        st->dir, name);
    }
    if (rc == 0) {
        /* the checkpoint's file is the session's now */
        srv_sess_ckpt_forget(st, s, (size_t)k);
        srv_sess_disk_written(st, s, ck.bytes);
        srv_sess_ckpt_drop_from(st, s, (size_t)k);
        s->turns = ck.turn;
        s->turn_open = m.have ? m.o.turn_open : 0;
        s->has_chat = m.have ? m.o.has_chat : 0;
        s->tokens = ck.tokens;
        s->state_bytes = ck.bytes;
        s->dirty = 0;
        s->last_used = (int64_t)time(NULL); /* in memory; the file keeps the checkpoint's */
        srv_sess_ctx_free(&s->prep);
        if (in_mem) {
            old = s->ctx;
            s->ctx = c;
            old_in = s->last_in;
            s->last_in = m.in;
            s->n_last_in = m.o.n_in;
            s->last_flags = m.have ? m.o.last_flags : 0;
            old_pg = s->pg;
            s->pg = NULL;
            srv_sess_pg_set(s, m.pg, m.o.pg_text, m.o.pg_reply);
            srv_sess_refresh(st, s);
        } else {
            /* the file has it: only its sizes, for info */
            s->pg_text = m.o.pg_text;
            s->pg_reply = m.o.pg_reply;
            srv_sess_ctx_free(&c);
            srv_sess_meta_free(&m);
        }
        if (info)
            srv_sess_fill_info(s, info);
    }
    s->tick = ++st->tick;
    srv_sess_give_back(st, s);
    pthread_mutex_unlock(&st->mu);
    srv_sess_ctx_free(&old);
    free(old_in);
    free(old_pg);
    return rc;
}

/* ---- redo ---- */

int srv_store_redo_prepare(srv_store_t *st, const char *id, char *err, size_t errlen)
{
    if (!srv_session_id_valid(id))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                          "malformed session id (expected 32 lowercase hex chars)");
    srv_session_t *s = NULL;
    ssize_t k = -1;
    pthread_mutex_lock(&st->mu);
    int rc = srv_sess_take(st, id, &s, err, errlen);
    if (rc == 0) {
        if (!s->ctx.state)
            rc = STORE_FAIL(err, errlen, SRV_STORE_EEVICTED, "session %s is on disk, not in memory",
                            id);
        else if (s->turns == 0)
            rc = STORE_FAIL(err, errlen, SRV_STORE_ENOCKPT, "session %s has no turn to regenerate",
                            id);
        else if (!(s->last_flags & SRV_TURN_REPLY))
            rc = STORE_FAIL(err, errlen, SRV_STORE_ENOCKPT,
                            "the last turn of session %s generated no reply "
                            "to regenerate (it only added input)",
                            id);
        else if (!(s->last_flags & TURN_KEPT))
            rc = STORE_FAIL(err, errlen, SRV_STORE_ENOCKPT,
                            "the last turn of session %s had more than %d "
                            "input tokens, which are not kept for a regenerate; roll it back "
                            "and send it again",
                            id, SRV_TURN_INPUT_MAX);
        else
            rc = ckpt_for(s, s->turns - 1, "a regenerate", &k, err, errlen);
        if (rc < 0)
            srv_sess_give_back(st, s);
    }
    pthread_mutex_unlock(&st->mu);
    if (rc < 0)
        return rc;
    char name[CKPT_NAME_MAX];
    srv_sess_ckpt_name(name, id, s->ckpt[k].turn, s->ckpt[k].gen);
    srv_seq_ctx_t c;
    meta_t m;
    rc = srv_sess_load_file(st, name, &c, &m, err, errlen);
    srv_sess_meta_free(&m);
    pthread_mutex_lock(&st->mu);
    if (rc == SRV_STORE_ENOTFOUND) {
        srv_sess_ckpt_forget(st, s, (size_t)k);
        rc = STORE_FAIL(err, errlen, SRV_STORE_ENOCKPT, "the checkpoint file %s/%s is gone",
                        st->dir, name);
    }
    if (rc == 0) {
        srv_sess_ctx_free(&s->prep);
        s->prep = c;
        s->prep_turns = s->turns;
        s->prep_turn_open = m.have ? m.o.turn_open : 0;
        s->prep_has_chat = m.have ? m.o.has_chat : 0;
        srv_sess_refresh(st, s);
    }
    s->tick = ++st->tick;
    srv_sess_give_back(st, s);
    srv_sess_make_room(st, 0, NULL, 0);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int srv_store_redo_begin(srv_store_t *st, srv_session_t *s, char *err, size_t errlen)
{
    pthread_mutex_lock(&st->mu);
    int rc = 0;
    if (!s->busy || s->in_turn || s->redo)
        rc = STORE_FAIL(err, errlen, SRV_STORE_EINVAL, "redo: session not held, or a turn is open");
    else if (!s->prep.state || s->prep_turns != s->turns)
        rc = STORE_FAIL(err, errlen, SRV_STORE_EEVICTED,
                        "session %s: the checkpoint to regenerate from is "
                        "not in memory",
                        s->id);
    if (rc == 0) {
        s->aside = s->ctx;
        s->aside_turn_open = s->turn_open;
        s->aside_has_chat = s->has_chat;
        s->ctx = s->prep;
        memset(&s->prep, 0, sizeof s->prep);
        s->turn_open = s->prep_turn_open;
        s->has_chat = s->prep_has_chat;
        s->tokens0 = s->tokens;
        s->bytes0 = s->state_bytes;
        s->dirty0 = s->dirty;
        s->dirty = 1;
        s->redo = 1;
        srv_sess_refresh(st, s);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}
