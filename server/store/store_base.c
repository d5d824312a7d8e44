/* server/store/store_base.c — the bottom of the session store: its error
 * codes and messages, and session ids. It calls nothing else of the store
 * (store_impl.h: the store's files and the order they call each other in).
 */
#include "server/store/store.h"
#include "server/store/store_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "proto/proto.h"
#include "server/base/random.h"

/* ---- errors ---- */

const char *srv_store_strerror(int code)
{
    switch (code) {
#define SRV_STORE_ERR_STR_(name, val, desc)                                                        \
    case name: return desc;
        SRV_STORE_ERRNO_MAP(SRV_STORE_ERR_STR_)
#undef SRV_STORE_ERR_STR_
    }
    return code == 0 ? "success" : "unknown error";
}

void srv_store_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

const char *srv_sess_errstr(int e, char *buf, size_t n)
{
    return strerror_r(e, buf, n); /* GNU: returns the message */
}

/* ---- ids ---- */

int srv_session_id_valid(const char *id)
{
    return id && proto_session_id_valid(id, strnlen(id, ID_LEN + 1));
}

/* n random bytes into buf (getrandom); SRV_STORE_EIO without randomness. */
int srv_sess_random_bytes(void *buf, size_t n, char *err, size_t errlen)
{
    int e = srv_random_bytes(buf, n);
    char eb[128];
    return e ? STORE_FAIL(err, errlen, SRV_STORE_EIO, "getrandom: %s",
                          srv_sess_errstr(e, eb, sizeof eb))
             : 0;
}

int srv_sess_new_id(char id[ID_LEN + 1], char *err, size_t errlen)
{
    unsigned char r[ID_LEN / 2];
    int rc = srv_sess_random_bytes(r, sizeof r, err, errlen);
    if (rc < 0)
        return rc;
    proto_session_id_format(r, id);
    return 0;
}
