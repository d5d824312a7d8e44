/* Replays the adapter fuzz target's seed corpus (tests/fuzz/corpus/adapter) in
 * `make unit`, so inputs the fuzzer found stay fixed (tests/fuzz/fuzz_adapter.c). */
#include "tests/fuzz/fuzz_adapter.c"
#include "tests/unit/check.h"
#include "tests/fuzz/replay.h"

TEST(replay_corpus)
{
    fuzz_replay("adapter", 5);
}

int main(void)
{
    RUN(replay_corpus);
    return CHECK_DONE();
}
