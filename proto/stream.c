/* proto/stream.c — SSE and NDJSON framing of JSON texts.
 *
 * SSE (text/event-stream): an event is one or more "data: " lines and a blank
 * line; the client joins the data lines with "\n". Our JSON is compact and has
 * no newline, but a text that had one would otherwise end the event early, so
 * each line gets its own prefix. NDJSON: one JSON text per line; a raw CR/LF in
 * valid JSON can only be whitespace between tokens, so a space replaces it.
 */
#include <string.h>

#include "proto/proto_impl.h"

static const char sse_prefix[] = "data: ";
#define SSE_PREFIX_LEN (sizeof sse_prefix - 1)

static char *frame_sse(const char *json, size_t len, size_t *out_len)
{
    /* Lines end at \n, \r\n or \r (SSE's three line endings). */
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) {
        if (json[i] == '\n' || (json[i] == '\r' && !(i + 1 < len && json[i + 1] == '\n')))
            lines++;
    }
    if (lines > (SIZE_MAX - len - 2) / (SSE_PREFIX_LEN + 1))
        return NULL;
    size_t cap = len + lines * (SSE_PREFIX_LEN + 1) + 2;
    char *d = px_malloc(cap);
    if (!d)
        return NULL;
    size_t o = 0;
    memcpy(d, sse_prefix, SSE_PREFIX_LEN);
    o += SSE_PREFIX_LEN;
    for (size_t i = 0; i < len; i++) {
        char c = json[i];
        if (c == '\r' && i + 1 < len && json[i + 1] == '\n')
            continue; /* the \n that follows ends the line */
        if (c == '\n' || c == '\r') {
            d[o++] = '\n';
            memcpy(d + o, sse_prefix, SSE_PREFIX_LEN);
            o += SSE_PREFIX_LEN;
        } else {
            d[o++] = c;
        }
    }
    d[o++] = '\n';
    d[o++] = '\n';
    d[o] = '\0';
    *out_len = o;
    return d;
}

static char *frame_ndjson(const char *json, size_t len, size_t *out_len)
{
    if (len > SIZE_MAX - 2)
        return NULL;
    char *d = px_malloc(len + 2);
    if (!d)
        return NULL;
    for (size_t i = 0; i < len; i++)
        d[i] = (char)(json[i] == '\n' || json[i] == '\r' ? ' ' : json[i]);
    d[len] = '\n';
    d[len + 1] = '\0';
    *out_len = len + 1;
    return d;
}

char *proto_frame(proto_stream_format_t fmt, const char *json, size_t len, size_t *out_len)
{
    size_t dummy;
    if (!out_len)
        out_len = &dummy;
    if (!json)
        len = 0;
    return fmt == PROTO_STREAM_NDJSON ? frame_ndjson(json, len, out_len)
                                      : frame_sse(json, len, out_len);
}

char *proto_frame_error(proto_stream_format_t fmt, const proto_error_t *err, size_t *out_len)
{
    char *j = proto_error_json(err);
    if (!j)
        return NULL;
    char *f = proto_frame(fmt, j, strlen(j), out_len);
    px_free(j);
    return f;
}
