/* test_proto_corpus.c — replays the fuzz corpus (tests/fuzz/corpus/proto) through
 * the fuzz target's entry point, whole and cut at every length, so inputs the
 * fuzzer found stay fixed. The target aborts on a broken invariant. The corpus
 * directory is $DARKSERVE_DATA/../fuzz/corpus/proto, or tests/fuzz/corpus/proto
 * from the repository root. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz_proto.c"
#include "tests/unit/check.h"
#include "tests/unit/helpers.h"

TEST(replay_corpus)
{
    const char *data = getenv("DARKSERVE_DATA");
    char dir[1024];
    if (data && data[0])
        snprintf(dir, sizeof dir, "%.900s/../fuzz/corpus/proto", data);
    else
        snprintf(dir, sizeof dir, "tests/fuzz/corpus/proto");
    DIR *d = opendir(dir);
    CHECK_MSG(d != NULL, "cannot open %s", dir);
    if (!d)
        return;
    int files = 0;
    long runs = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[2048];
        size_t len = 0;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        char *b = slurp(path, &len);
        CHECK_MSG(b != NULL, "cannot read %s", path);
        if (!b)
            continue;
        /* Every prefix too: truncated bodies are what a dropped connection
         * or a hostile client sends. At most ~8 cuts a file. */
        size_t step = len > 8 ? len / 8 : 1;
        for (size_t cut = 0; cut < len; cut += step, runs++)
            LLVMFuzzerTestOneInput((const uint8_t *)b, cut);
        LLVMFuzzerTestOneInput((const uint8_t *)b, len);
        runs++;
        free(b);
        files++;
    }
    closedir(d);
    printf("  %d corpus files, %ld runs\n", files, runs);
    CHECK(files >= 100);
}

int main(void)
{
    RUN(replay_corpus);
    return CHECK_DONE();
}
