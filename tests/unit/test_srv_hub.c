/* test_srv_hub.c — the names requests give models (server/api/api_hub.c):
 * a model answers to its id and its short name, in any case, with or
 * without Ollama's ":latest"; nothing else; and the list of names errors
 * quote. Without a hub an app is the only model. */
#include "server/api/api.h"
#include "tests/unit/check.h"

#include <string.h>

TEST(test_names)
{
    api_app_t a;
    memset(&a, 0, sizeof a);
    snprintf(a.model_id, sizeof a.model_id, "%s", "gemma-3-270m-q4_k_m");
    snprintf(a.model_alias, sizeof a.model_alias, "%s", "gemma3-270m");
    static const char *const yes[] = {"gemma-3-270m-q4_k_m", "GEMMA-3-270M-Q4_K_M",
                                      "gemma-3-270m-q4_k_m:latest", "gemma3-270m",
                                      "Gemma3-270M:LATEST"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        CHECK(api_model_named(&a, yes[i]));
    static const char *const no[] = {"gemma",           "gemma3-270m:1b", "gemma3-270m ",
                                     "gemma3-270mx",    "",               ":latest",
                                     "gemma3-270m:",    "gemma-3-270m",   "smollm2-135m",
                                     "gemma3-270m:latest:latest"};
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        CHECK(!api_model_named(&a, no[i]));
    /* no short name: "" never matches */
    a.model_alias[0] = '\0';
    CHECK(!api_model_named(&a, ""));
    CHECK(!api_model_named(&a, ":latest"));
    CHECK(api_model_named(&a, "gemma-3-270m-q4_k_m"));
}

TEST(test_one_model_is_its_own_list)
{
    api_app_t a;
    memset(&a, 0, sizeof a);
    snprintf(a.model_id, sizeof a.model_id, "%s", "tiny");
    CHECK(api_hub_count(&a) == 1);
    CHECK(api_hub_app(&a, 0) == &a);
    char names[64];
    api_model_names(&a, names, sizeof names);
    CHECK_STR_EQ(names, "'tiny'");
    char small[4]; /* cut, still terminated */
    api_model_names(&a, small, sizeof small);
    CHECK(strlen(small) < sizeof small);
}

int main(void)
{
    RUN(test_names);
    RUN(test_one_model_is_its_own_list);
    return CHECK_DONE();
}
