/* tests/helpers/tokenize_dump.c — encodes a corpus with core/tokenizer and
 * prints one JSON line per input, for tests/reference/test_tokenizer.py.
 *
 *   tokenize_dump MODEL.gguf CORPUS.jsonl [--pre NAME] [--no-parse-special]
 *                 [--add-special]
 *     CORPUS: one JSON string per line. Output per line:
 *     {"i":N,"ids":[...],"rt":B,"dec":"hex","stream":"hex"}
 *       ids     the encoding (parse_special on unless --no-parse-special)
 *       dec     hex of decode(ids) with specials rendered and the SPM prefix
 *               space stripped (raw bytes)
 *       rt      dec equals the input bytes
 *       stream  hex of the streaming detokenizer's output, fed one id at a
 *               time with the same flags, then flushed
 *   tokenize_dump MODEL.gguf --bench FILE [REPEAT]
 *     encodes FILE (raw bytes) REPEAT times (default 5) and prints bytes,
 *     tokens, the best wall and thread-CPU seconds and tokens/s.
 *   tokenize_dump MODEL.gguf --info
 *     prints model kind, pre-tokenizer, special ids, warnings.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/gguf.h"
#include "core/text/tokenizer.h"

static int hexv(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static size_t put_utf8(unsigned long cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int read4(const char *s, unsigned long *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexv((unsigned char)s[i]);
        if (h < 0)
            return -1;
        *v = *v * 16 + (unsigned long)h;
    }
    return 0;
}

/* Parses the JSON string literal in line into out (room for strlen(line)
 * bytes); returns its length or -1. */
static long parse_json_string(const char *line, char *out)
{
    const char *p = line;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p++ != '"')
        return -1;
    size_t w = 0;
    while (*p && *p != '"') {
        if (*p != '\\') {
            out[w++] = *p++;
            continue;
        }
        p++;
        switch (*p) {
        case '"': out[w++] = '"'; break;
        case '\\': out[w++] = '\\'; break;
        case '/': out[w++] = '/'; break;
        case 'b': out[w++] = '\b'; break;
        case 'f': out[w++] = '\f'; break;
        case 'n': out[w++] = '\n'; break;
        case 'r': out[w++] = '\r'; break;
        case 't': out[w++] = '\t'; break;
        case 'u': {
            unsigned long cp, lo;
            if (read4(p + 1, &cp))
                return -1;
            p += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && p[1] == '\\' && p[2] == 'u' && read4(p + 3, &lo) == 0 &&
                lo >= 0xDC00 && lo < 0xE000) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            }
            w += put_utf8(cp, out + w);
            break;
        }
        default: return -1;
        }
        p++;
    }
    return *p == '"' ? (long)w : -1;
}

static double now_s(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(sz > 0 ? (size_t)sz : 1);
    if (b && sz > 0 && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *n = sz > 0 ? (size_t)sz : 0;
    return b;
}

static int bench(const core_tokenizer_t *t, const char *path, int repeat)
{
    size_t n;
    char *text = read_file(path, &n);
    if (!text) {
        fprintf(stderr, "cannot read %s\n", path);
        return 1;
    }
    double best = 1e30, best_cpu = 1e30;
    size_t n_ids = 0;
    for (int r = 0; r < repeat; r++) {
        int32_t *ids;
        core_error_t err = {0};
        double t0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_THREAD_CPUTIME_ID);
        if (core_tokenizer_encode_alloc(t, text, n, 0, CORE_TOK_MAX_IDS(n), CORE_TOK_PARSE_SPECIAL, &ids, &n_ids, &err)) {
            fprintf(stderr, "encode: %s\n", err.msg);
            free(text);
            return 1;
        }
        double dt = now_s(CLOCK_MONOTONIC) - t0, dc = now_s(CLOCK_THREAD_CPUTIME_ID) - c0;
        if (dt < best)
            best = dt;
        if (dc < best_cpu)
            best_cpu = dc;
        free(ids);
    }
    printf("{\"bytes\":%zu,\"tokens\":%zu,\"seconds\":%.6f,\"cpu_seconds\":%.6f,\"tokens_per_s\":%.0f,"
           "\"tokens_per_cpu_s\":%.0f,\"mb_per_s\":%.2f}\n",
           n, n_ids, best, best_cpu, (double)n_ids / best, (double)n_ids / best_cpu, (double)n / best / 1e6);
    free(text);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf CORPUS.jsonl [--pre NAME] [--no-parse-special] "
                        "[--add-special] | --bench FILE [REPEAT] | --info\n", argv[0]);
        return 2;
    }
    const char *pre = NULL;
    unsigned flags = CORE_TOK_PARSE_SPECIAL;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--pre") == 0 && i + 1 < argc)
            pre = argv[++i];
        else if (strcmp(argv[i], "--no-parse-special") == 0)
            flags &= ~CORE_TOK_PARSE_SPECIAL;
        else if (strcmp(argv[i], "--add-special") == 0)
            flags |= CORE_TOK_ADD_SPECIAL;
    }
    core_error_t err = {0};
    core_gguf_t *g = NULL;
    core_tokenizer_t *t = NULL;
    if (core_gguf_open(argv[1], &g, &err) || core_tokenizer_from_gguf_pre(g, pre, &t, &err)) {
        fprintf(stderr, "%s: %s\n", argv[1], err.msg);
        core_gguf_close(g);
        return 1;
    }
    core_gguf_close(g);
    int rc = 0;
    if (strcmp(argv[2], "--info") == 0) {
        printf("{\"model\":%d,\"pre\":\"%s\",\"n_vocab\":%d,\"bos\":%d,\"eos\":%d,\"eot\":%d,\"warnings\":\"",
               (int)core_tokenizer_model(t), core_tokenizer_pre_name(t), (int)core_tokenizer_n_vocab(t),
               (int)core_tokenizer_bos(t), (int)core_tokenizer_eos(t), (int)core_tokenizer_eot(t));
        for (const char *w = core_tokenizer_warnings(t); *w; w++)
            printf(*w == '"' || *w == '\\' ? "\\%c" : "%c", *w);
        printf("\"}\n");
        core_tokenizer_free(t);
        return 0;
    }
    if (strcmp(argv[2], "--bench") == 0) {
        rc = argc > 3 ? bench(t, argv[3], argc > 4 ? atoi(argv[4]) : 5) : 2;
        core_tokenizer_free(t);
        return rc;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", argv[2]);
        core_tokenizer_free(t);
        return 1;
    }
    size_t lcap = 1 << 16;
    char *line = malloc(lcap), *text = NULL, *dec = NULL, *st = NULL;
    int32_t *ids = NULL;
    size_t smax = core_tok_stream_max_out(t);
    char *chunk = malloc(smax);
    long ln = 0;
    while (line && chunk) {
        size_t len = 0;
        int c;
        while ((c = fgetc(f)) != EOF && c != '\n') {
            if (len + 1 >= lcap) {
                char *nl = realloc(line, lcap *= 2);
                if (!nl) {
                    rc = 1;
                    goto out;
                }
                line = nl;
            }
            line[len++] = (char)c;
        }
        if (c == EOF && len == 0)
            break;
        line[len] = 0;
        free(text);
        text = malloc(len + 1);
        long tl = text ? parse_json_string(line, text) : -1;
        if (tl < 0) {
            fprintf(stderr, "line %ld: not a JSON string\n", ln + 1);
            rc = 1;
            goto out;
        }
        size_t n_ids = 0;
        free(ids);
        ids = NULL;
        if (core_tokenizer_encode_alloc(t, text, (size_t)tl, 0, CORE_TOK_MAX_IDS(tl), flags, &ids, &n_ids, &err)) {
            fprintf(stderr, "line %ld: encode: %s\n", ln + 1, err.msg);
            rc = 1;
            goto out;
        }
        size_t dn = 0;
        unsigned dflags = CORE_TOK_DECODE_SPECIAL | CORE_TOK_DECODE_STRIP_PREFIX;
        core_tokenizer_decode(t, ids, n_ids, dflags, NULL, 0, &dn, NULL);
        free(dec);
        dec = malloc(dn + 1);
        free(st);
        st = malloc(3 * dn + smax + 1);
        if (!dec || !st || core_tokenizer_decode(t, ids, n_ids, dflags, dec, dn, &dn, &err)) {
            fprintf(stderr, "line %ld: decode failed\n", ln + 1);
            rc = 1;
            goto out;
        }
        /* the streaming detokenizer, fed one id at a time (each push may emit
         * up to smax bytes, so st has room for 3 bytes per decoded byte) */
        core_tok_stream_t stream;
        core_tok_stream_init(&stream, t, dflags);
        size_t sw = 0, k;
        for (size_t i = 0; i < n_ids; i++) {
            if (core_tok_stream_push(&stream, ids[i], chunk, smax, &k, &err)) {
                fprintf(stderr, "line %ld: stream: %s\n", ln + 1, err.msg);
                rc = 1;
                goto out;
            }
            memcpy(st + sw, chunk, k);
            sw += k;
        }
        if (core_tok_stream_flush(&stream, chunk, smax, &k, &err) == 0) {
            memcpy(st + sw, chunk, k);
            sw += k;
        }
        printf("{\"i\":%ld,\"ids\":[", ln);
        for (size_t i = 0; i < n_ids; i++)
            printf(i ? ",%d" : "%d", (int)ids[i]);
        printf("],\"rt\":%s,\"dec\":\"", dn == (size_t)tl && memcmp(dec, text, dn) == 0 ? "true" : "false");
        for (size_t i = 0; i < dn; i++)
            printf("%02x", (unsigned char)dec[i]);
        printf("\",\"stream\":\"");
        for (size_t i = 0; i < sw; i++)
            printf("%02x", (unsigned char)st[i]);
        printf("\"}\n");
        ln++;
    }
out:
    fclose(f);
    free(line);
    free(text);
    free(dec);
    free(st);
    free(chunk);
    free(ids);
    core_tokenizer_free(t);
    return rc;
}
