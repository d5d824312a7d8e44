/* Replays the grammar fuzz target's seed corpus (tests/fuzz/corpus/grammar)
 * in `make unit`, so inputs the fuzzer found stay fixed (tests/fuzz/fuzz_grammar.c). */
#include "tests/fuzz/fuzz_grammar.c"
#include "tests/unit/check.h"
#include "tests/fuzz/replay.h"

TEST(replay_corpus)
{
    fuzz_replay("grammar", 10);
}

int main(void)
{
    RUN(replay_corpus);
    return CHECK_DONE();
}
