/* Replays the HTTP fuzz target's seed corpus (tests/fuzz/corpus/http) in
 * `make unit`: every input through the real application's routes with the
 * tiny model (tests/fuzz/fuzz_http.c), then a clean shutdown whose loop
 * closes with no handle left. */
#include "tests/fuzz/fuzz_http.c"

#include "tests/unit/check.h"

#include "tests/fuzz/replay.h"

TEST(replay_corpus)
{
    fuzz_replay("http", 10);
}

TEST(shutdown_clean)
{
    CHECK(fuzz_http_shutdown() == 0);
}

int main(void)
{
    RUN(replay_corpus);
    RUN(shutdown_clean);
    return CHECK_DONE();
}
