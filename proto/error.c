/* proto/error.c — the OpenAI-style error object: table, setter, JSON body. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "proto/proto_impl.h"

typedef struct errkind_row {
    int status;
    const char *type;
    const char *code;
} errkind_row_t;

static const errkind_row_t errkind_rows[] = {
#define PROTO_ERRKIND_ROW_(kind, status, type, code) {status, type, code},
    PROTO_ERRKIND_MAP(PROTO_ERRKIND_ROW_)
#undef PROTO_ERRKIND_ROW_
};

static const errkind_row_t *errkind_row(proto_errkind_t kind)
{
    if ((int)kind < 0 || (int)kind >= (int)PROTO_ERR_KIND_COUNT_)
        return NULL;
    return &errkind_rows[kind];
}

int proto_error_set(proto_error_t *err, proto_errkind_t kind, const char *param,
                    const char *fmt, ...)
{
    const errkind_row_t *r = errkind_row(kind);
    if (!r)
        r = &errkind_rows[PROTO_ERR_INTERNAL];
    int rc = r == &errkind_rows[PROTO_ERR_INTERNAL] ? PROTO_ENOMEM : PROTO_EINVAL;
    if (!err)
        return rc;
    err->status = r->status;
    err->type = r->type;
    err->code = r->code;
    err->param[0] = '\0';
    /* Both are fixed-size fields; a text too long for one ends with "..."
     * so that a reader sees it was cut (never silently). */
    if (param && strlen(param) >= sizeof err->param)
        snprintf(err->param, sizeof err->param, "%.*s...", (int)sizeof err->param - 4, param);
    else if (param)
        snprintf(err->param, sizeof err->param, "%s", param);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof err->message)
        memcpy(err->message + sizeof err->message - 4, "...", 4);
    return rc;
}

char *proto_error_json(const proto_error_t *err)
{
    json_t *inner = json_object();
    int bad = 0;
    size_t mlen = strnlen(err->message, sizeof err->message);
    size_t plen = strnlen(err->param, sizeof err->param);
    /* The message may quote parser text near a bad byte, and snprintf may
     * have cut it inside a multibyte character: px_str repairs both. */
    bad |= json_object_set_new(inner, "message", px_str(err->message, mlen));
    bad |= json_object_set_new(inner, "type", px_cstr_or_null(err->type ? err->type
                                                                         : "server_error"));
    bad |= json_object_set_new(inner, "param", plen ? px_str(err->param, plen) : json_null());
    bad |= json_object_set_new(inner, "code", px_cstr_or_null(err->code));
    json_t *root = json_object();
    bad |= json_object_set_new(root, "error", inner);
    if (bad) {
        json_decref(root);
        return NULL;
    }
    return px_dump(root);
}
