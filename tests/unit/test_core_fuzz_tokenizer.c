/* Replays the tokenizer fuzz target's seed corpus (tests/fuzz/corpus/tokenizer) in
 * `make unit`, so inputs the fuzzer found stay fixed (tests/fuzz/fuzz_tokenizer.c). */
#include "tests/fuzz/fuzz_tokenizer.c"
#include "tests/unit/check.h"
#include "tests/fuzz/replay.h"

TEST(replay_corpus)
{
    fuzz_replay("tokenizer", 5);
}

int main(void)
{
    RUN(replay_corpus);
    return CHECK_DONE();
}
