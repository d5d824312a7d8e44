/* tests/fuzz/replay.h — replays a seed corpus through a fuzz target's
 * LLVMFuzzerTestOneInput without libFuzzer, for `make unit`: every file of
 * tests/fuzz/corpus/<name> whole and cut at about eight lengths (truncated
 * input is what a dropped connection or a hostile client sends). Include it
 * after the target and tests/unit/check.h. The corpus directory is
 * $DARKSERVE_DATA/../fuzz/corpus/<name>, or tests/fuzz/corpus/<name> from
 * the repository root. */
#ifndef DARKSERVE_TESTS_FUZZ_REPLAY_H
#define DARKSERVE_TESTS_FUZZ_REPLAY_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static unsigned char *fuzz_read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0, r;
    unsigned char *b = malloc(cap);
    while (b && (r = fread(b + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            unsigned char *nb = realloc(b, cap *= 2);
            if (!nb) {
                free(b);
                b = NULL;
            }
            b = nb;
        }
    }
    fclose(f);
    *len = n;
    return b;
}

/* Runs the corpus; CHECKs that it holds at least min_files files. A broken
 * invariant aborts inside the target (the file being run is printed first). */
static void fuzz_replay(const char *name, int min_files)
{
    const char *data = getenv("DARKSERVE_DATA");
    char dir[1024];
    if (data && data[0])
        snprintf(dir, sizeof dir, "%.900s/../fuzz/corpus/%s", data, name);
    else
        snprintf(dir, sizeof dir, "tests/fuzz/corpus/%s", name);
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
        unsigned char *b = fuzz_read_all(path, &len);
        CHECK_MSG(b != NULL, "cannot read %s", path);
        if (!b)
            continue;
        fprintf(stderr, "%s\r", path); /* names the culprit if the target aborts */
        size_t step = len > 8 ? len / 8 : 1;
        for (size_t cut = 0; cut < len; cut += step, runs++)
            LLVMFuzzerTestOneInput(b, cut);
        LLVMFuzzerTestOneInput(b, len);
        runs++;
        free(b);
        files++;
    }
    closedir(d);
    printf("  %s: %d corpus files, %ld runs\n", name, files, runs);
    CHECK_MSG(files >= min_files, "%s: %d corpus files, expected at least %d", dir, files,
              min_files);
}

#endif
