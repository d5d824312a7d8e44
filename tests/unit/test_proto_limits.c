/* test_proto_limits.c — hostile inputs (nesting bombs, huge arrays, huge counts)
 * are refused with a 400 naming the field, and every parser and builder
 * survives allocation failure at each point: it reports 500 / returns NULL and
 * leaks nothing (run under `make asan` for the leak check). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "tests/unit/check.h"

/* A growable byte buffer for building big bodies. */
typedef struct buf {
    char *p;
    size_t n, cap;
} buf_t;

static void put(buf_t *b, const char *s)
{
    size_t l = strlen(s);
    if (b->n + l + 1 > b->cap) {
        b->cap = (b->n + l + 1) * 2;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, l + 1);
    b->n += l;
}

static void putn(buf_t *b, const char *s, size_t times)
{
    for (size_t i = 0; i < times; i++)
        put(b, s);
}

TEST(nesting_bombs)
{
    /* 100k open brackets: refused before jansson recurses. */
    size_t n = 100000;
    char *body = malloc(n + 2);
    memset(body, '[', n);
    body[n] = '\0';
    proto_completion_req_t r;
    proto_error_t e;
    CHECK_INT_EQ(proto_completion_parse(body, n, NULL, &r, &e), PROTO_EINVAL);
    CHECK_INT_EQ(e.status, 400);
    CHECK(strstr(e.message, "deeper than 32") != NULL);
    memset(body, '{', n);
    proto_chat_req_t c0;
    CHECK_INT_EQ(proto_chat_parse(body, n, NULL, &c0, &e), PROTO_EINVAL);
    CHECK(strstr(e.message, "deeper than 32") != NULL);

    /* nesting hidden inside a message's content parts */
    buf_t b = {0};
    put(&b, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\",\"z\":");
    putn(&b, "[", 40);
    putn(&b, "]", 40);
    put(&b, "}]}]}");
    proto_chat_req_t c;
    CHECK_INT_EQ(proto_chat_parse(b.p, b.n, NULL, &c, &e), PROTO_EINVAL);
    CHECK(strstr(e.message, "deeper than 32") != NULL);
    free(b.p);
    free(body);
}

TEST(huge_arrays)
{
    proto_error_t e;
    buf_t b = {0};

    /* 1025 messages */
    put(&b, "{\"messages\":[");
    for (int i = 0; i < 1025; i++)
        put(&b, i ? ",{\"role\":\"user\",\"content\":\"x\"}" : "{\"role\":\"user\",\"content\":\"x\"}");
    put(&b, "]}");
    proto_chat_req_t c;
    CHECK_INT_EQ(proto_chat_parse(b.p, b.n, NULL, &c, &e), PROTO_EINVAL);
    CHECK_STR_EQ(e.param, "messages");
    CHECK(strstr(e.message, "at most 1024") != NULL);
    /* 1024 is accepted */
    b.n = 0;
    put(&b, "{\"messages\":[");
    for (int i = 0; i < 1024; i++)
        put(&b, i ? ",{\"role\":\"user\",\"content\":\"x\"}" : "{\"role\":\"user\",\"content\":\"x\"}");
    put(&b, "]}");
    CHECK_INT_EQ(proto_chat_parse(b.p, b.n, NULL, &c, &e), 0);
    CHECK_INT_EQ(c.n_messages, 1024);
    proto_chat_free(&c);

    /* 2M token ids: over the default 1M prompt bound */
    b.n = 0;
    put(&b, "{\"prompt\":[1");
    putn(&b, ",1", 2 * 1024 * 1024);
    put(&b, "]}");
    proto_completion_req_t r;
    CHECK_INT_EQ(proto_completion_parse(b.p, b.n, NULL, &r, &e), PROTO_EINVAL);
    CHECK_STR_EQ(e.param, "prompt");
    CHECK(strstr(e.message, "at most 1048576") != NULL);

    /* 10k stop strings */
    b.n = 0;
    put(&b, "{\"prompt\":\"x\",\"stop\":[\"a\"");
    putn(&b, ",\"a\"", 10000);
    put(&b, "]}");
    CHECK_INT_EQ(proto_completion_parse(b.p, b.n, NULL, &r, &e), PROTO_EINVAL);
    CHECK_STR_EQ(e.param, "stop");

    /* 100k content parts */
    b.n = 0;
    put(&b, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"}");
    putn(&b, ",{\"type\":\"text\",\"text\":\"a\"}", 100000);
    put(&b, "]}]}");
    CHECK_INT_EQ(proto_chat_parse(b.p, b.n, NULL, &c, &e), PROTO_EINVAL);
    CHECK_STR_EQ(e.param, "messages[0].content");
    CHECK(strstr(e.message, "at most 256") != NULL);

    /* 100k detokenize ids over a small caller bound */
    b.n = 0;
    put(&b, "{\"tokens\":[0");
    putn(&b, ",0", 100000);
    put(&b, "]}");
    proto_limits_t lim = {0};
    lim.max_prompt_tokens = 65536;
    proto_detokenize_req_t d;
    CHECK_INT_EQ(proto_detokenize_parse(b.p, b.n, &lim, &d, &e), PROTO_EINVAL);
    CHECK(strstr(e.message, "at most 65536") != NULL);

    /* a 9 MiB string over the 8 MiB default text bound */
    b.n = 0;
    put(&b, "{\"text\":\"");
    putn(&b, "abcdefghijklmnop", (9u << 20) / 16);
    put(&b, "\"}");
    proto_tokenize_req_t t;
    CHECK_INT_EQ(proto_tokenize_parse(b.p, b.n, NULL, &t, &e), PROTO_EINVAL);
    CHECK_STR_EQ(e.param, "text");

    /* many unknown keys are just ignored */
    b.n = 0;
    put(&b, "{\"prompt\":\"x\"");
    for (int i = 0; i < 20000; i++) {
        char k[40];
        snprintf(k, sizeof k, ",\"k%d\":%d", i, i);
        put(&b, k);
    }
    put(&b, "}");
    CHECK_INT_EQ(proto_completion_parse(b.p, b.n, NULL, &r, &e), 0);
    proto_completion_free(&r);
    free(b.p);
}

TEST(free_is_null_safe)
{
    proto_completion_free(NULL);
    proto_chat_free(NULL);
    proto_session_create_free(NULL);
    proto_session_append_free(NULL);
    proto_generate_free(NULL);
    proto_tokenize_free(NULL);
    proto_detokenize_free(NULL);
    proto_free(NULL);
    /* and freeing twice after a free is harmless (the struct is zeroed) */
    proto_chat_req_t c;
    proto_error_t e;
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\"]}";
    CHECK_INT_EQ(proto_chat_parse(body, strlen(body), NULL, &c, &e), 0);
    proto_chat_free(&c);
    proto_chat_free(&c);
}

/* ------------------------------------------------- allocation failures */

static long alloc_countdown; /* fail when it reaches 0; < 0 = never */
static long alloc_calls;
static int alloc_paused; /* the test's own parsing: neither counted nor failed */

static void *failing_malloc(size_t n)
{
    if (alloc_paused)
        return malloc(n);
    alloc_calls++;
    if (alloc_countdown >= 0 && alloc_countdown-- == 0)
        return NULL;
    return malloc(n);
}

static void failing_free(void *p)
{
    free(p);
}

/* One operation under test: returns 1 on success, 0 on a clean failure. */
typedef int (*op_fn)(void);

static const char chat_body[] =
    "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\","
    "\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}],"
    "\"stop\":[\"x\",\"y\"],\"logprobs\":true,\"top_logprobs\":2,\"seed\":1}";
static const char completion_body[] =
    "{\"model\":\"m\",\"prompt\":[[1,2],[3]],\"stop\":\"s\",\"max_tokens\":4}";
static const char completion_text_body[] = "{\"prompt\":[\"ab\",\"cd\"],\"user\":\"u\"}";
static const char generate_body[] =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"stream_format\":\"sse\",\"stop\":[\"z\"]}";

static int err_ok(int rc, const proto_error_t *e)
{
    if (rc == 0)
        return 1;
    /* jansson may report a failed allocation while lexing as a parse error,
     * so either 400 or 500 is a clean failure; anything else is a bug. */
    CHECK_MSG(rc == PROTO_ENOMEM || rc == PROTO_EINVAL, "rc %d", rc);
    CHECK_MSG(e->status == 500 || e->status == 400, "status %d", e->status);
    return 0;
}

static int op_chat(void)
{
    proto_chat_req_t r;
    proto_error_t e;
    int rc = proto_chat_parse(chat_body, sizeof chat_body - 1, NULL, &r, &e);
    if (rc == 0) {
        CHECK_INT_EQ(r.n_messages, 2);
        CHECK_STR_EQ(r.messages[1].content, "a\nb");
    }
    proto_chat_free(&r);
    return err_ok(rc, &e);
}

static int op_completion(void)
{
    proto_completion_req_t r;
    proto_error_t e;
    int rc = proto_completion_parse(completion_body, sizeof completion_body - 1, NULL, &r, &e);
    if (rc == 0)
        CHECK_INT_EQ(r.n_prompts, 2);
    proto_completion_free(&r);
    int ok = err_ok(rc, &e);
    rc = proto_completion_parse(completion_text_body, sizeof completion_text_body - 1, NULL, &r,
                                &e);
    proto_completion_free(&r);
    return ok && err_ok(rc, &e);
}

static int op_generate(void)
{
    proto_generate_req_t r;
    proto_error_t e;
    int rc = proto_generate_parse(generate_body, sizeof generate_body - 1, NULL, &r, &e);
    proto_generate_free(&r);
    return err_ok(rc, &e);
}

static int op_sessions_tokenize(void)
{
    proto_error_t e;
    proto_session_create_req_t c;
    proto_session_append_req_t a;
    proto_tokenize_req_t t;
    proto_detokenize_req_t d;
    int ok = 1;
    ok &= err_ok(proto_session_create_parse("{\"system\":\"s\"}", 14, NULL, &c, &e), &e);
    proto_session_create_free(&c);
    ok &= err_ok(proto_session_create_parse("", 0, NULL, &c, &e), &e);
    proto_session_create_free(&c);
    ok &= err_ok(proto_session_append_parse("{\"text\":\"s\"}", 12, NULL, &a, &e), &e);
    proto_session_append_free(&a);
    ok &= err_ok(proto_tokenize_parse("{\"content\":\"s\"}", 15, NULL, &t, &e), &e);
    proto_tokenize_free(&t);
    ok &= err_ok(proto_detokenize_parse("{\"tokens\":[1,2]}", 16, NULL, &d, &e), &e);
    proto_detokenize_free(&d);
    return ok;
}

static const proto_top_logprob_t tops[] = {{"a", 1, 1, -0.5}, {"\xe2\x82", 2, 2, -1.0}};
static const proto_token_logprob_t lps[] = {{"a", 1, 1, -0.5, 0, tops, 2},
                                            {"\xe2\x82", 2, 2, -1.0, 1, tops, 2}};

/* Each builder: NULL (clean) or valid JSON. Returns 1 only if all succeeded. */
static int op_builders(void)
{
    proto_resp_meta_t meta = {"id", 1, "m", NULL};
    proto_choice_t ch = {0, "a\xe2\x82", 3, "stop", 1, lps, 2};
    proto_usage_t u = {1, 2};
    proto_timings_t tm = {1, 2, 3};
    const proto_checkpoint_t ck = {1, 2, 3};
    proto_session_info_t si = {"0123456789abcdef0123456789abcdef", 1, 2, 3, 4, "exact", 0, 0,
                               2, &ck, 1, 0, 0, 0, 0, NULL, 0, NULL};
    proto_model_entry_t me = {"m", 1, "o"};
    proto_health_t h = {"ok", "m", 1, 2, 3.0, NULL, NULL, 0};
    proto_gen_token_t gt = {"a", 1, 1, &lps[0]};
    int32_t ids[2] = {1, 2};
    const char *pieces[2] = {"a", "\xe2"};
    size_t plens[2] = {1, 1};
    proto_error_t e;
    proto_error_set(&e, PROTO_ERR_CONFLICT, "session", "busy");
    char *outs[16];
    size_t n = 0, fl;
    outs[n++] = proto_completion_json(&meta, &ch, 1, &u);
    outs[n++] = proto_completion_chunk_json(&meta, &ch, &u);
    outs[n++] = proto_chat_tools_json(&meta, &ch, NULL, 1, &u);
    outs[n++] = proto_chat_chunk_json(&meta, &ch, 1, &u);
    outs[n++] = proto_session_json(&si, 1);
    outs[n++] = proto_session_list_json(&si, 1, 1);
    outs[n++] = proto_generate_token_json(&gt);
    outs[n++] = proto_generate_done_session_json("stop", &u, &tm, &si);
    outs[n++] = proto_generate_session_json("id", "ab", 2, ids, 2, lps, "stop", &u, &tm, &si);
    outs[n++] = proto_models_json(&me, 1);
    outs[n++] = proto_tokenize_json(ids, 2, pieces, plens);
    outs[n++] = proto_detokenize_json("ab", 2);
    outs[n++] = proto_health_json(&h);
    outs[n++] = proto_error_json(&e);
    outs[n++] = proto_frame_error(PROTO_STREAM_SSE, &e, &fl);
    outs[n++] = proto_frame(PROTO_STREAM_NDJSON, "{}", 2, &fl);
    int all = 1;
    for (size_t i = 0; i < n; i++) {
        if (!outs[i]) {
            all = 0;
            continue;
        }
        /* frames are not bare JSON; check the rest parse */
        if (i < 14) {
            alloc_paused = 1;
            json_t *j = json_loads(outs[i], 0, NULL);
            CHECK_MSG(j != NULL, "builder %zu produced invalid JSON: %s", i, outs[i]);
            json_decref(j);
            alloc_paused = 0;
        }
        proto_free(outs[i]);
    }
    return all;
}

static void sweep(const char *name, op_fn op)
{
    json_malloc_t om;
    json_free_t of;
    json_get_alloc_funcs(&om, &of);
    json_set_alloc_funcs(failing_malloc, failing_free);
    alloc_countdown = -1;
    alloc_calls = 0;
    CHECK_MSG(op(), "%s fails without injected failures", name);
    long total = alloc_calls;
    CHECK(total > 0);
    int failures = 0;
    for (long k = 0; k < total; k++) {
        alloc_countdown = k;
        if (!op())
            failures++;
    }
    alloc_countdown = -1;
    CHECK_MSG(op(), "%s fails after the sweep", name);
    json_set_alloc_funcs(om, of);
    CHECK_MSG(failures > 0, "%s: no injected failure was observed", name);
    printf("  %s: %ld allocation points, %d failed cleanly\n", name, total, failures);
}

TEST(allocation_failures)
{
    sweep("chat_parse", op_chat);
    sweep("completion_parse", op_completion);
    sweep("generate_parse", op_generate);
    sweep("session+tokenize parse", op_sessions_tokenize);
    sweep("builders", op_builders);
}

int main(void)
{
    RUN(nesting_bombs);
    RUN(huge_arrays);
    RUN(free_is_null_safe);
    RUN(allocation_failures);
    return CHECK_DONE();
}
