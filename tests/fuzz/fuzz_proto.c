/* fuzz_proto.c — libFuzzer target for proto/: the input bytes go to every
 * request parser (as a body, and split into query pairs for the session list),
 * to the UTF-8 functions and to the framers; whatever parses is fed back into
 * the response builders, whose output must be valid JSON. Invariants that fail
 * abort(), which libFuzzer and the corpus replay test both report.
 *
 * Build and run (about two minutes):
 *   clang -std=c11 -D_GNU_SOURCE -g -O1 -I. -fsanitize=fuzzer,address,undefined \
 *     tests/fuzz/fuzz_proto.c proto/[a-z]*.c -ljansson -o build/fuzz_proto
 *   ASAN_OPTIONS=malloc_context_size=0 build/fuzz_proto -max_total_time=120 \
 *     -max_len=4096 /tmp/corpus tests/fuzz/corpus/proto
 * tests/unit/test_proto_corpus.c replays tests/fuzz/corpus/proto in `make unit`.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "proto/proto_test.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_REQUIRE(cond)                                                                      \
    do {                                                                                        \
        if (!(cond))                                                                            \
            abort();                                                                            \
    } while (0)

/* Builder output must be one line of valid JSON (NUL escapes allowed). */
static void require_json(char *text)
{
    FUZZ_REQUIRE(text != NULL);
    FUZZ_REQUIRE(strchr(text, '\n') == NULL);
    json_t *j = json_loads(text, JSON_ALLOW_NUL, NULL);
    FUZZ_REQUIRE(j != NULL);
    json_decref(j);
    proto_free(text);
}

static void require_error(int rc, const proto_error_t *e)
{
    FUZZ_REQUIRE(rc == PROTO_EINVAL); /* no allocation failures here */
    FUZZ_REQUIRE(e->status == 400);
    FUZZ_REQUIRE(e->message[0] != '\0');
    FUZZ_REQUIRE(strlen(e->param) < sizeof e->param);
    require_json(proto_error_json(e));
}

static void check_params(const proto_gen_params_t *p, const proto_limits_t *lim)
{
    int64_t cap = lim->max_tokens_limit ? lim->max_tokens_limit : PROTO_DEFAULT_MAX_TOKENS_LIMIT;
    FUZZ_REQUIRE(p->max_tokens >= 1 && p->max_tokens <= cap);
    FUZZ_REQUIRE(p->n >= 1 && p->n <= PROTO_MAX_N);
    FUZZ_REQUIRE(p->sampling.temperature >= 0 && p->sampling.temperature <= 2);
    FUZZ_REQUIRE(p->sampling.top_p > 0 && p->sampling.top_p <= 1);
    FUZZ_REQUIRE(p->sampling.min_p >= 0 && p->sampling.min_p <= 1);
    FUZZ_REQUIRE(p->sampling.repeat_penalty > 0);
    FUZZ_REQUIRE(p->sampling.top_k >= 0);
    FUZZ_REQUIRE(p->logprobs >= -1 && p->logprobs <= PROTO_MAX_LOGPROBS);
    FUZZ_REQUIRE(p->n_stop <= PROTO_MAX_STOP);
    for (size_t i = 0; i < p->n_stop; i++)
        FUZZ_REQUIRE(strlen(p->stop[i]) >= 1 && strlen(p->stop[i]) <= PROTO_MAX_STOP_BYTES);
    FUZZ_REQUIRE(!p->session[0] || proto_session_id_valid(p->session, strlen(p->session)));
}

static void check_messages(const proto_message_t *m, size_t n)
{
    FUZZ_REQUIRE(n <= PROTO_MAX_MESSAGES);
    for (size_t i = 0; i < n; i++) {
        FUZZ_REQUIRE(m[i].role <= PROTO_ROLE_ASSISTANT);
        FUZZ_REQUIRE(strlen(m[i].content) == m[i].content_len);
    }
}

/* Echo parsed text through the builders that carry model text. */
static void build_with_text(const char *text, size_t len)
{
    proto_resp_meta_t meta = {"id", 1, "m", NULL};
    proto_top_logprob_t top = {text, len, 1, -1.0};
    proto_token_logprob_t lp = {text, len, 1, -0.5, 0, &top, 1};
    proto_choice_t c = {0, text, len, "stop", 1, &lp, 1};
    proto_usage_t u = {1, 1};
    proto_gen_token_t t = {text, len, 1, &lp};
    int32_t id = 1;
    require_json(proto_completion_json(&meta, &c, 1, &u));
    require_json(proto_chat_tools_json(&meta, &c, NULL, 1, &u));
    require_json(proto_chat_chunk_json(&meta, &c, 1, NULL));
    require_json(proto_generate_token_json(&t));
    require_json(proto_generate_session_json("id", text, len, &id, 1, &lp, "stop", &u, NULL, NULL));
    require_json(proto_tokenize_json(&id, 1, &text, &len));
    require_json(proto_detokenize_json(text, len));
}

static void fuzz_parsers(const char *body, size_t size, const proto_limits_t *lim)
{
    proto_error_t e;
    int rc;

    proto_completion_req_t cr;
    if ((rc = proto_completion_parse(body, size, lim, &cr, &e)) == 0) {
        check_params(&cr.p, lim);
        FUZZ_REQUIRE(cr.n_prompts >= 1 && cr.n_prompts <= PROTO_MAX_PROMPTS);
        for (size_t i = 0; i < cr.n_prompts; i++) {
            const proto_prompt_t *p = &cr.prompts[i];
            FUZZ_REQUIRE((p->text != NULL) != (p->tokens != NULL));
            if (p->text && i == 0)
                build_with_text(p->text, p->text_len);
            for (size_t k = 0; k < p->n_tokens; k++)
                FUZZ_REQUIRE(p->tokens[k] >= 0 && (!lim->n_vocab || p->tokens[k] < lim->n_vocab));
        }
    } else {
        require_error(rc, &e);
    }
    proto_completion_free(&cr);

    proto_chat_req_t ch;
    if ((rc = proto_chat_parse(body, size, lim, &ch, &e)) == 0) {
        check_params(&ch.p, lim);
        FUZZ_REQUIRE(ch.n_messages >= 1);
        check_messages(ch.messages, ch.n_messages);
        build_with_text(ch.messages[0].content, ch.messages[0].content_len);
    } else {
        require_error(rc, &e);
    }
    proto_chat_free(&ch);

    proto_chat_req_t ms;
    if ((rc = proto_messages_parse(body, size, lim, &ms, &e)) == 0) {
        check_params(&ms.p, lim);
        FUZZ_REQUIRE(ms.n_messages >= 1);
        check_messages(ms.messages, ms.n_messages);
    } else {
        require_error(rc, &e);
    }
    proto_chat_free(&ms);

    proto_responses_req_t rs;
    if ((rc = proto_responses_parse(body, size, lim, &rs, &e)) == 0) {
        check_params(&rs.chat.p, lim);
        FUZZ_REQUIRE(rs.chat.n_messages >= 1 && rs.echo != NULL);
        check_messages(rs.chat.messages, rs.chat.n_messages);
    } else {
        require_error(rc, &e);
        FUZZ_REQUIRE(rs.echo == NULL);
    }
    proto_responses_free(&rs);

    proto_session_create_req_t sc;
    if ((rc = proto_session_create_parse(body, size, lim, &sc, &e)) == 0) {
        FUZZ_REQUIRE(!(sc.system && sc.messages));
        check_messages(sc.messages, sc.n_messages);
    } else {
        require_error(rc, &e);
    }
    proto_session_create_free(&sc);

    proto_session_append_req_t sa;
    if ((rc = proto_session_append_parse(body, size, lim, &sa, &e)) == 0) {
        FUZZ_REQUIRE((sa.text != NULL) != (sa.messages != NULL));
        check_messages(sa.messages, sa.n_messages);
    } else {
        require_error(rc, &e);
    }
    proto_session_append_free(&sa);

    proto_generate_req_t g;
    if ((rc = proto_generate_parse(body, size, lim, &g, &e)) == 0) {
        check_params(&g.p, lim);
        FUZZ_REQUIRE(g.p.n == 1);
        FUZZ_REQUIRE(!(g.text && g.messages));
        FUZZ_REQUIRE(g.format == PROTO_STREAM_NDJSON || g.format == PROTO_STREAM_SSE);
        if (g.text)
            build_with_text(g.text, g.text_len);
    } else {
        require_error(rc, &e);
    }
    proto_generate_free(&g);

    proto_tokenize_req_t tk;
    if ((rc = proto_tokenize_parse(body, size, lim, &tk, &e)) == 0)
        FUZZ_REQUIRE(tk.text && strlen(tk.text) == tk.text_len);
    else
        require_error(rc, &e);
    proto_tokenize_free(&tk);

    proto_detokenize_req_t dt;
    if ((rc = proto_detokenize_parse(body, size, lim, &dt, &e)) == 0) {
        for (size_t k = 0; k < dt.n_tokens; k++)
            FUZZ_REQUIRE(dt.tokens[k] >= 0);
        require_json(proto_tokenize_json(dt.tokens, dt.n_tokens, NULL, NULL));
    } else {
        require_error(rc, &e);
    }
    proto_detokenize_free(&dt);
}

/* "k=v&k2&..." -> pairs (values not percent-decoded: the server does that). */
static void fuzz_query(const char *body, size_t size)
{
    char *q = malloc(size + 1);
    proto_kv_t kv[32];
    size_t n = 0;
    memcpy(q, body, size);
    q[size] = '\0';
    char *p = q;
    while (p && n < 32) {
        char *amp = strchr(p, '&');
        if (amp)
            *amp = '\0';
        char *eq = strchr(p, '=');
        if (eq)
            *eq = '\0';
        kv[n].key = p;
        kv[n].value = eq ? eq + 1 : NULL;
        n++;
        p = amp ? amp + 1 : NULL;
    }
    proto_session_list_req_t r;
    proto_error_t e;
    int rc = proto_session_list_parse(kv, n, &r, &e);
    if (rc == 0) {
        FUZZ_REQUIRE(r.limit >= 1 && r.limit <= PROTO_MAX_LIST_LIMIT);
        FUZZ_REQUIRE(!r.after[0] || proto_session_id_valid(r.after, strlen(r.after)));
    } else {
        require_error(rc, &e);
    }
    free(q);
}

static void fuzz_text(const char *s, size_t size)
{
    size_t n = 0;
    char *fixed = proto_utf8_sanitize(s, size, &n);
    FUZZ_REQUIRE(fixed && proto_utf8_valid(fixed, n) && fixed[n] == '\0');
    /* repairing is the identity on valid input, and idempotent */
    if (proto_utf8_valid(s, size))
        FUZZ_REQUIRE(n == size && memcmp(fixed, s, size) == 0);
    size_t n2 = 0;
    char *again = proto_utf8_sanitize(fixed, n, &n2);
    FUZZ_REQUIRE(again && n2 == n && memcmp(again, fixed, n) == 0);
    proto_free(again);
    proto_free(fixed);
    /* the complete prefix is valid up to where invalid bytes start, and the
     * held-back tail is shorter than one character */
    size_t cp = proto_utf8_complete_prefix(s, size);
    FUZZ_REQUIRE(cp <= size && size - cp <= 3);
    build_with_text(s, size);

    size_t fl;
    char *f = proto_frame(PROTO_STREAM_NDJSON, s, size, &fl);
    FUZZ_REQUIRE(f && fl == size + 1 && f[fl - 1] == '\n');
    for (size_t i = 0; i + 1 < fl; i++)
        FUZZ_REQUIRE(f[i] != '\n' && f[i] != '\r');
    proto_free(f);
    f = proto_frame(PROTO_STREAM_SSE, s, size, &fl);
    FUZZ_REQUIRE(f && fl >= 8 && !memcmp(f, "data: ", 6) && !memcmp(f + fl - 2, "\n\n", 2));
    /* exactly one blank line: at the end */
    for (size_t i = 0; i + 2 < fl; i++)
        FUZZ_REQUIRE(!(f[i] == '\n' && f[i + 1] == '\n'));
    proto_free(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data;
    proto_limits_t deflim = {0};
    /* small limits make the bound checks reachable with short inputs */
    proto_limits_t small = {8, 4, 50, 4, 16};
    fuzz_parsers(body, size, &deflim);
    fuzz_parsers(body, size, &small);
    fuzz_query(body, size);
    fuzz_text(body, size);
    return 0;
}
