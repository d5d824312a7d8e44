/* server/store/store_backend.h — the backend interface of a shared session store: a place
 * outside this process that holds every session's saved state, so that
 * several replicas of the server can continue each other's sessions
 * (server/store/store_redis.c: Redis; tests/unit/test_srv_store_remote.c: an
 * in-process fake).
 *
 * The session table (server/store/store.h) keeps using memory as a cache in
 * front of the backend; srv_store_opts_t.backend switches it from the
 * session directory to the backend ("remote mode", store.h "Shared
 * stores"). The backend knows nothing of states or models: a session is an
 * opaque blob (the core/state.h blob the directory store writes as the
 * session's file) plus the small metadata below, under a version number.
 *
 * ## Versions
 * Every successful save of a session makes its version one higher (the
 * first save makes it 1). A save names the version it read (`expect`); the
 * backend refuses it with SRV_STORE_ESTALE when the stored version is
 * another one, so a replica holding an old copy can never overwrite a newer
 * turn. An acquire says which version the caller holds in memory (`have`)
 * and gets the blob only when the stored one differs.
 *
 * ## Leases
 * acquire takes the session's lease (a token unique to this acquire) for
 * the backend's lease time and the backend renews it while held, from its
 * own thread; save (on success) and release drop it. An acquire while
 * another token holds the lease is SRV_STORE_EBUSY (HTTP 409 session_busy):
 * two replicas never run a job on one session at once. A lease whose holder
 * died expires after the lease time. A save is refused (ESTALE) when
 * another token holds the lease; a lease that merely expired meanwhile does
 * not refuse it (the version check alone decides).
 *
 * ## Threads and blocking
 * acquire, save, remove, peek and list block on the backend (bounded by its
 * timeouts): the session table calls them only on threads that may block
 * (the store's I/O thread, never the event loop). release and health never
 * block: release queues the lease's deletion for the backend's own thread,
 * health reads the state that thread maintains. Every function is
 * thread-safe.
 *
 * ## Errors
 * 0 or a negative SRV_STORE_E* code, the detail in the caller's err[errlen]
 * (err may be NULL; written on the calling thread): ENOTFOUND, EBUSY, ESTALE, EUNAVAIL (the backend
 * cannot be reached, or refuses for a while: the caller answers 503),
 * ENOSPACE (the backend is out of memory), ENOMEM, EIO (a reply that makes
 * no sense).
 */
#ifndef DARKSERVE_SERVER_STORE_BACKEND_H
#define DARKSERVE_SERVER_STORE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "server/store/store.h"

#define SRV_STORE_TOKEN_MAX 48 /* a lease token and its NUL */

/* The small fields kept beside a session's blob, so that info and lists
 * need not fetch the state. */
typedef struct srv_store_meta {
    char owner[SRV_SESSION_OWNER_LEN + 1]; /* "" = none */
    int64_t created, last_used;            /* unix seconds */
    int64_t tokens;                        /* history length */
    int64_t turns;
    int64_t pending_grammar; /* reply bytes of the pending grammar; -1: none */
    uint64_t state_bytes;    /* the blob's length */
} srv_store_meta_t;

/* One session of a list. */
typedef struct srv_store_entry {
    char id[SRV_SESSION_ID_LEN + 1];
    uint64_t version;
    srv_store_meta_t meta;
} srv_store_entry_t;

typedef struct srv_store_backend_ops {
    /* Takes session id's lease: *token (caller-owned [SRV_STORE_TOKEN_MAX])
     * gets the new lease's token, *version the stored version; when that is
     * not `have` (0: the caller holds nothing), *blob (malloc'd, caller
     * frees) and *len get the stored blob, else *blob = NULL. ENOTFOUND (no
     * lease is left behind), EBUSY, EUNAVAIL. Blocks. */
    int (*acquire)(srv_store_backend_t *be, const char *id, uint64_t have, char *token,
                   uint64_t *version, unsigned char **blob, size_t *len, char *err, size_t errlen);
    /* Stores blob[len] (borrowed) and m as version expect + 1 when the stored
     * version is expect (0: the session must not exist yet) and no other
     * token than `token` (NULL: none, a new session) holds the lease;
     * drops the lease on success (*version = the new version). ESTALE
     * (another version, or another holder: nothing written), EUNAVAIL,
     * ENOSPACE. A save that the backend applied but whose answer was lost is
     * reported as a success when it is retried. Blocks. */
    int (*save)(srv_store_backend_t *be, const char *id, const char *token, uint64_t expect,
                const unsigned char *blob, size_t len, const srv_store_meta_t *m, uint64_t *version,
                char *err, size_t errlen);
    /* Drops the lease `token` of id, if it still holds it. Never blocks
     * (queued); an acquire of id by this process meanwhile takes it over. */
    void (*release)(srv_store_backend_t *be, const char *id, const char *token);
    /* Deletes session id unless another process holds its lease (EBUSY).
     * ENOTFOUND, EUNAVAIL. Blocks. */
    int (*remove)(srv_store_backend_t *be, const char *id, char *err, size_t errlen);
    /* The stored version and metadata of id, without the blob. ENOTFOUND,
     * EUNAVAIL. Blocks. */
    int (*peek)(srv_store_backend_t *be, const char *id, uint64_t *version, srv_store_meta_t *m,
                char *err, size_t errlen);
    /* Sessions ordered by id after `after` ("" = from the start) whose
     * owner tag is owner (NULL = any): up to limit into out[] (caller-owned),
     * their count in *n, *has_more = 1 if more follow. EUNAVAIL. Blocks. */
    int (*list)(srv_store_backend_t *be, const char *owner, const char *after, size_t limit,
                srv_store_entry_t *out, size_t *n, int *has_more, char *err, size_t errlen);
    /* 0 when the backend was reachable at its last check; else EUNAVAIL and
     * why[n] says what is wrong since when. Never blocks. */
    int (*health)(srv_store_backend_t *be, char *why, size_t n);
    /* Stops the backend's thread, drops the leases still queued for release
     * (best effort), frees everything. */
    void (*free)(srv_store_backend_t *be);
} srv_store_backend_ops_t;

/* A backend is a struct whose first member is this. */
struct srv_store_backend {
    const srv_store_backend_ops_t *ops;
};

/* ---- Redis (server/store/store_redis.c) ---- */

#define SRV_STORE_REDIS_PORT 6379
#define SRV_STORE_REDIS_HOST_MAX 255

/* --session-store redis://[[user]:password@]host[:port][/db] parsed. */
typedef struct srv_store_redis_url {
    char host[SRV_STORE_REDIS_HOST_MAX + 1]; /* name or address, [brackets] of IPv6 removed */
    int port;                                /* 1..65535, default 6379 */
    int db;                                  /* 0.. SRV_STORE_REDIS_DB_MAX, default 0 */
    char user[128], password[256];           /* "" = none (AUTH user password / AUTH password) */
} srv_store_redis_url_t;

#define SRV_STORE_REDIS_DB_MAX 1000000

/* Parses url (borrowed) into *out. Returns 0, or -1 with a message that
 * says what is wrong and what is expected in err[errlen]. */
int srv_store_redis_url_parse(const char *url, srv_store_redis_url_t *out, char *err,
                              size_t errlen);
/* url with its password replaced by "***" into out[n] (for logs and
 * --print-config). */
void srv_store_redis_url_redact(const char *url, char *out, size_t n);

/* "darkserve:<first 16 hex of SHA-256 of fingerprint>:" into out[n]
 * (n >= 29): sessions of another model are another namespace. */
void srv_store_redis_namespace(const char *fingerprint, char *out, size_t n);

typedef struct srv_store_redis_opts {
    const char *url;    /* borrowed: --session-store */
    const char *ns;     /* borrowed: srv_store_redis_namespace */
    int64_t ttl_ms;     /* sessions expire this long after their last save or acquire; 0 = never */
    int64_t lease_ms;   /* lease time (renewed every third of it while held); 0 = 15 s */
    int64_t timeout_ms; /* connect and command timeout; 0 = 5 s */
} srv_store_redis_opts_t;

/* A Redis backend: parses the URL, starts the backend's thread (lease
 * renewal, queued releases, health checks with reconnects after a backoff
 * of 0.1 s doubling to 5 s). An unreachable server is no error here: the
 * backend starts unhealthy and keeps trying. Returns 0 and *out (owned by
 * the caller: free with its ops->free, or by the store it is given to),
 * or -1 with the reason in err[errlen]. */
int srv_store_redis_new(const srv_store_redis_opts_t *o, srv_store_backend_t **out, char *err,
                        size_t errlen);

#endif
