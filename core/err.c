/* core/err.c — error code table and detail formatting. */
#include "core/err.h"

#include <stdarg.h>
#include <stdio.h>

const char *core_strerror(int code)
{
    switch (code) {
    case 0: return "success";
#define CORE_ERR_STR_(name, val, desc) \
    case name: return desc;
        CORE_ERRNO_MAP(CORE_ERR_STR_)
#undef CORE_ERR_STR_
    default: return "unknown error";
    }
}

int core_error_set(core_error_t *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}
