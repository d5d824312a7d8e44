/* test_srv_http_route.c — the HTTP server's route table
 * (server/http/http_route.c) without a server or a socket: patterns, matching
 * with and without parameters, and the methods a route answers. */
#include "server/http/http_impl.h"
#include "tests/unit/check.h"

#include <stdlib.h>

static void req_params_free(srv_req_t *req)
{
    for (size_t i = 0; i < req->nparams; i++)
        free(req->pvals[i]);
    req->nparams = 0;
}

TEST(test_patterns)
{
    static const char *const bad[] = {"", "v1", "/v1//x", "/v1/{}", "/v1/{id", "/v1/a{b}",
                                      "/v1/x/"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        route_t r = {0};
        CHECK_MSG(srv_http_route_parse(&r, bad[i]) == SRV_HTTP_EINVAL, "'%s'", bad[i]);
        srv_http_route_clear(&r);
    }
    route_t r = {0};
    CHECK_INT_EQ(srv_http_route_parse(&r, "/"), 0);
    CHECK_INT_EQ(r.nsegs, 0);
    CHECK_INT_EQ(srv_http_route_match(&r, "/", NULL), 1);
    CHECK_INT_EQ(srv_http_route_match(&r, "/x", NULL), 0);
    srv_http_route_clear(&r);
}

TEST(test_match)
{
    route_t r = {0};
    CHECK_INT_EQ(srv_http_route_parse(&r, "/v1/sessions/{id}/state"), 0);
    CHECK_INT_EQ(r.nsegs, 4);
    CHECK_INT_EQ(srv_http_route_match(&r, "/v1/sessions/abc/state", NULL), 1);
    CHECK_INT_EQ(srv_http_route_match(&r, "/v1/sessions//state", NULL), 0);
    CHECK_INT_EQ(srv_http_route_match(&r, "/v1/sessions/abc/state/", NULL), 0);
    CHECK_INT_EQ(srv_http_route_match(&r, "/v1/sessions/abc", NULL), 0);
    CHECK_INT_EQ(srv_http_route_match(&r, "v1/sessions/abc/state", NULL), 0);
    CHECK_INT_EQ(srv_http_route_match(&r, "/v1/session/abc/state", NULL), 0);
    srv_req_t *req = calloc(1, sizeof *req);
    CHECK(req != NULL);
    if (req) {
        CHECK_INT_EQ(srv_http_route_match(&r, "/v1/sessions/0123abc/state", req), 1);
        CHECK_INT_EQ(req->nparams, 1);
        if (req->nparams == 1) {
            CHECK_STR_EQ(req->pnames[0], "id");
            CHECK_STR_EQ(req->pvals[0], "0123abc");
        }
        req_params_free(req);
        /* no match: no parameters */
        CHECK_INT_EQ(srv_http_route_match(&r, "/v1/sessions/x/y", req), 0);
        CHECK_INT_EQ(req->nparams, 0);
        free(req);
    }
    srv_http_route_clear(&r);
}

TEST(test_methods)
{
    route_t r = {0};
    r.method = "GET";
    CHECK(srv_http_method_matches(&r, "GET"));
    CHECK(srv_http_method_matches(&r, "HEAD"));
    CHECK(!srv_http_method_matches(&r, "POST"));
    r.method = "POST";
    CHECK(srv_http_method_matches(&r, "POST"));
    CHECK(!srv_http_method_matches(&r, "HEAD"));
}

int main(void)
{
    RUN(test_patterns);
    RUN(test_match);
    RUN(test_methods);
    return CHECK_DONE();
}
