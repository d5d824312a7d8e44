/* test_proto_values.c — what a refusal says about the value it refuses:
 * the field in `param`, the value given quoted in the message; sampler
 * numbers checked as the 32-bit floats the sampler holds (1e-300 is a
 * double above 0 but a float 0: it once passed proto and failed later with
 * no param); fields darkserve cannot honour refused on every route that
 * could carry them (Ollama's `tools` on /api/generate); error texts too long
 * for their fixed fields end with "..." instead of being cut silently.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "tests/unit/check.h"

static int chat(const char *extra, proto_error_t *e)
{
    char body[512];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]%s}", extra);
    proto_chat_req_t r;
    memset(e, 0, sizeof *e);
    int rc = proto_chat_parse(body, strlen(body), NULL, &r, e);
    proto_chat_free(&r);
    return rc;
}

static int ollama(const char *body, int is_chat, proto_error_t *e)
{
    proto_ollama_req_t r;
    proto_limits_t lim = {.max_tokens_limit = 1000, .n_vocab = 100};
    memset(e, 0, sizeof *e);
    int rc = proto_ollama_parse(body, strlen(body), is_chat, &lim, &r, e);
    proto_ollama_free(&r);
    return rc;
}

TEST(sampler_numbers_are_floats)
{
    static const struct {
        const char *extra, *param, *msg;
    } c[] = {
        {",\"repeat_penalty\":1e-300", "repeat_penalty",
         "(got 1e-300, which is 0 as the sampler's 32-bit float)"},
        {",\"repeat_penalty\":1e300", "repeat_penalty", "at most 3.4e38 (got 1e+300)"},
        {",\"repeat_penalty\":0", "repeat_penalty", "greater than 0 and at most 3.4e38 (got 0)"},
        {",\"top_p\":1e-60", "top_p", "(got 1e-60, which is 0 as the sampler's 32-bit float)"},
        {",\"temperature\":\"hot\"", "temperature", "between 0 and 2 (got \"hot\")"},
        {",\"top_k\":1.5", "top_k", "(got 1.5)"},
        {",\"stream\":1", "stream", "must be a boolean (got 1)"},
    };
    proto_error_t e;
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        CHECK_MSG(chat(c[i].extra, &e) == PROTO_EINVAL, "%s", c[i].extra);
        CHECK_INT_EQ(e.status, 400);
        CHECK_STR_EQ(e.param, c[i].param);
        CHECK_MSG(strstr(e.message, c[i].msg) != NULL, "%s: %s", c[i].extra, e.message);
    }
    /* what a float holds is taken: the smallest normal and a denormal
     * above 0, min_p 1e-300 (0 is allowed there) */
    CHECK(chat(",\"repeat_penalty\":1.2e-38", &e) == 0);
    CHECK(chat(",\"repeat_penalty\":1e-44", &e) == 0);
    CHECK(chat(",\"min_p\":1e-300", &e) == 0);
    /* the same on Ollama's options, param named as the client wrote it */
    CHECK(ollama("{\"model\":\"m\",\"options\":{\"repeat_penalty\":1e-300}}", 0, &e) ==
          PROTO_EINVAL);
    CHECK_STR_EQ(e.param, "options.repeat_penalty");
    CHECK_MSG(strstr(e.message, "got 1e-300") != NULL, "%s", e.message);
    CHECK(ollama("{\"model\":\"m\",\"options\":{\"top_k\":\"40\"}}", 0, &e) == PROTO_EINVAL);
    CHECK_STR_EQ(e.param, "options.top_k");
    CHECK_MSG(strstr(e.message, "(got \"40\")") != NULL, "%s", e.message);
}

/* /api/generate has no tools, like /api/chat: any non-empty value is 400. */
TEST(ollama_tools_on_generate)
{
    static const char *const bad[] = {"42", "\"x\"", "true", "[{\"type\":\"function\"}]",
                                      "{\"a\":1}"};
    proto_error_t e;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        for (int is_chat = 0; is_chat < 2; is_chat++) {
            char body[256];
            snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"p\",\"tools\":%s}", bad[i]);
            CHECK_MSG(ollama(body, is_chat, &e) == PROTO_EINVAL, "%s", body);
            CHECK_INT_EQ(e.status, 400);
            CHECK_STR_EQ(e.code, "unsupported_parameter");
            CHECK_STR_EQ(e.param, "tools");
            CHECK_MSG(strstr(e.message, "got ") != NULL, "%s", e.message);
        }
    }
    static const char *const empty[] = {"null", "false", "\"\"", "[]", "{}"};
    for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"p\",\"tools\":%s}", empty[i]);
        CHECK_MSG(ollama(body, 0, &e) == 0, "%s: %s", body, e.message);
    }
}

/* A quoted value is shown by its start when long; an error's message and
 * param, fixed-size fields, end with "..." when their text was longer. */
TEST(cuts_are_marked)
{
    char extra[400];
    char big[300];
    memset(big, 'z', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    snprintf(extra, sizeof extra, ",\"temperature\":\"%s\"", big);
    proto_error_t e;
    CHECK(chat(extra, &e) == PROTO_EINVAL);
    CHECK_MSG(strstr(e.message, "(got \"zzz") && strstr(e.message, "...)"), "%s", e.message);

    char longer[PROTO_ERROR_MSG_MAX * 2];
    memset(longer, 'm', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    char param[PROTO_ERROR_PARAM_MAX * 2];
    memset(param, 'p', sizeof param - 1);
    param[sizeof param - 1] = '\0';
    proto_error_set(&e, PROTO_ERR_INVALID_VALUE, param, "%s", longer);
    size_t ml = strlen(e.message), pl = strlen(e.param);
    CHECK_INT_EQ(ml, PROTO_ERROR_MSG_MAX - 1);
    CHECK(strcmp(e.message + ml - 3, "...") == 0);
    CHECK_INT_EQ(pl, PROTO_ERROR_PARAM_MAX - 1);
    CHECK(strcmp(e.param + pl - 3, "...") == 0);
    /* what fits is kept whole */
    proto_error_set(&e, PROTO_ERR_INVALID_VALUE, "tools", "short");
    CHECK_STR_EQ(e.message, "short");
    CHECK_STR_EQ(e.param, "tools");
}

int main(void)
{
    RUN(sampler_numbers_are_floats);
    RUN(ollama_tools_on_generate);
    RUN(cuts_are_marked);
    return CHECK_DONE();
}
