/* core/err.h — error codes and the error-detail struct shared by core/.
 *
 * Every core function that can fail returns 0 or a negative CORE_E* code and,
 * when given a non-NULL core_error_t, writes a human-readable message that says
 * what is wrong (which key, which tensor, which offset). core never logs.
 *
 * One error space. Each module numbers its codes in a range of its own, so
 * a code names the module it came from and a switch on one module's codes
 * cannot catch another's:
 *      -1 ..  -99  CORE_E*        core/err.h            core_strerror
 *    -101 .. -199  PROTO_E*       proto/proto.h         (detail in proto_error_t)
 *    -201 .. -299  SRV_HTTP_E*    server/http/http.h
 *    -301 .. -399  SRV_ENGINE_E*  server/engine/engine.h       srv_engine_strerror
 *    -401 .. -499  SRV_STORE_E*   server/store/store.h        srv_store_strerror
 *    -501 .. -599  SRV_PREFIX_E*  server/store/prefix_cache.h srv_prefix_strerror
 *    -601 .. -699  SRV_HC_E*      server/cli/http_client.h  srv_hc_strerror
 * Each table is an X-macro (name, value, description). A module returns its
 * own codes only: a code from a module below it is translated, never passed
 * up. tests/unit/test_srv_errors.c checks the ranges. Functions of modules
 * without a table (config, log, option parsing) return -1 with the message
 * in the caller's buffer.
 *
 * Detail travels in a buffer the caller owns: a core_error_t here (the most
 * call sites), `char *err, size_t errlen` in server/ (proto: proto_error_t,
 * which also carries the HTTP status). No module keeps it in a global or
 * thread-local of its own.
 */
#ifndef DARKSERVE_CORE_ERR_H
#define DARKSERVE_CORE_ERR_H

#include <stddef.h>

/* X(name, value, description) */
#define CORE_ERRNO_MAP(X)                                   \
    X(CORE_EINVAL, -1, "invalid argument")                  \
    X(CORE_ENOMEM, -2, "out of memory")                     \
    X(CORE_EIO, -3, "I/O error")                            \
    X(CORE_EFORMAT, -4, "malformed file")                   \
    X(CORE_EUNSUPPORTED, -5, "unsupported feature")         \
    X(CORE_ERANGE, -6, "value out of range")                \
    X(CORE_ENOTFOUND, -7, "not found")                      \
    X(CORE_EMISMATCH, -8, "mismatch")                       \
    X(CORE_ECHECKSUM, -9, "checksum mismatch")              \
    X(CORE_ECONTEXT, -10, "context length exceeded")

enum core_errno {
#define CORE_ERR_ENUM_(name, val, desc) name = val,
    CORE_ERRNO_MAP(CORE_ERR_ENUM_)
#undef CORE_ERR_ENUM_
};

#define CORE_ERROR_MSG_MAX 512

typedef struct core_error {
    int code;                     /* last code set, 0 if none */
    char msg[CORE_ERROR_MSG_MAX]; /* NUL-terminated detail */
} core_error_t;

/* Short static description of a code ("malformed file"); never NULL. */
const char *core_strerror(int code);

/* Records code and a printf-style message in err (err may be NULL).
 * Returns code, so callers can write `return core_error_set(err, ...)`. */
int core_error_set(core_error_t *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
