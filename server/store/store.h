/* server/store/store.h — the session store: every session's compute context,
 * in memory (LRU bounded by count and bytes) and persisted in a directory.
 *
 * A session is a conversation the client continues by id: its attention
 * state, sampler (RNG + penalty history) and pending tokens (server/engine/engine.h,
 * srv_seq_ctx_t), plus a little metadata. Its file in the session directory
 * is the core/state.h blob named by the id, whose owner section holds
 * {created, last_used, turn_open, has_chat, owner tag, turns, the last
 * turn's flags and input, the pending grammar} (and its checkpoints are
 * files beside it, see
 * "Turns and checkpoints"); writes are atomic (temp file,
 * fsync, rename, fsync of the directory), so a crash leaves either the old or
 * the new file, never a torn one. A restarted server finds its sessions in
 * the directory (files for another model are left alone and not listed; a
 * file for this model whose size disagrees with its header, damaged behind
 * the store's back, is listed, and acquiring or exporting it is
 * SRV_STORE_EIO saying it is truncated).
 *
 * ## Busy
 * A session is *busy* while a caller holds it (srv_store_create /
 * srv_store_acquire until srv_store_release) and while fork / export /
 * import work on it. Another acquire, delete, fork, export or import of a
 * busy session fails with SRV_STORE_EBUSY (HTTP 409). The store's own
 * maintenance (eviction, flush) never makes a session busy: a caller that
 * meets it waits for that one write to finish (srv_store_acquire_in_memory
 * does not wait: see there).
 *
 * ## Memory
 * max_sessions bounds the sessions held in memory, max_bytes their memory
 * (attention state + pending + sampler). Past either bound, the least
 * recently used idle sessions are evicted: written (if they changed since
 * their last write) and freed; acquiring one loads it back. Sessions held
 * busy are never evicted, so max_bytes can be exceeded while they are; when
 * max_sessions sessions are all busy (or there is no directory to evict to),
 * creating or loading another is SRV_STORE_EFULL.
 *
 * ## Disk
 * max_disk_files and max_disk_bytes bound the session directory: the number
 * of session files and the sum of their sizes. After a session is written
 * for a caller (release with persist, fork, import), at startup and at every
 * sweep, while either is exceeded the least recently used idle session that
 * has a file is deleted, file and memory, like an expired session. The
 * session just written is never its own victim and busy sessions stay, so
 * the bound can be exceeded while they are; files written by eviction to
 * disk count from the next of those points. Sessions only in memory have no
 * file and do not count until they are written.
 *
 * ## Turns and checkpoints
 * A *turn* is one request that adds to a session's history: the caller
 * opens it with srv_store_turn_begin on the held session before the engine
 * job that ingests or generates, and the release that writes the session
 * closes it (a release without persist undoes it when no job ran). The session
 * counts its turns (kept in its file) and remembers the last turn's input
 * (up to SRV_TURN_INPUT_MAX tokens) and whether it generated a reply, so
 * that the reply can be generated again (srv_store_redo_*).
 * A *checkpoint* is the session's state after some number of turns, kept so
 * that the session can go back to it (srv_store_rollback) without re-reading
 * any history. With a directory and max_checkpoints > 0, the state before
 * each turn is kept: it is the session's file as written at the end of the
 * previous turn, so when the turn's release writes the new file, the old
 * one is hard-linked as "<id>.<t>" (t = the turns it holds) before the new
 * one is renamed into place: a checkpoint costs no copy and no write, only
 * its file's bytes on disk (a state's size each), and no memory. Only the
 * newest max_checkpoints are kept; they count in the directory's budgets,
 * which delete the least recently used idle sessions' oldest checkpoints
 * before deleting any session. A turn that starts while the session's file
 * does not hold its state (a write failed) gets no checkpoint. Memory-only
 * stores keep no checkpoints. A fork starts with none; an export carries
 * them (core/state.h version 2) and an import replaces the session's with
 * the blob's.
 *
 * ## Crashes
 * Every change is atomic across a crash (kill -9 included): after a
 * restart a session is as it was before the change or as the change left
 * it, its checkpoints included. A change writes everything new under names
 * no current file has, then one rename makes it the session's (a turn: the
 * new file over the old one, which a link kept as the turn's checkpoint; a
 * rollback: the checkpoint over the session file; a fork: the new
 * session's file), and what the old state leaves behind is deleted after
 * that rename. An import replaces the whole set of checkpoints: it writes
 * the blob's under a new checkpoint generation ("<id>.<turns>.<generation>"
 * instead of "<id>.<turns>"; the session file names its generation; a
 * session with no checkpoint yet keeps its generation), then renames the
 * new session file into place. At startup the files a crash
 * left are deleted: temp files, checkpoints of no session, of another
 * generation than their session file's, at or past its turn count, or
 * older than the newest max_checkpoints.
 *
 * ## Owners
 * A session may carry an owner tag: "" (none) or 32 lowercase hex chars
 * that the caller derives (server/api/api_sessions.c: from the API key that
 * created it). The store keeps it in the session's file, so it survives a
 * restart, and filters lists by it; deciding who may use a session is the
 * caller's business. An import keeps the session's own tag, whatever the
 * blob says.
 *
 * ## Shared stores
 * With a backend (srv_store_opts_t.backend, server/store/store_backend.h: Redis), the
 * sessions live there, shared by every replica that uses it, and memory is
 * a cache in front of it: there is no directory, no checkpoint (rollback
 * and regenerate answer SRV_STORE_ENOCKPT, as for a memory-only store) and
 * nothing to flush. Then:
 *  - srv_store_acquire takes the session's lease in the backend (another
 *    replica holding it: SRV_STORE_EBUSY) and reads the session when the
 *    backend's version is not the one in memory, so no replica serves a
 *    state another one has moved on from; srv_store_release with persist
 *    saves it under the version it read (SRV_STORE_ESTALE when the stored
 *    one moved meanwhile: the change is dropped) and drops the lease; a
 *    release without persist drops the lease, and the copy in memory too
 *    when the caller changed it (it matches nothing saved).
 *  - srv_store_acquire_in_memory never reaches the backend: it takes a
 *    session that srv_store_fetch acquired on another thread for it (else
 *    SRV_STORE_EEVICTED, or EBUSY while it is held here).
 *  - srv_store_info reads the table: what this process has seen
 *    (srv_store_refresh brings one session's metadata up to date);
 *    srv_store_list_owned asks the backend (it blocks).
 *  - delete, fork, export, import block on the backend (the I/O thread's
 *    work, like the directory store's).
 *  - a backend that cannot be reached makes those calls fail with
 *    SRV_STORE_EUNAVAIL (srv_store_health says so without blocking); a
 *    full one with SRV_STORE_ENOSPACE.
 *  - the TTL is the backend's (a session expires ttl_s after its last
 *    save or acquire); srv_store_sweep only drops idle copies from memory
 *    and gives back fetched sessions no handler took.
 *
 * ## Threads
 * Every function is thread-safe (one mutex; disk I/O runs outside it, on a
 * session made busy or marked for I/O) and may block on disk I/O, except
 * srv_store_acquire_in_memory and those that only read the table (info,
 * list, stats). The accessors srv_session_* are for the caller holding the
 * session busy.
 *
 * ## Errors
 * A write or delete that the file system refuses for want of room (ENOSPC,
 * EDQUOT) or because it is read-only (EROFS) is SRV_STORE_ENOSPACE; other
 * I/O errors are SRV_STORE_EIO. Either way the previous file is kept.
 * Functions return 0 or a negative SRV_STORE_E* code and, given a buffer
 * err[errlen] (err may be NULL), write the detail into it (which file,
 * which errno, what the blob is for) when they fail; what it holds after a
 * success is unspecified. SRV_STORE_ERR_MAX bytes hold any message whole.
 */
#ifndef DARKSERVE_SERVER_STORE_H
#define DARKSERVE_SERVER_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/model.h"
#include "proto/proto.h"
#include "server/engine/engine.h"

/* X(name, value, description) */
#define SRV_STORE_ERRNO_MAP(X)                                                                   \
    X(SRV_STORE_EINVAL, -401, "invalid argument")                                                \
    X(SRV_STORE_ENOMEM, -402, "out of memory")                                                   \
    X(SRV_STORE_ENOTFOUND, -403, "session not found")                                            \
    X(SRV_STORE_EBUSY, -404, "session busy")                                                     \
    X(SRV_STORE_EFULL, -405, "session store full")                                               \
    X(SRV_STORE_EIO, -406, "session storage I/O error")                                          \
    X(SRV_STORE_EMISMATCH, -407, "state does not fit this server")                               \
    X(SRV_STORE_ENOSPACE, -408, "session storage full or read-only")                             \
    X(SRV_STORE_EEVICTED, -409, "session on disk, not in memory")                                \
    X(SRV_STORE_ENOCKPT, -410, "no such checkpoint")                                             \
    X(SRV_STORE_EUNAVAIL, -411, "session store unavailable")                                     \
    X(SRV_STORE_ESTALE, -412, "session changed elsewhere")

enum srv_store_errno {
#define SRV_STORE_ERR_ENUM_(name, val, desc) name = val,
    SRV_STORE_ERRNO_MAP(SRV_STORE_ERR_ENUM_)
#undef SRV_STORE_ERR_ENUM_
};

/* Static description of a code; never NULL. */
const char *srv_store_strerror(int code);

#define SRV_STORE_ERR_MAX 512 /* a detail buffer (err[errlen]) that no message overflows */

#define SRV_SESSION_ID_LEN PROTO_SESSION_ID_LEN /* 32 lowercase hex chars (proto/ids.c) */
#define SRV_SESSION_OWNER_LEN 32 /* lowercase hex chars of an owner tag */
#define SRV_STORE_MAX_CHECKPOINTS 64 /* max_checkpoints at most (CORE_STATE_MAX_CHECKPOINTS) */
#define SRV_TURN_INPUT_MAX 8192      /* input tokens of the last turn kept for a redo */
/* grammar text + reply bytes of a pending grammar at most (it shares the
 * file's 64 KiB owner section with the last turn's input) */
#define SRV_PENDING_GRAMMAR_MAX ((size_t)30 << 10)

typedef struct srv_session srv_session_t; /* opaque */
typedef struct srv_store srv_store_t;     /* opaque */
typedef struct srv_store_backend srv_store_backend_t; /* server/store/store_backend.h */

/* A checkpoint: the session's state after `turn` turns. */
typedef struct srv_checkpoint {
    int64_t turn;
    int64_t tokens; /* its history length */
    size_t bytes;   /* its file's size (what it adds to an export, less 8) */
} srv_checkpoint_t;

typedef struct srv_session_info {
    char id[SRV_SESSION_ID_LEN + 1];
    char owner[SRV_SESSION_OWNER_LEN + 1]; /* "" = none (see "Owners") */
    int64_t tokens;     /* history length: state position + pending, as of the
                           last release (a busy session's count is not re-read) */
    size_t state_bytes; /* bytes of its state blob (export / file size) */
    int64_t created;    /* unix seconds */
    int64_t last_used;  /* unix seconds (srv_session_touch) */
    int on_disk;        /* has a file in the directory */
    int in_memory;      /* held in memory now */
    int busy;
    int64_t turns;      /* turns so far (see "Turns and checkpoints") */
    int64_t pending_grammar; /* reply bytes of its pending grammar; -1: none */
    size_t n_checkpoints;
    srv_checkpoint_t checkpoints[SRV_STORE_MAX_CHECKPOINTS]; /* oldest first */
} srv_session_info_t;

typedef struct srv_store_opts {
    const char *dir;         /* session directory (created 0700 if missing); NULL or "":
                                memory only (nothing persists, nothing is evicted) */
    size_t max_sessions;     /* sessions in memory; 0 = no bound */
    size_t max_bytes;        /* memory of the sessions in memory; 0 = no bound */
    size_t max_disk_files;   /* session files in dir; 0 = no bound (see "Disk") */
    size_t max_disk_bytes;   /* bytes of session files in dir; 0 = no bound */
    int64_t ttl_s;           /* srv_store_sweep deletes sessions unused this long; 0 = never */
    size_t max_checkpoints;  /* checkpoints kept per session, <= SRV_STORE_MAX_CHECKPOINTS;
                                0 = none (see "Turns and checkpoints") */
    core_model_t *model;     /* borrowed, must outlive the store: states come from its attention */
    const char *fingerprint; /* copied; NULL = core_model_info(model)->fingerprint */
    srv_store_backend_t *backend; /* NULL: the directory (or memory only); else a shared
                                     store (see "Shared stores"), owned by the store from
                                     srv_store_new on (freed by it, also when that fails);
                                     dir and max_checkpoints are then ignored */
} srv_store_opts_t;

/* Opens a store. With a directory: creates it if missing, refuses one it
 * cannot write or that another process has open (an advisory lock file
 * ".lock"), deletes temp files left by a crash and lists the session files
 * it finds (reading only their headers). Returns 0 and *out (owned by the
 * caller), or a negative code with a message in err[errlen] (err may be
 * NULL). */
int srv_store_new(const srv_store_opts_t *o, srv_store_t **out, char *err, size_t errlen);
/* Frees every session in memory WITHOUT writing it (call srv_store_flush
 * first). No session may be busy. NULL is a no-op. */
void srv_store_free(srv_store_t *st);

/* A new session with a fresh id (128 bits from getrandom(), 32 lowercase hex),
 * an empty state and a sampler with default parameters and a random seed;
 * returned busy (*out borrowed from the store until released). Not written
 * until released with persist = 1 (or evicted / flushed).
 * SRV_STORE_EFULL, SRV_STORE_ENOMEM, SRV_STORE_EIO (no randomness). */
int srv_store_create(srv_store_t *st, srv_session_t **out, char *err, size_t errlen);
/* Holds session id: validates the id's format before anything else
 * (SRV_STORE_EINVAL), loads it from its file if evicted, marks it busy.
 * *out is borrowed until srv_store_release. SRV_STORE_ENOTFOUND,
 * SRV_STORE_EBUSY, SRV_STORE_EFULL, SRV_STORE_EIO (unreadable or damaged
 * file: the message says which and why). */
int srv_store_acquire(srv_store_t *st, const char *id, srv_session_t **out, char *err,
                      size_t errlen);
/* Same, but never touches the disk nor waits for it: a session that is not
 * in memory, or is being written to its file at that moment (and may be
 * dropped from memory after), is SRV_STORE_EEVICTED, and nothing changes
 * (its file is not opened, nothing is evicted). For the no-I/O thread
 * (srv_store_no_io_here): it has such a session read back by
 * srv_store_acquire on another thread, then tries again. */
int srv_store_acquire_in_memory(srv_store_t *st, const char *id, srv_session_t **out, char *err,
                                size_t errlen);
/* Gives a held session back. persist = 1: first writes it atomically; on a
 * write error the previous file stays as it was and SRV_STORE_EIO or
 * SRV_STORE_ENOSPACE is returned (message: file and errno). The session is
 * released in every case; after a failed write it goes back to its file
 * (the change the caller could not save is dropped, so what a client was
 * told failed never reappears), or, without a file yet, stays in memory
 * to be written later. Then evicts whatever the bounds require. */
int srv_store_release(srv_store_t *st, srv_session_t *s, int persist, char *err, size_t errlen);
/* Deletes a session (memory and file). ENOTFOUND, EBUSY, EINVAL (bad id). */
int srv_store_delete(srv_store_t *st, const char *id, char *err, size_t errlen);
/* *out (caller-owned) for id. ENOTFOUND, EINVAL. */
int srv_store_info(srv_store_t *st, const char *id, srv_session_info_t *out, char *err,
                   size_t errlen);
/* Sessions ordered by id, those after `after` (exclusive; NULL or "" = from
 * the start) whose owner tag is owner (NULL = every session): up to limit
 * entries into out[] (caller-owned), their count in *n, *has_more = 1 if
 * more follow. */
int srv_store_list_owned(srv_store_t *st, const char *owner, const char *after, size_t limit,
                         srv_session_info_t *out, size_t *n, int *has_more, char *err,
                         size_t errlen);
/* Copies session id into a new session (O(state); written at once when the
 * store has a directory), its id into new_id. The copy continues exactly
 * like the original. The source must not be busy (EBUSY). The copy's owner
 * tag is owner (borrowed; "" = none; NULL = the source's). EINVAL for a
 * malformed tag. */
int srv_store_fork_owned(srv_store_t *st, const char *id, const char *owner,
                         char new_id[SRV_SESSION_ID_LEN + 1], char *err, size_t errlen);
/* The session's state blob (core/state.h; new malloc'd *blob, caller frees).
 * EBUSY if busy; EIO if its file is unreadable or damaged. */
int srv_store_export(srv_store_t *st, const char *id, void **blob, size_t *len, char *err,
                     size_t errlen);
/* Replaces the state of existing session id (not busy) by blob (borrowed,
 * len bytes), validated by core_state_load (and its pending tokens against
 * the vocabulary, its pending grammar and reply against each other, and
 * likewise each checkpoint it carries): a blob for another model or
 * attention configuration, or a damaged one, is SRV_STORE_EMISMATCH with the
 * reason in err[errlen] (err may be NULL) and the session keeps its previous
 * state. turn_open/has_chat come from the blob, created and the owner tag
 * stay. The blob's checkpoints (the newest max_checkpoints) replace the
 * session's, atomically with the state (see "Crashes"). Then written (EIO /
 * ENOSPACE on a write error, of the state or of any checkpoint: the session
 * keeps its previous state, its file and its checkpoints). */
int srv_store_import(srv_store_t *st, const char *id, const void *blob, size_t len, char *err,
                     size_t errlen);
/* Deletes sessions (memory and file) not used for ttl_s seconds before now
 * (unix seconds), then evicts to the bounds (memory and disk). Busy sessions
 * are skipped.
 * Returns 0 or the first error (the sweep goes on after one). */
int srv_store_sweep(srv_store_t *st, int64_t now, char *err, size_t errlen);
/* Writes every session in memory that changed since its last write (at
 * shutdown). Busy sessions are skipped. Returns 0 or the first error. */
int srv_store_flush(srv_store_t *st, char *err, size_t errlen);
/* Sessions in memory, sessions with a file, memory bytes of those in memory.
 * Any pointer may be NULL. */
void srv_store_stats(srv_store_t *st, size_t *in_memory, size_t *on_disk, size_t *bytes);
/* Bytes of the session files, and sessions deleted so far to keep the
 * directory within its budgets. Any pointer may be NULL. */
void srv_store_disk_stats(srv_store_t *st, size_t *bytes, uint64_t *evicted);
/* Memory of the sessions in memory, split in what eviction cannot free now
 * (*held: busy sessions, sessions being written, and every session when
 * there is no directory) and what it can (*evictable: idle sessions). */
void srv_store_mem_stats(srv_store_t *st, size_t *held, size_t *evictable);
/* Evicts least recently used idle sessions (written first if they changed)
 * until the sessions in memory take at most max_bytes, or none is left to
 * evict (no directory, all busy). Returns 0 or the first write error. */
int srv_store_trim(srv_store_t *st, size_t max_bytes, char *err, size_t errlen);
/* Marks the calling thread (the event loop's) as one that must not wait for
 * the disk to make room: from then on, store calls made on it evict only
 * idle sessions whose file is current (dropping them writes nothing) and
 * delete no file for the directory's budgets; what else the bounds need is
 * left for srv_store_settle on another thread, so the bounds can be
 * exceeded until it runs (srv_store_needs_settle says when). Reading an
 * evicted session back (srv_store_acquire) still reads its file, on any
 * thread: the no-I/O thread uses srv_store_acquire_in_memory instead and
 * has another thread read the session when that says SRV_STORE_EEVICTED
 * (between a check that it is in memory and an acquire, another thread may
 * have evicted it). */
void srv_store_no_io_here(srv_store_t *st);
/* 1 when the no-I/O thread left the bounds exceeded (any thread). */
int srv_store_needs_settle(srv_store_t *st);
/* Evicts (writing first) and trims the directory to the bounds, as a sweep
 * does without expiring anything. Not on the no-I/O thread. Returns 0 or
 * the first error. */
int srv_store_settle(srv_store_t *st, char *err, size_t errlen);
/* The largest state blob an export can be (its checkpoints included: for
 * bounding an import body). */
size_t srv_store_max_export(const srv_store_t *st);

/* ---- turns and checkpoints (see "Turns and checkpoints") ---- */

/* Flags of a turn. */
#define SRV_TURN_REPLY 1u /* it generates a reply (a redo can replace it) */
#define SRV_TURN_CHAT 2u  /* its input is a chat render (the flags it leaves: has_chat, and
                             turn_open when it generates) */

/* Opens a turn on held session s: the turn count goes up, input[n]
 * (borrowed; the request's new tokens) and flags become the last turn's
 * (the input only when n <= SRV_TURN_INPUT_MAX), and the state as it is
 * now becomes the turn's checkpoint when its release writes the session.
 * No I/O. SRV_STORE_EINVAL when a turn is already open. */
int srv_store_turn_begin(srv_store_t *st, srv_session_t *s, const int32_t *input, size_t n,
                         unsigned flags, char *err, size_t errlen);
/* Takes session id back `n` turns (n >= 1) to its checkpoint after
 * turns - n turns: that checkpoint's file becomes the session's file
 * (renamed: nothing is written) and, when the session is in memory, its
 * state, sampler, pending tokens and flags replace the session's; the turn
 * count becomes turns - n, and every later checkpoint is deleted. The
 * session must not be busy (EBUSY). SRV_STORE_ENOCKPT (the message says
 * which checkpoints there are) when there is no such checkpoint, EIO when
 * its file cannot be read or is damaged (then nothing changed), ENOSPACE /
 * EIO when the rename fails. On success *info (may be NULL) describes the
 * session as it is now. */
int srv_store_rollback(srv_store_t *st, const char *id, int64_t n, srv_session_info_t *info,
                       char *err, size_t errlen);
/* A redo replaces the last turn's reply: the session goes back to its
 * checkpoint before the last turn and the caller runs the last turn's input
 * again (srv_session_last_turn). Reading that checkpoint is disk I/O, so it
 * happens first, on a session that is not busy: srv_store_redo_prepare reads
 * it into memory beside the session (counted in the store's bytes) and
 * checks that a redo is possible: SRV_STORE_ENOCKPT when the session has no
 * turn, its last turn generated no reply, its input was longer than
 * SRV_TURN_INPUT_MAX, or the checkpoint before it is gone (message says
 * which); EBUSY, ENOTFOUND, EIO. Then srv_store_redo_begin on the held
 * session (no I/O) swaps the prepared checkpoint in and keeps the state
 * it replaced until the release: release with persist commits the redo
 * (the new reply's state is written; the checkpoint before the turn stays),
 * release without persist puts the previous state back. srv_store_redo_begin is SRV_STORE_EEVICTED when nothing is prepared
 * (or what was prepared is stale: the session changed or was evicted
 * meanwhile): prepare again. */
int srv_store_redo_prepare(srv_store_t *st, const char *id, char *err, size_t errlen);
int srv_store_redo_begin(srv_store_t *st, srv_session_t *s, char *err, size_t errlen);

/* ---- shared stores (see "Shared stores") ---- */

/* 1 when the store keeps its sessions in a backend shared with other
 * processes (any thread). */
int srv_store_remote(const srv_store_t *st);
/* Acquires session id (srv_store_acquire: lease, read when stale) and
 * keeps it held for the next srv_store_acquire_in_memory of id, which
 * takes it without reaching the backend. Blocks (the I/O thread's).
 * Remote stores only (else SRV_STORE_EINVAL). */
int srv_store_fetch(srv_store_t *st, const char *id, char *err, size_t errlen);
/* Gives back a session fetched for a caller that never came to take it
 * (its lease dropped). No-op when id is not waiting to be taken. */
void srv_store_unfetch(srv_store_t *st, const char *id);
/* Re-reads session id's metadata from the backend into the table (a copy
 * in memory of another version is dropped), so that srv_store_info sees it
 * as it is now. SRV_STORE_ENOTFOUND (and the table forgets it),
 * EUNAVAIL. Blocks. A store without backend: 0 when the table has id,
 * else ENOTFOUND. */
int srv_store_refresh(srv_store_t *st, const char *id, char *err, size_t errlen);
/* 0 when the store can reach its sessions (always, without a backend);
 * else SRV_STORE_EUNAVAIL with the reason in why[n]. Never blocks. */
int srv_store_health(srv_store_t *st, char *why, size_t n);

/* 1 if id is a well-formed session id, NUL-terminated (proto_session_id_valid). */
int srv_session_id_valid(const char *id);

/* ---- accessors for a session the caller holds (busy) ----
 * (srv_store_info gives its turns and owner, held or not.) */

const char *srv_session_id(const srv_session_t *s);      /* borrowed, NUL-terminated */
srv_seq_ctx_t *srv_session_ctx(srv_session_t *s);        /* borrowed: state, sampler, pending */
/* The turn a chat continuation starts in (core_chat_open_t's values): 0 none,
 * 1 an assistant turn (after generation), 2 a user turn holding system text
 * (a Gemma session opened with a system message alone). */
int srv_session_turn_open(const srv_session_t *s);
void srv_session_set_turn_open(srv_session_t *s, int open); /* 0, 1 or 2 */
void srv_session_set_has_chat(srv_session_t *s, int v); /* conversation started with a chat render */
int64_t srv_session_tokens(const srv_session_t *s);       /* state position + pending */
/* The last turn's flags (SRV_TURN_*) and its input (*input borrowed, valid
 * while held; NULL and 0 when it was not kept). Returns 1 when the input
 * was kept, else 0. */
int srv_session_last_turn(const srv_session_t *s, unsigned *flags, const int32_t **input,
                          size_t *n);
/* Sets the owner tag (copied; "" or 32 lowercase hex chars, else EINVAL) and
 * marks the session changed. */
int srv_session_set_owner(srv_session_t *s, const char *owner, char *err, size_t errlen);
/* The pending grammar: a reply generated under a grammar that stopped
 * before the grammar was complete (max_tokens, a stop string, a cancel),
 * kept so that a later generate can finish it under the same grammar. It
 * is the grammar's text and the bytes of the reply so far; it is kept in
 * the session's file (so a checkpoint, a rollback to it, an export and a
 * fork carry it) and cleared by the caller's next generate. Returns 1 and
 * *text[*tlen], *reply[*rlen] (borrowed, valid while held and unchanged)
 * when the session has one, else 0 (NULLs and 0s). */
int srv_session_pending_grammar(const srv_session_t *s, const char **text, size_t *tlen,
                                const char **reply, size_t *rlen);
/* Sets it to copies of text[tlen] (tlen >= 1) and reply[rlen] (borrowed),
 * or clears it (text NULL), and marks the session changed when it changed.
 * EINVAL when tlen + rlen > SRV_PENDING_GRAMMAR_MAX (nothing changes),
 * ENOMEM. */
int srv_session_set_pending_grammar(srv_session_t *s, const char *text, size_t tlen,
                                    const char *reply, size_t rlen, char *err, size_t errlen);
/* last_used = now, and marks the session changed (written on release with
 * persist, eviction or flush). */
void srv_session_touch(srv_session_t *s);

/* ---- testing ---- */

/* Replaces write(2) for session files (failure injection: return -1 with
 * errno set, or a short count). fn NULL restores write(2). */
typedef ssize_t (*srv_store_write_fn)(int fd, const void *buf, size_t n, void *ud);
void srv_store_set_write_fn(srv_store_t *st, srv_store_write_fn fn, void *ud);
/* Failure injection around the session directory: fn(op, ud) runs before
 * each operation ("create" a temp file, "write", "rename" it into place,
 * "unlink" a session file, "read" a session file) and returns 0 to let it
 * happen, or an errno value it then fails with, as if the system call had
 * (ENOSPC: a full disk; EROFS: a read-only one). fn NULL removes it. Any
 * thread may be running store calls; fn must be thread-safe. */
typedef int (*srv_store_fault_fn)(const char *op, void *ud);
void srv_store_set_fault_fn(srv_store_t *st, srv_store_fault_fn fn, void *ud);

#endif
