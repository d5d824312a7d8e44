/* server/store/store_impl.h — private to the session store's files
 * (server/store/store*.c but store_redis.c): the session table's
 * structures and the functions they share. Nothing else includes it.
 *
 * The files are layers: each calls only the ones declared before its own
 * section below (store_base.c, store_codec.c, store_dir.c, store_table.c,
 * then store_turns.c and store_remote.c, which do not call each other,
 * then store_transfer.c and store.c, the public calls on top). So the
 * codec knows no file and no table, the directory no session, and nothing
 * below store.c calls a public srv_store_* call of another file
 * (scripts/check_cycles.py fails a circle).
 *
 * Locking as store_table.c says: st->mu guards the table and every
 * session's bookkeeping; "caller holds mu" below means it. A session marked
 * busy is the holder's to read and change outside mu (its context, its
 * blob).
 */
#ifndef DARKSERVE_SERVER_STORE_IMPL_H
#define DARKSERVE_SERVER_STORE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/state.h"
#include "server/store/store.h"
#include "server/store/store_backend.h"

#define ID_LEN SRV_SESSION_ID_LEN
/* Owner section of a session blob: u32 version, u32 flags (bit 0 turn_open:
 * an assistant turn, bit 1 has_chat, bit 2 turn_open: a user turn holding
 * system text; servers before that bit find such a section invalid and
 * read the session as one without the store's section), i64 created, i64 last_used; version 2 adds the owner tag:
 * 32 lowercase hex chars, or 32 zero bytes for none; version 3 adds the
 * turns: u64 turns so far, u32 the last turn's SRV_TURN_* flags (bit 2: its
 * input was kept), u32 n, i32 its input[n] (n <= SRV_TURN_INPUT_MAX);
 * version 4 adds the pending grammar (srv_session_pending_grammar): u32 t,
 * u32 r, then its text[t] and its reply[r] (t = 0: none, and r = 0;
 * t + r <= SRV_PENDING_GRAMMAR_MAX); version 5 adds u64 the checkpoint
 * generation (see "Generations" below), written only when it is not 0, so
 * a session that was never imported keeps a version 4 section, byte for
 * byte. Versions 1 (24 bytes, no owner), 2 (56 bytes, no turns), 3 (no
 * pending grammar) and 4 (generation 0) are still read.
 *
 * Generations: the checkpoint files that belong to a session file are those
 * whose name carries the generation its owner section holds: "<id>.<t>" for
 * generation 0, "<id>.<t>.<g>" for g > 0. An import, the one change that
 * replaces a session's whole set of checkpoints, writes the new set under a
 * new generation's names (nothing of the old set is touched), then renames
 * the new session file into place: that rename is the commit, and startup
 * deletes the files of any other generation than their session file's, so
 * a crash at any step leaves the old set or the new one, never a mix. An
 * import into a session without checkpoints whose new ones are all at or
 * past its turn count (a new session's) keeps the generation: no old file
 * is left to delete, no name is taken, and startup deletes checkpoints at
 * or past their session file's turn count. */
#define OWNER_BYTES_V1 24
#define OWNER_BYTES_V2 56
#define OWNER_BYTES_V3 72 /* without the input */
#define OWNER_VERSION 5u
#define OWNER_LEN SRV_SESSION_OWNER_LEN
#define TURN_KEPT 4u /* last-turn flag: its input is in the record */
/* "<id>.<turns>.<generation>" and its NUL */
#define CKPT_NAME_MAX (ID_LEN + 1 + 20 + 1 + 20 + 1)
/* Pending tokens of a checkpoint an export carries at most (a state left
 * with more, by a prefill cut short, stays out of exports): so an import
 * body is bounded by about (1 + K) states, not (1 + K) times the 2^24
 * pending tokens a blob may hold. */
#define CKPT_PENDING_MAX ((size_t)1 << 16)

_Static_assert(OWNER_BYTES_V3 + 4 * (size_t)SRV_TURN_INPUT_MAX <= CORE_STATE_MAX_OWNER,
               "the last turn's input fits the owner section");
_Static_assert(OWNER_BYTES_V3 + 4 * (size_t)SRV_TURN_INPUT_MAX + 8 + SRV_PENDING_GRAMMAR_MAX + 8 <=
                   CORE_STATE_MAX_OWNER,
               "the pending grammar and the generation fit the owner section beside the input");
_Static_assert(SRV_STORE_MAX_CHECKPOINTS <= CORE_STATE_MAX_CHECKPOINTS, "export carries them");

/* A checkpoint file of a session (in the directory). */
typedef struct ckpt {
    int64_t turn;   /* the state after this many turns */
    int64_t tokens; /* its history length */
    size_t bytes;   /* its file's size, counted in st->disk_bytes */
    uint64_t gen;   /* the generation its name carries */
} ckpt_t;

struct srv_session {
    srv_store_t *st;
    char id[ID_LEN + 1];
    char owner[OWNER_LEN + 1]; /* "" = none */
    srv_seq_ctx_t ctx;         /* ctx.state == NULL: not in memory */
    int64_t created, last_used;
    uint64_t tick;      /* LRU order: larger = used more recently */
    int64_t tokens;     /* cached history length */
    size_t state_bytes; /* cached blob size */
    size_t mem_bytes;   /* counted in st->mem_bytes while in memory */
    size_t disk_bytes;  /* size of its file, counted in st->disk_bytes while on_disk */
    int busy, io, on_disk, dirty, turn_open, has_chat;
    int dirty0;        /* dirty before a turn or a redo began (an abort restores it) */
    int64_t turns;     /* turns so far (in its file) */
    uint64_t gen;      /* its checkpoints' generation (in its file) */
    uint64_t gen_used; /* the highest generation an import began to write */
    ckpt_t *ckpt;      /* [n_ckpt] its checkpoint files, oldest first, each turn < turns */
    size_t n_ckpt, cap_ckpt;
    /* the last turn (for a redo): in memory with the context, in the file */
    unsigned last_flags; /* SRV_TURN_* | TURN_KEPT */
    int32_t *last_in;    /* [n_last_in] when TURN_KEPT */
    size_t n_last_in;
    /* the pending grammar: its sizes (kept while evicted, for info), and
     * text ++ reply in pg (in memory with the context; NULL when none) */
    size_t pg_text, pg_reply;
    unsigned char *pg;
    /* the turn in progress (srv_store_turn_begin .. release) */
    int in_turn;
    int turn_link;           /* its release links the file (the state before it) as a checkpoint */
    int64_t turns0, tokens0; /* at its start: the count, the history length */
    size_t bytes0;           /* and the blob size (of the file when it is current) */
    unsigned prev_flags;     /* the last turn before it (put back when it is undone) */
    int32_t *prev_in;
    size_t n_prev_in;
    /* a redo: the checkpoint read back (prep, for prep_turns turns), then
     * the context it replaced until the release (aside) */
    srv_seq_ctx_t prep, aside;
    int64_t prep_turns;
    int prep_turn_open, prep_has_chat, aside_turn_open, aside_has_chat;
    int redo;
    /* shared stores (store_remote.c): on_disk means "saved in the
     * backend", disk_bytes its blob's size */
    uint64_t version; /* the backend's version the memory copy (or the metadata) is of */
    char token[SRV_STORE_TOKEN_MAX]; /* the lease held while busy (leased) */
    int leased;
    int fetched;         /* held by srv_store_fetch until an acquire_in_memory takes it */
    int64_t fetched_ms;  /* since when (monotonic ms) */
    int64_t tokens_held; /* history length when acquired (a release without persist that
                            changed it drops the copy) */
};

struct srv_store {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *dir; /* NULL: memory only */
    int dirfd; /* -1 when memory only */
    int lockfd;
    size_t max_sessions, max_bytes;
    size_t max_disk_files, max_disk_bytes;
    size_t max_ckpt;     /* checkpoints kept per session (0 without a directory) */
    size_t n_ckpt_files; /* checkpoint files, counted with max_disk_files */
    int64_t ttl_s;
    core_model_t *model;
    core_attn_t *attn;
    char fp[CORE_STATE_FINGERPRINT_MAX + 1];
    int n_vocab;
    size_t max_blob;      /* any session file */
    size_t max_ckpt_blob; /* a checkpoint an export carries */
    size_t max_export;    /* an export: a session and max_ckpt checkpoints */
    srv_session_t **tab;  /* [n] sorted by id */
    size_t n, cap;
    size_t n_mem; /* in memory, plus loads in progress */
    size_t n_disk;
    size_t disk_bytes; /* sum of the files' sizes */
    uint64_t disk_evicted;
    size_t mem_bytes;
    uint64_t tick;
    srv_store_write_fn write_fn;
    void *write_ud;
    srv_store_fault_fn fault_fn;
    void *fault_ud;
    pthread_t no_io_thread; /* srv_store_no_io_here */
    int has_no_io;
    atomic_int unsettled;    /* bounds left exceeded on the no-I/O thread */
    srv_store_backend_t *be; /* a shared store (owned); NULL: directory or memory */
};

typedef struct owner {
    int64_t created, last_used;
    int turn_open, has_chat;
    char owner[OWNER_LEN + 1];
    int64_t turns;
    unsigned last_flags;     /* SRV_TURN_* | TURN_KEPT */
    const unsigned char *in; /* [4 * n_in] the last turn's input (little-endian), borrowed */
    size_t n_in;
    const unsigned char *pg; /* [pg_text + pg_reply] the pending grammar, borrowed; NULL: none */
    size_t pg_text, pg_reply;
    uint64_t gen; /* the checkpoint generation */
} owner_t;

/* A session file's metadata with a copy of its last turn's input. */
typedef struct meta {
    owner_t o;         /* o.in is not valid; o.pg is pg */
    int have;          /* the file had a readable owner section */
    int32_t *in;       /* malloc'd [o.n_in], NULL if none */
    unsigned char *pg; /* malloc'd pending grammar, NULL if none */
} meta_t;

/* ---- store_base.c: errors and ids ---- */

/* printf-style detail into err[errlen] (err may be NULL). */
void srv_store_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Writes the detail into err[errlen] and yields code; spelled as an
 * expression so static analysis sees every failure path return nonzero.
 * code is evaluated after the message (which may clobber errno): pass a
 * value, not errno. */
#define STORE_FAIL(err, errlen, code, ...) (srv_store_errf((err), (errlen), __VA_ARGS__), (code))
/* strerror_r's message for errno e (in buf[n] or static). */
const char *srv_sess_errstr(int e, char *buf, size_t n);
/* n random bytes into buf. SRV_STORE_EIO without randomness. */
int srv_sess_random_bytes(void *buf, size_t n, char *err, size_t errlen);
/* A fresh random id (128 bits). SRV_STORE_EIO without randomness. */
int srv_sess_new_id(char id[ID_LEN + 1], char *err, size_t errlen);

/* ---- store_codec.c: contexts, the owner section, blobs ---- */

/* Contexts: freed (zeroed), a fresh empty one, an independent copy, the
 * memory one takes, the history length. */
void srv_sess_ctx_free(srv_seq_ctx_t *c);
int srv_sess_ctx_new(srv_store_t *st, srv_seq_ctx_t *c, char *err, size_t errlen);
int srv_sess_ctx_copy(srv_store_t *st, const srv_seq_ctx_t *src, srv_seq_ctx_t *c, char *err,
                      size_t errlen);
size_t srv_sess_ctx_bytes(const srv_seq_ctx_t *c);
int64_t srv_sess_ctx_tokens(const srv_seq_ctx_t *c);
/* 1 if s is "" or OWNER_LEN lowercase hex chars. */
int srv_sess_owner_tag_valid(const char *s);
/* The owner section p[n] parsed into *o (o->in, o->pg borrow p): 0, or -1. */
int srv_sess_owner_parse(const void *p, size_t n, owner_t *o);
/* Bytes of the owner section with n_in input tokens, a pending grammar of
 * pg_len bytes and generation gen. */
size_t srv_sess_owner_bytes(size_t n_in, size_t pg_len, uint64_t gen);
/* The metadata of session s as its file holds it (borrowing s's input). */
owner_t srv_sess_owner_of(const srv_session_t *s);
/* Malloc'd copies of the input ids o->in and of the pending grammar o->pg
 * (NULL when there are none). */
int srv_sess_owner_input(const owner_t *o, int32_t **out, char *err, size_t errlen);
int srv_sess_owner_pg(const owner_t *o, unsigned char **out, char *err, size_t errlen);
/* The blob of context c with metadata o (new malloc'd *out); in[n_in] the
 * last turn's input (o->in is not used), parts[n_parts] its checkpoints
 * (an export); id names the session in messages. */
int srv_sess_serialize_meta(const srv_store_t *st, const char *id, const owner_t *o,
                            const int32_t *in, size_t n_in, const srv_seq_ctx_t *c,
                            const core_state_part_t *parts, size_t n_parts, unsigned char **out,
                            size_t *len, char *err, size_t errlen);
/* The blob of held session s with context c (s->ctx: srv_sess_serialize;
 * new malloc'd *out). */
int srv_sess_serialize_ctx(const srv_store_t *st, const srv_session_t *s, const srv_seq_ctx_t *c,
                           unsigned char **out, size_t *len, char *err, size_t errlen);
int srv_sess_serialize(const srv_store_t *st, const srv_session_t *s, unsigned char **out,
                       size_t *len, char *err, size_t errlen);
/* Blob b[len] restored into context c (unchanged on error) and its owner
 * section into *o (*have_owner = 1 when it has one this store reads).
 * EMISMATCH (the blob is not for here or is damaged), ENOMEM. */
int srv_sess_restore(srv_store_t *st, const unsigned char *b, size_t len, srv_seq_ctx_t *c,
                     owner_t *o, int *have_owner, char *err, size_t errlen);
/* A blob (borrowed) loaded into a fresh context *c and its metadata *m
 * (may be NULL; free with srv_sess_meta_free); what names it in messages.
 * EIO for a blob that does not load here (damaged, another model), ENOMEM. */
int srv_sess_load_blob(srv_store_t *st, const unsigned char *buf, size_t len, const char *what,
                       srv_seq_ctx_t *c, meta_t *m, char *err, size_t errlen);
void srv_sess_meta_free(meta_t *m);
/* The largest blobs of attention configuration c: any session file
 * (*blob), a checkpoint an export carries (*ckpt), an export with n_ckpt
 * checkpoints (*export). */
void srv_sess_blob_bounds(const core_attn_cfg_t *c, size_t n_ckpt, size_t *blob, size_t *ckpt,
                          size_t *export);
/* The owner section of blob b[len] (which core_state_load accepted): 0 and
 * *o, or -1 when it has none this store reads. */
int srv_sess_blob_owner(const unsigned char *b, size_t len, owner_t *o);
/* 0 when o has no pending grammar, or one that compiles and whose reply
 * follows it; else EMISMATCH ("the pending ...: why"), ENOMEM. */
int srv_sess_owner_pg_check(const owner_t *o, char *err, size_t errlen);
/* The checkpoints of a client's blob (which core_state_verify accepted),
 * checked before an import changes anything; scratch a context to load
 * them into, turns the blob's own count; *first = the first of the newest
 * max_ckpt, which are kept, *first_turn its turn count (INT64_MAX: none is
 * kept). EMISMATCH with the reason, ENOMEM. */
int srv_sess_blob_check(srv_store_t *st, const unsigned char *blob, size_t len, int64_t turns,
                        srv_seq_ctx_t *scratch, size_t *first, int64_t *first_turn, char *err,
                        size_t errlen);

/* ---- store_dir.c: the session directory ---- */

/* A file the startup scan found. */
typedef struct srv_found {
    char id[ID_LEN + 1];
    int64_t turn;   /* -1: a session file; else a checkpoint file's turns */
    uint64_t gen;   /* a checkpoint: the generation its name carries */
    int ok;         /* a checkpoint: a whole blob for this model and attention (by its header) */
    int64_t tokens; /* history length (by its header) */
    size_t bytes;   /* the file's size */
    owner_t o;      /* a session file: its owner section, or times from its mtime when it has
                       none; o.in and o.pg are NULL */
} srv_found_t;

/* 0, or the errno an injected fault makes op fail with (errno set too). */
int srv_sess_fault(const srv_store_t *st, const char *op);
/* SRV_STORE_ENOSPACE for a full or read-only file system (errno e), else EIO. */
int srv_sess_io_code(int e);
/* Atomic replace of file id (a session's or a checkpoint's name); link_as
 * (NULL: none) hard-links the previous file under that name first. */
int srv_sess_write_file_link(srv_store_t *st, const char *id, const unsigned char *buf, size_t len,
                             const char *link_as, int *linked, char *err, size_t errlen);
int srv_sess_write_file(srv_store_t *st, const char *id, const unsigned char *buf, size_t len,
                        char *err, size_t errlen);
/* Whole file id (new malloc'd *out). ENOTFOUND if it is gone, EIO else. */
int srv_sess_read_file(srv_store_t *st, const char *id, unsigned char **out, size_t *len, char *err,
                       size_t errlen);
/* Session file name loaded into a fresh context *c, its metadata into *m. */
int srv_sess_load_file(srv_store_t *st, const char *name, srv_seq_ctx_t *c, meta_t *m, char *err,
                       size_t errlen);
/* File name deleted (fault point "unlink"; gone already is fine), deleted
 * best effort (no fault point), renamed over another (fault point
 * "rename", then the directory synced), and whether it exists. */
int srv_sess_dir_unlink(srv_store_t *st, const char *name, char *err, size_t errlen);
void srv_sess_dir_remove(srv_store_t *st, const char *name);
int srv_sess_dir_rename(srv_store_t *st, const char *from, const char *to, char *err,
                        size_t errlen);
int srv_sess_dir_exists(const srv_store_t *st, const char *name);
/* "<id>.<turn>" (generation 0) or "<id>.<turn>.<gen>", the name of a
 * checkpoint file. */
void srv_sess_ckpt_name(char out[CKPT_NAME_MAX], const char *id, int64_t turn, uint64_t gen);
/* Opens st->dir: creates it, locks it, deletes temp files, and lists the
 * session and checkpoint files of this model into *found[*n] (malloc'd,
 * the caller frees it). */
int srv_sess_open_dir(srv_store_t *st, srv_found_t **found, size_t *n, char *err, size_t errlen);

/* ---- store_table.c: the table, memory, disk, checkpoint bookkeeping ---- */

/* The table (caller holds mu): the first index whose id is >= id (strict =
 * 0) or > id (strict = 1), find, room for one more, insert, remove. */
size_t srv_sess_tab_bound(const srv_store_t *st, const char *id, int strict);
srv_session_t *srv_sess_tab_find(const srv_store_t *st, const char *id);
int srv_sess_tab_reserve(srv_store_t *st, char *err, size_t errlen);
int srv_sess_tab_insert(srv_store_t *st, srv_session_t *s, char *err, size_t errlen);
void srv_sess_tab_remove(srv_store_t *st, const srv_session_t *s);
/* Waits while s is under store I/O (caller holds mu): s, or NULL. */
srv_session_t *srv_sess_find_settled(srv_store_t *st, const char *id);
/* Caller holds mu: takes session id for a store operation (busy);
 * srv_sess_give_back: s is no longer busy (waiters wake). */
int srv_sess_take(srv_store_t *st, const char *id, srv_session_t **out, char *err, size_t errlen);
void srv_sess_give_back(srv_store_t *st, srv_session_t *s);
/* s as srv_store_info describes it (caller holds mu). */
void srv_sess_fill_info(const srv_session_t *s, srv_session_info_t *o);
/* A fork's session ns starts as src's copy: busy, dirty, new times, src's
 * turn flags, and owner (NULL: src's). */
void srv_sess_fork_init(srv_store_t *st, srv_session_t *ns, const srv_session_t *src,
                        const char *owner);
/* Caller holds mu: the session's entry and memory are gone from the table
 * (nothing else: no file, no backend); s is freed. */
void srv_sess_forget(srv_store_t *st, srv_session_t *s);
/* s's pending grammar becomes pg (owned; text[t] ++ reply[r]; NULL: none). */
void srv_sess_pg_set(srv_session_t *s, unsigned char *pg, size_t t, size_t r);
/* Caller holds mu: re-reads the size and token count of s in memory. */
void srv_sess_refresh(srv_store_t *st, srv_session_t *s);
/* Caller holds mu: frees s's context and its accounting. */
void srv_sess_drop_memory(srv_store_t *st, srv_session_t *s);
/* Caller holds mu: writing s failed; back to its file (tokens and size as
 * they were), or kept in memory to be written later when it has none. */
void srv_sess_revert(srv_store_t *st, srv_session_t *s, int64_t tokens, size_t state_bytes);
/* Caller holds mu: s's saved copy is now len bytes; s's file is gone. */
void srv_sess_disk_written(srv_store_t *st, srv_session_t *s, size_t len);
void srv_sess_disk_gone(srv_store_t *st, srv_session_t *s);
/* Caller holds mu, s idle: removes s (file first, so a failure keeps it). */
int srv_sess_remove_session(srv_store_t *st, srv_session_t *s, char *err, size_t errlen);
/* Caller holds mu: s's checkpoint file for `turn` turns (generation gen)
 * exists / is no longer s's (index k; the file is gone or became another) /
 * is to be deleted (index k) / every one from index k on, best effort / the
 * oldest past max_ckpt, best effort. */
int srv_sess_ckpt_add(srv_store_t *st, srv_session_t *s, int64_t turn, int64_t tokens, size_t bytes,
                      uint64_t gen, char *err, size_t errlen);
void srv_sess_ckpt_forget(srv_store_t *st, srv_session_t *s, size_t k);
int srv_sess_ckpt_delete(srv_store_t *st, srv_session_t *s, size_t k, char *err, size_t errlen);
void srv_sess_ckpt_drop_from(srv_store_t *st, srv_session_t *s, size_t k);
void srv_sess_ckpt_prune(srv_store_t *st, srv_session_t *s);
/* Is the caller the thread that must not wait for the disk? */
int srv_sess_no_io_here(const srv_store_t *st);
/* Caller holds mu, s idle and in memory: writes s, under the io mark (mu
 * released around the write). */
int srv_sess_write_marked(srv_store_t *st, srv_session_t *s, char *err, size_t errlen);
/* Caller holds mu: evicts until `need` more sessions fit (EFULL else). */
int srv_sess_make_room(srv_store_t *st, size_t need, char *err, size_t errlen);
/* Caller holds mu: deletes until the directory's budgets hold (keep: the
 * session whose write called this, never deleted itself). */
int srv_sess_trim_disk(srv_store_t *st, const srv_session_t *keep, char *err, size_t errlen);
/* The table built from the files srv_sess_open_dir found (f[n], sorted
 * here, still the caller's); deletes the checkpoint files no session file
 * reaches. */
int srv_sess_table_load(srv_store_t *st, srv_found_t *f, size_t n, char *err, size_t errlen);

/* ---- store_turns.c: turns and checkpoints ---- */

/* Caller holds mu: the turn s opened is over (abort = 1 undoes it); a
 * redo ends (undo = 1 puts back the state it replaced). */
void srv_sess_turn_end(srv_store_t *st, srv_session_t *s, int abort);
void srv_sess_redo_end(srv_store_t *st, srv_session_t *s, int undo);

/* ---- store_remote.c: the remote mode's side of the srv_store_* calls ---- */

/* srv_store_acquire (from_backend = 1) and srv_store_acquire_in_memory. */
int srv_sess_remote_acquire(srv_store_t *st, const char *id, int from_backend, srv_session_t **out,
                            char *err, size_t errlen);
/* srv_store_release's save of held session s (its blob buf[len]): 0, or
 * the backend's error. Not under mu. */
int srv_sess_remote_save(srv_store_t *st, srv_session_t *s, const unsigned char *buf, size_t len,
                         char *err, size_t errlen);
/* srv_store_release's end for s (caller holds mu, s still busy): drops the
 * lease unless the save dropped it, and the memory copy when it is not
 * what the backend holds (persist = 0 after a change). */
void srv_sess_remote_released(srv_store_t *st, srv_session_t *s, int persist, int saved);
int srv_sess_remote_delete(srv_store_t *st, const char *id, char *err, size_t errlen);
int srv_sess_remote_fork(srv_store_t *st, const char *id, const char *owner,
                         char new_id[SRV_SESSION_ID_LEN + 1], char *err, size_t errlen);
int srv_sess_remote_export(srv_store_t *st, const char *id, void **blob, size_t *len, char *err,
                           size_t errlen);
int srv_sess_remote_import(srv_store_t *st, const char *id, const void *blob, size_t len, char *err,
                           size_t errlen);
int srv_sess_remote_list(srv_store_t *st, const char *owner, const char *after, size_t limit,
                         srv_session_info_t *out, size_t *n, int *has_more, char *err,
                         size_t errlen);
/* srv_store_sweep (caller holds mu): drops idle copies unused for ttl_s,
 * gives back fetched sessions nobody took. */
void srv_sess_remote_sweep(srv_store_t *st, int64_t now);

#endif
