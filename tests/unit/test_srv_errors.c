/* test_srv_errors.c — the one error space (core/err.h): every module's codes
 * lie in the module's own range, so no value means two things, and each
 * module's *_strerror knows all of its codes. */
#include "core/err.h"
#include "proto/proto.h"
#include "server/engine/engine.h"
#include "server/http/http.h"
#include "server/cli/http_client.h"
#include "server/store/prefix_cache.h"
#include "server/store/store.h"
#include "tests/unit/check.h"

typedef struct {
    const char *name;
    int value;
    const char *desc;
} code_t;

#define CODE_ROW_(name, val, desc) {#name, val, desc},

static const code_t core_codes[] = {CORE_ERRNO_MAP(CODE_ROW_)};
static const code_t proto_codes[] = {{"PROTO_EINVAL", PROTO_EINVAL, NULL},
                                     {"PROTO_ENOMEM", PROTO_ENOMEM, NULL}};
static const code_t http_codes[] = {SRV_HTTP_ERRNO_MAP(CODE_ROW_)};
static const code_t engine_codes[] = {SRV_ENGINE_ERRNO_MAP(CODE_ROW_)};
static const code_t store_codes[] = {SRV_STORE_ERRNO_MAP(CODE_ROW_)};
static const code_t prefix_codes[] = {SRV_PREFIX_ERRNO_MAP(CODE_ROW_)};
static const code_t hc_codes[] = {SRV_HC_ERRNO_MAP(CODE_ROW_)};

static void check_range(const code_t *c, size_t n, int hi, int lo, const char *(*str)(int))
{
    for (size_t i = 0; i < n; i++) {
        CHECK_MSG(c[i].value <= hi && c[i].value >= lo, "%s = %d outside %d..%d", c[i].name,
                  c[i].value, hi, lo);
        for (size_t j = 0; j < i; j++)
            CHECK_MSG(c[i].value != c[j].value, "%s and %s are both %d", c[i].name, c[j].name,
                      c[i].value);
        if (str)
            CHECK_MSG(strcmp(str(c[i].value), c[i].desc) == 0, "%s: '%s'", c[i].name,
                      str(c[i].value));
    }
}

#define N_(a) (sizeof(a) / sizeof(a)[0])

TEST(test_ranges)
{
    check_range(core_codes, N_(core_codes), -1, -99, core_strerror);
    check_range(proto_codes, N_(proto_codes), -101, -199, NULL);
    check_range(http_codes, N_(http_codes), -201, -299, NULL);
    check_range(engine_codes, N_(engine_codes), -301, -399, srv_engine_strerror);
    check_range(store_codes, N_(store_codes), -401, -499, srv_store_strerror);
    check_range(prefix_codes, N_(prefix_codes), -501, -599, srv_prefix_strerror);
    check_range(hc_codes, N_(hc_codes), -601, -699, srv_hc_strerror);
}

/* A code of another module is not one of this module's. */
TEST(test_foreign_codes_unknown)
{
    CHECK_STR_EQ(srv_store_strerror(SRV_ENGINE_EINVAL), "unknown error");
    CHECK_STR_EQ(srv_engine_strerror(CORE_EIO), "unknown error");
    CHECK_STR_EQ(core_strerror(SRV_STORE_ENOTFOUND), "unknown error");
    CHECK_STR_EQ(srv_hc_strerror(SRV_PREFIX_EEXIST), "unknown error");
}

int main(void)
{
    RUN(test_ranges);
    RUN(test_foreign_codes_unknown);
    return CHECK_DONE();
}
