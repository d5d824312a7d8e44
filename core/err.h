/* core/err.h — error codes and the error-detail struct shared by core/.
 *
 * Every core function that can fail returns 0 or a negative CORE_E* code and,
 * when given a non-NULL core_error_t, writes a human-readable message that says
 * what is wrong (which key, which tensor, which offset). core never logs.
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
