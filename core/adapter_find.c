/* core/adapter_find.c — which DARKFormer adapter belongs to a model file, by
 * name (core_model_adapter_find in core/model.h).
 *
 * Only file names and stat(): nothing is opened or read here, so a caller
 * can say where it looked before anything slow happens. Whether the file
 * found really belongs to the model is core_model_load's check (the
 * adapter's darkformer.base_fingerprint against the model's fingerprint).
 */
#include "core/model.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define ADAPTER_SUFFIX ".darkformer.gguf"

/* Length of name without a trailing ".gguf" (the whole name otherwise). */
static size_t stem_len(const char *name)
{
    size_t n = strlen(name);
    return n > 5 && strcmp(name + n - 5, ".gguf") == 0 ? n - 5 : n;
}

int core_model_adapter_candidate(const char *model_path, int i, char *out, size_t cap)
{
    if (!model_path || !*model_path || !out || cap == 0)
        return CORE_EINVAL;
    const char *slash = strrchr(model_path, '/');
    const char *base = slash ? slash + 1 : model_path;
    if (!*base) /* "dir/": no file name */
        return CORE_EINVAL;
    int n;
    if (i == 0) {
        /* <dir>/adapters/<stem>.darkformer.gguf; dir is kept as written
         * (with its slash), so "m.gguf" gives "adapters/m.darkformer.gguf" */
        n = snprintf(out, cap, "%.*sadapters/%.*s" ADAPTER_SUFFIX, (int)(base - model_path),
                     model_path, (int)stem_len(base), base);
    } else if (i == 1) {
        n = snprintf(out, cap, "%.*s" ADAPTER_SUFFIX, (int)stem_len(model_path), model_path);
    } else {
        return CORE_ENOTFOUND;
    }
    if (n < 0 || (size_t)n >= cap) {
        out[0] = '\0';
        return CORE_ERANGE;
    }
    return 0;
}

int core_model_adapter_find(const char *model_path, char *out, size_t cap, core_error_t *err)
{
    if (!model_path || !*model_path || !out || cap == 0)
        return core_error_set(err, CORE_EINVAL, "no model path to look for an adapter beside");
    char cand[CORE_MODEL_ADAPTER_CANDIDATES][CORE_MODEL_PATH_MAX];
    for (int i = 0; i < CORE_MODEL_ADAPTER_CANDIDATES; i++) {
        int rc = core_model_adapter_candidate(model_path, i, cand[i], sizeof cand[i]);
        if (rc == CORE_ERANGE)
            return core_error_set(err, CORE_ERANGE,
                                  "model path too long to look for an adapter: %s", model_path);
        if (rc < 0)
            return core_error_set(err, rc, "no file name in the model path '%s'", model_path);
        struct stat st;
        if (stat(cand[i], &st) == 0 && S_ISREG(st.st_mode)) {
            if (strlen(cand[i]) >= cap)
                return core_error_set(err, CORE_ERANGE, "adapter path too long: %s", cand[i]);
            memcpy(out, cand[i], strlen(cand[i]) + 1);
            return 0;
        }
    }
    out[0] = '\0';
    return core_error_set(err, CORE_ENOTFOUND, "no DARKFormer adapter for %s (looked for %s, %s)",
                          model_path, cand[0], cand[1]);
}
