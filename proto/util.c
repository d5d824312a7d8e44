/* proto/util.c — memory through jansson's allocator, UTF-8 validation and
 * repair, and the small JSON-building helpers every response builder uses. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto_impl.h"
#include "proto/proto_test.h"

void *px_malloc(size_t n)
{
    json_malloc_t m;
    json_free_t f;
    if (n == 0)
        return NULL;
    json_get_alloc_funcs(&m, &f);
    return m(n);
}

void px_free(void *p)
{
    json_malloc_t m;
    json_free_t f;
    if (!p)
        return;
    json_get_alloc_funcs(&m, &f);
    f(p);
}

void proto_free(void *p)
{
    px_free(p);
}

char *px_strndup(const char *s, size_t n)
{
    if (n == SIZE_MAX)
        return NULL;
    char *d = px_malloc(n + 1);
    if (!d)
        return NULL;
    if (n)
        memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* Decodes one scalar at s[i]: returns the bytes it spans (>= 1) and sets *state
 * to 1 (well-formed), 0 (ill-formed: replace those bytes by one U+FFFD) or 2
 * (a well-formed prefix cut by the end of the buffer).
 * Unicode Table 3-7 (well-formed UTF-8): the lead byte fixes the length and
 * the allowed range of the second byte; later bytes are always 80..BF. */
static size_t px_utf8_step(const unsigned char *s, size_t len, size_t i, int *state)
{
    unsigned char b = s[i];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;

    if (b < 0x80) {
        *state = 1;
        return 1;
    }
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 2;
        if (b == 0xE0)
            lo = 0xA0;
        else if (b == 0xED)
            hi = 0x9F; /* excludes the UTF-16 surrogates */
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3;
        if (b == 0xF0)
            lo = 0x90;
        else if (b == 0xF4)
            hi = 0x8F; /* nothing above U+10FFFF */
    } else {
        *state = 0; /* 80..C1 (continuation or overlong lead), F5..FF */
        return 1;
    }
    size_t k = 1;
    for (; k <= need; k++) {
        if (i + k >= len) {
            *state = 2;
            return k;
        }
        unsigned char c = s[i + k];
        if (c < lo || c > hi) {
            *state = 0;
            return k; /* the maximal subpart ends before the offending byte */
        }
        lo = 0x80;
        hi = 0xBF;
    }
    *state = 1;
    return k;
}

int proto_utf8_valid(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        int st;
        i += px_utf8_step(u, len, i, &st);
        if (st != 1)
            return 0;
    }
    return 1;
}

size_t proto_utf8_complete_prefix(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        int st;
        size_t k = px_utf8_step(u, len, i, &st);
        if (st == 2)
            return i;
        i += k;
    }
    return len;
}

char *proto_utf8_sanitize(const char *s, size_t len, size_t *out_len)
{
    const unsigned char *u = (const unsigned char *)s;
    /* Each replaced subpart is >= 1 byte and becomes 3 bytes: bound before
     * allocating. */
    if (len > (SIZE_MAX - 1) / 3)
        return NULL;
    size_t cap = 0, i = 0;
    while (i < len) {
        int st;
        size_t k = px_utf8_step(u, len, i, &st);
        cap += st == 1 ? k : 3;
        i += k;
    }
    char *d = px_malloc(cap + 1);
    if (!d)
        return NULL;
    size_t o = 0;
    i = 0;
    while (i < len) {
        int st;
        size_t k = px_utf8_step(u, len, i, &st);
        if (st == 1) {
            memcpy(d + o, s + i, k);
            o += k;
        } else {
            d[o++] = (char)0xEF;
            d[o++] = (char)0xBF;
            d[o++] = (char)0xBD;
        }
        i += k;
    }
    d[o] = '\0';
    if (out_len)
        *out_len = o;
    return d;
}

json_t *px_str(const char *s, size_t len)
{
    if (!s)
        return json_stringn_nocheck("", 0);
    if (proto_utf8_valid(s, len))
        return json_stringn_nocheck(s, len);
    size_t n;
    char *fixed = proto_utf8_sanitize(s, len, &n);
    if (!fixed)
        return NULL;
    json_t *j = json_stringn_nocheck(fixed, n);
    px_free(fixed);
    return j;
}

json_t *px_cstr_or_null(const char *s)
{
    return s ? px_str(s, strlen(s)) : json_null();
}

json_t *px_real(double v, double fallback)
{
    return json_real(isfinite(v) ? v : fallback);
}

int px_buf_append(const char *bytes, size_t size, void *data)
{
    px_buf_t *d = data;
    if (d->failed)
        return -1;
    if (size >= d->cap - d->n) {
        size_t cap = d->cap ? d->cap : 256;
        while (size >= cap - d->n) {
            if (cap > SIZE_MAX / 2) {
                d->failed = 1;
                return -1;
            }
            cap *= 2;
        }
        char *p = px_malloc(cap); /* jansson's allocator has no realloc */
        if (!p) {
            d->failed = 1;
            return -1;
        }
        if (d->n)
            memcpy(p, d->p, d->n);
        px_free(d->p);
        d->p = p;
        d->cap = cap;
    }
    memcpy(d->p + d->n, bytes, size);
    d->n += size;
    d->p[d->n] = '\0';
    return 0;
}

int px_buf_vprintf(px_buf_t *b, const char *fmt, va_list ap)
{
    char small[256];
    va_list again;
    va_copy(again, ap);
    int k = vsnprintf(small, sizeof small, fmt, ap);
    int rc = -1;
    if (k >= 0 && !b->failed) {
        if ((size_t)k < sizeof small) {
            rc = px_buf_append(small, (size_t)k, b);
        } else {
            /* longer than the stack buffer: format again into memory of its size */
            char *big = px_malloc((size_t)k + 1);
            if (big && vsnprintf(big, (size_t)k + 1, fmt, again) == k)
                rc = px_buf_append(big, (size_t)k, b);
            px_free(big);
        }
    }
    va_end(again);
    if (rc < 0)
        b->failed = 1;
    return rc;
}

int px_buf_printf(px_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = px_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

void px_value_text(json_t *v, char out[PX_VALUE_TEXT_MAX])
{
    if (json_is_real(v)) {
        /* the shortest form that reads back as the same double: 1e-300,
         * not 1.0000000000000001e-300 */
        double d = json_real_value(v);
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(out, PX_VALUE_TEXT_MAX, "%.*g", prec, d);
            if (strtod(out, NULL) == d)
                return;
        }
        return;
    }
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) {
        snprintf(out, PX_VALUE_TEXT_MAX, "%s", "(a value)");
        return;
    }
    size_t n = strlen(t);
    if (n < PX_VALUE_TEXT_MAX)
        memcpy(out, t, n + 1);
    else /* a long value is shown by its start, and says so */
        snprintf(out, PX_VALUE_TEXT_MAX, "%.*s...", PX_VALUE_TEXT_MAX - 4, t);
    /* jansson's allocator: json_dumps' text is freed like its other memory */
    px_free(t);
}

char *px_dump(json_t *root)
{
    if (!root)
        return NULL;
    px_buf_t d = {NULL, 0, 0, 0};
    /* 9 significant digits reproduce any float exactly (logprobs are floats). */
    int rc = json_dump_callback(root, px_buf_append, &d, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(root);
    if (rc != 0 || d.failed || !d.p) {
        px_free(d.p);
        return NULL;
    }
    return d.p;
}
