/* core_model_adapter_find / core_model_adapter_candidate (core/adapter_find.c):
 * which adapter file belongs to a model, by name, in a temporary folder. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/model.h"

static char dir[64];

static void touch(const char *rel)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    FILE *f = fopen(p, "wb");
    CHECK_MSG(f != NULL, "cannot create %s", p);
    if (f)
        fclose(f);
}

static void rm(const char *rel)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    CHECK_MSG(unlink(p) == 0 || rmdir(p) == 0, "cannot remove %s", p);
}

/* find on dir/model; returns rc, found path relative to dir in rel. */
static int find(const char *model, char *rel, size_t cap, core_error_t *err)
{
    char mp[256], out[CORE_MODEL_PATH_MAX];
    snprintf(mp, sizeof mp, "%s/%s", dir, model);
    int rc = core_model_adapter_find(mp, out, sizeof out, err);
    size_t dl = strlen(dir);
    if (rc == 0 && strncmp(out, dir, dl) == 0 && out[dl] == '/')
        snprintf(rel, cap, "%s", out + dl + 1);
    else
        snprintf(rel, cap, "%s", rc == 0 ? out : "");
    return rc;
}

TEST(candidates_by_name)
{
    char out[CORE_MODEL_PATH_MAX];
    CHECK_INT_EQ(core_model_adapter_candidate("models/M.Q4.gguf", 0, out, sizeof out), 0);
    CHECK_STR_EQ(out, "models/adapters/M.Q4.darkformer.gguf");
    CHECK_INT_EQ(core_model_adapter_candidate("models/M.Q4.gguf", 1, out, sizeof out), 0);
    CHECK_STR_EQ(out, "models/M.Q4.darkformer.gguf");
    /* no folder: relative to the working directory */
    CHECK_INT_EQ(core_model_adapter_candidate("m.gguf", 0, out, sizeof out), 0);
    CHECK_STR_EQ(out, "adapters/m.darkformer.gguf");
    CHECK_INT_EQ(core_model_adapter_candidate("m.gguf", 1, out, sizeof out), 0);
    CHECK_STR_EQ(out, "m.darkformer.gguf");
    /* only a trailing ".gguf" is dropped */
    CHECK_INT_EQ(core_model_adapter_candidate("/a/b.gguf.bin", 0, out, sizeof out), 0);
    CHECK_STR_EQ(out, "/a/adapters/b.gguf.bin.darkformer.gguf");
    CHECK_INT_EQ(core_model_adapter_candidate("/a.d/m", 1, out, sizeof out), 0);
    CHECK_STR_EQ(out, "/a.d/m.darkformer.gguf");
    CHECK_INT_EQ(core_model_adapter_candidate("/a/.gguf", 0, out, sizeof out), 0);
    CHECK_STR_EQ(out, "/a/adapters/.gguf.darkformer.gguf");

    CHECK_INT_EQ(core_model_adapter_candidate("m.gguf", 2, out, sizeof out), CORE_ENOTFOUND);
    CHECK_INT_EQ(core_model_adapter_candidate("m.gguf", -1, out, sizeof out), CORE_ENOTFOUND);
    CHECK_INT_EQ(core_model_adapter_candidate("", 0, out, sizeof out), CORE_EINVAL);
    CHECK_INT_EQ(core_model_adapter_candidate(NULL, 0, out, sizeof out), CORE_EINVAL);
    CHECK_INT_EQ(core_model_adapter_candidate("models/", 0, out, sizeof out), CORE_EINVAL);
    char small[20];
    CHECK_INT_EQ(core_model_adapter_candidate("models/M.gguf", 0, small, sizeof small),
                 CORE_ERANGE);
    CHECK_STR_EQ(small, "");
}

TEST(first_existing_regular_file_wins)
{
    char rel[CORE_MODEL_PATH_MAX];
    core_error_t err = {0};
    touch("M.gguf");

    /* none: the message names the model and both places */
    CHECK_INT_EQ(find("M.gguf", rel, sizeof rel, &err), CORE_ENOTFOUND);
    CHECK_INT_EQ(err.code, CORE_ENOTFOUND);
    CHECK_MSG(strstr(err.msg, "no DARKFormer adapter for ") &&
                  strstr(err.msg, "/M.gguf (looked for ") &&
                  strstr(err.msg, "/adapters/M.darkformer.gguf, ") &&
                  strstr(err.msg, "/M.darkformer.gguf)"),
              "message: %s", err.msg);

    /* beside the model */
    touch("M.darkformer.gguf");
    CHECK_INT_EQ(find("M.gguf", rel, sizeof rel, &err), 0);
    CHECK_STR_EQ(rel, "M.darkformer.gguf");

    /* adapters/ comes first */
    char sub[128];
    snprintf(sub, sizeof sub, "%s/adapters", dir);
    CHECK_INT_EQ(mkdir(sub, 0700), 0);
    touch("adapters/M.darkformer.gguf");
    CHECK_INT_EQ(find("M.gguf", rel, sizeof rel, &err), 0);
    CHECK_STR_EQ(rel, "adapters/M.darkformer.gguf");

    /* a folder of that name is not an adapter: the next place wins */
    rm("adapters/M.darkformer.gguf");
    snprintf(sub, sizeof sub, "%s/adapters/M.darkformer.gguf", dir);
    CHECK_INT_EQ(mkdir(sub, 0700), 0);
    CHECK_INT_EQ(find("M.gguf", rel, sizeof rel, &err), 0);
    CHECK_STR_EQ(rel, "M.darkformer.gguf");
    rm("adapters/M.darkformer.gguf");

    /* a symlink to a regular file counts; a dangling one does not */
    char target[256], link[256];
    snprintf(target, sizeof target, "%s/M.darkformer.gguf", dir);
    snprintf(link, sizeof link, "%s/adapters/M.darkformer.gguf", dir);
    CHECK_INT_EQ(symlink(target, link), 0);
    CHECK_INT_EQ(find("M.gguf", rel, sizeof rel, &err), 0);
    CHECK_STR_EQ(rel, "adapters/M.darkformer.gguf");
    rm("M.darkformer.gguf");
    CHECK_INT_EQ(find("M.gguf", rel, sizeof rel, &err), CORE_ENOTFOUND);
    rm("adapters/M.darkformer.gguf");

    /* another model's adapter is not this one's */
    touch("adapters/N.darkformer.gguf");
    CHECK_INT_EQ(find("M.gguf", rel, sizeof rel, &err), CORE_ENOTFOUND);
    CHECK_INT_EQ(find("N.gguf", rel, sizeof rel, &err), 0);
    CHECK_STR_EQ(rel, "adapters/N.darkformer.gguf");
    rm("adapters/N.darkformer.gguf");
    rm("adapters");
    rm("M.gguf");

    /* out too small for the found path, bad arguments */
    touch("M.darkformer.gguf");
    char mp[256], tiny_out[8];
    snprintf(mp, sizeof mp, "%s/M.gguf", dir);
    CHECK_INT_EQ(core_model_adapter_find(mp, tiny_out, sizeof tiny_out, &err), CORE_ERANGE);
    CHECK_INT_EQ(core_model_adapter_find("", rel, sizeof rel, &err), CORE_EINVAL);
    CHECK_INT_EQ(core_model_adapter_find(mp, rel, sizeof rel, NULL), 0);
    rm("M.darkformer.gguf");
}

TEST(path_too_long)
{
    char *p = malloc(CORE_MODEL_PATH_MAX + 16);
    char out[64];
    core_error_t err = {0};
    if (!p)
        return;
    memset(p, 'a', CORE_MODEL_PATH_MAX);
    memcpy(p + CORE_MODEL_PATH_MAX, ".gguf", 6);
    CHECK_INT_EQ(core_model_adapter_find(p, out, sizeof out, &err), CORE_ERANGE);
    CHECK(strstr(err.msg, "too long") != NULL);
    free(p);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/darkserve_adapter_find_XXXXXX");
    if (!mkdtemp(dir)) {
        printf("cannot make a temporary folder\n");
        return 1;
    }
    RUN(candidates_by_name);
    RUN(first_existing_regular_file_wins);
    RUN(path_too_long);
    rmdir(dir);
    return CHECK_DONE();
}
