/* test_srv_attn_select.c — --attn auto and the attention settings
 * (server/attn_select.c): discovery, the training-free fallback and its
 * note, explicit kinds, flags over the adapter, the startup description.
 * Adapters are written with core_features_adapter_write into a temporary
 * folder; nothing is loaded. */
#include "server/attn_select.h"
#include "tests/unit/check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/attn/features.h"

static char dir[64], model[128], beside[160], other[160];

/* A small adapter (M 16, W 4, S 2, seed 5); no tensors are needed here. */
static void write_adapter(const char *path)
{
    core_features_adapter_desc_t d = {.kind = CORE_ATTN_DARKFORMER, .n_layer = 1, .n_head = 1,
                                      .n_head_kv = 1, .head_dim = 4, .n_features = 16,
                                      .window = 4, .sinks = 2, .seed = 5};
    core_error_t err = {0};
    CHECK_MSG(core_features_adapter_write(&d, path, &err) == 0, "%s: %s", path, err.msg);
}

static srv_attn_request_t flags_unset(int kind)
{
    return (srv_attn_request_t){.kind = kind, .window = -1, .sinks = -1, .prerope = -1,
                                .linear = -1};
}

TEST(parse_names)
{
    int k = -1;
    CHECK_INT_EQ(srv_attn_parse("auto", &k), 0);
    CHECK_INT_EQ(k, SRV_ATTN_AUTO);
    CHECK_INT_EQ(srv_attn_parse("exact", &k), 0);
    CHECK_INT_EQ(k, CORE_ATTN_EXACT);
    CHECK_INT_EQ(srv_attn_parse("darkformer-is", &k), 0);
    CHECK_INT_EQ(k, CORE_ATTN_DARKFORMER_IS);
    CHECK_INT_EQ(srv_attn_parse("softmax", &k), CORE_EINVAL);
}

TEST(auto_without_adapter_falls_back)
{
    srv_attn_choice_t ch;
    core_error_t err = {0};
    srv_attn_request_t rq = flags_unset(SRV_ATTN_AUTO);
    CHECK_INT_EQ(srv_attn_select(model, &rq, &ch, &err), 0);
    CHECK_INT_EQ(ch.fallback, 1);
    CHECK_INT_EQ(ch.discovered, 0);
    CHECK_INT_EQ(ch.mo.attn_kind, CORE_ATTN_PERFORMER);
    CHECK_INT_EQ(ch.mo.linear_off, 1);
    CHECK_INT_EQ(ch.mo.window, SRV_ATTN_FALLBACK_WINDOW);
    CHECK_INT_EQ(ch.mo.sinks, CORE_FEATURES_DEFAULT_SINKS);
    CHECK(ch.mo.adapter_path == NULL);
    CHECK_STR_EQ(ch.adapter, "");
    char want[1024];
    snprintf(want, sizeof want,
             "no DARKFormer adapter for %s (looked for %s/adapters/m.darkformer.gguf, %s); using "
             "performer with sinks + window only (training-free); pass --adapter PATH or "
             "--attn KIND",
             model, dir, beside);
    CHECK_STR_EQ(ch.note, want);

    /* flags still win */
    rq.window = 32;
    rq.sinks = 1;
    rq.linear = 1;
    CHECK_INT_EQ(srv_attn_select(model, &rq, &ch, &err), 0);
    CHECK_INT_EQ(ch.fallback, 1);
    CHECK_INT_EQ(ch.mo.window, 32);
    CHECK_INT_EQ(ch.mo.sinks, 1);
    CHECK_INT_EQ(ch.mo.linear_off, 0);
}

/* A gemma3 model (the tiny fixture, DARKSERVE_TINY_GEMMA) without an
 * adapter: auto picks exact and says why; an explicit linear kind is passed
 * on (it applies to the global layers). */
TEST(auto_picks_exact_for_gemma3)
{
    const char *g = getenv("DARKSERVE_TINY_GEMMA");
    CHECK_MSG(g != NULL, "DARKSERVE_TINY_GEMMA is not set (run through make unit)");
    if (!g)
        return;
    CHECK_INT_EQ(core_model_file_local_layers(g), 1);
    CHECK_INT_EQ(core_model_file_local_layers(getenv("DARKSERVE_TINY_MODEL")), 0);
    CHECK_INT_EQ(core_model_file_local_layers(model), 0); /* no such file */
    srv_attn_choice_t ch;
    core_error_t err = {0};
    srv_attn_request_t rq = flags_unset(SRV_ATTN_AUTO);
    CHECK_INT_EQ(srv_attn_select(g, &rq, &ch, &err), 0);
    CHECK_INT_EQ(ch.mo.attn_kind, CORE_ATTN_EXACT);
    CHECK_INT_EQ(ch.fallback, 1);
    CHECK_INT_EQ(ch.mo.sinks, 0);
    CHECK_INT_EQ(ch.mo.memory, 0);
    CHECK_MSG(strstr(ch.note, "sliding-window model") != NULL, "%s", ch.note);
    rq = flags_unset(CORE_ATTN_PERFORMER);
    CHECK_INT_EQ(srv_attn_select(g, &rq, &ch, &err), 0);
    CHECK_INT_EQ(ch.mo.attn_kind, CORE_ATTN_PERFORMER);
}

/* The same gemma3 model with its adapter beside it (a copy of the fixture's
 * name in the temporary folder, a symbolic link to it): auto picks
 * DARKFormer, which runs the global layers. */
TEST(auto_picks_darkformer_for_gemma3_with_its_adapter)
{
    const char *g = getenv("DARKSERVE_TINY_GEMMA");
    CHECK_MSG(g != NULL, "DARKSERVE_TINY_GEMMA is not set (run through make unit)");
    if (!g)
        return;
    char link[160], ad[200];
    snprintf(link, sizeof link, "%s/g.gguf", dir);
    snprintf(ad, sizeof ad, "%s/adapters/g.darkformer.gguf", dir);
    CHECK_INT_EQ(symlink(g, link), 0);
    srv_attn_choice_t ch;
    core_error_t err = {0};
    srv_attn_request_t rq = flags_unset(SRV_ATTN_AUTO);
    CHECK_INT_EQ(srv_attn_select(link, &rq, &ch, &err), 0);
    CHECK_INT_EQ(ch.mo.attn_kind, CORE_ATTN_EXACT); /* none yet */
    char sub[96];
    snprintf(sub, sizeof sub, "%s/adapters", dir);
    int made = mkdir(sub, 0777) == 0;
    write_adapter(ad);
    CHECK_INT_EQ(srv_attn_select(link, &rq, &ch, &err), 0);
    CHECK_INT_EQ(ch.mo.attn_kind, CORE_ATTN_DARKFORMER);
    CHECK_INT_EQ(ch.discovered, 1);
    CHECK_INT_EQ(ch.fallback, 0);
    CHECK_STR_EQ(ch.adapter, ad);
    CHECK_INT_EQ(ch.mo.sinks, 2); /* the adapter's */
    unlink(ad);
    unlink(link);
    if (made)
        rmdir(sub);
}

TEST(auto_uses_the_adapter_beside_the_model)
{
    write_adapter(beside);
    srv_attn_choice_t ch;
    core_error_t err = {0};
    srv_attn_request_t rq = flags_unset(SRV_ATTN_AUTO);
    CHECK_INT_EQ(srv_attn_select(model, &rq, &ch, &err), 0);
    CHECK_INT_EQ(ch.fallback, 0);
    CHECK_INT_EQ(ch.discovered, 1);
    CHECK_STR_EQ(ch.note, "");
    CHECK_INT_EQ(ch.mo.attn_kind, CORE_ATTN_DARKFORMER);
    CHECK(ch.mo.adapter_path == ch.adapter);
    CHECK_STR_EQ(ch.adapter, beside);
    CHECK_INT_EQ(ch.mo.linear_off, 0);
    CHECK_INT_EQ(ch.mo.n_features, 16); /* the adapter's values */
    CHECK_INT_EQ(ch.mo.window, 4);
    CHECK_INT_EQ(ch.mo.sinks, 2);
    CHECK_INT_EQ(ch.mo.seed, 5);

    /* flags over the adapter */
    rq.window = 8;
    rq.n_features = 64;
    CHECK_INT_EQ(srv_attn_select(model, &rq, &ch, &err), 0);
    CHECK_INT_EQ(ch.mo.window, 8);
    CHECK_INT_EQ(ch.mo.n_features, 64);
    CHECK_INT_EQ(ch.mo.sinks, 2);

    /* --adapter beats discovery */
    write_adapter(other);
    rq = flags_unset(SRV_ATTN_AUTO);
    rq.adapter = other;
    CHECK_INT_EQ(srv_attn_select(model, &rq, &ch, &err), 0);
    CHECK_INT_EQ(ch.discovered, 0);
    CHECK_INT_EQ(ch.mo.attn_kind, CORE_ATTN_DARKFORMER);
    CHECK_STR_EQ(ch.mo.adapter_path, other);
    unlink(other);
}

TEST(explicit_kinds_do_not_look)
{
    srv_attn_choice_t ch;
    core_error_t err = {0};
    srv_attn_request_t rq = flags_unset(CORE_ATTN_EXACT); /* the adapter is still beside */
    CHECK_INT_EQ(srv_attn_select(model, &rq, &ch, &err), 0);
    CHECK_INT_EQ(ch.mo.attn_kind, CORE_ATTN_EXACT);
    CHECK(ch.mo.adapter_path == NULL);
    CHECK_INT_EQ(ch.discovered + ch.fallback, 0);
    CHECK_INT_EQ(ch.mo.sinks, 0); /* exact has none, whatever the default */

    rq = flags_unset(CORE_ATTN_PERFORMER);
    CHECK_INT_EQ(srv_attn_select(model, &rq, &ch, &err), 0);
    CHECK_INT_EQ(ch.mo.attn_kind, CORE_ATTN_PERFORMER);
    CHECK(ch.mo.adapter_path == NULL);
    CHECK_INT_EQ(ch.mo.window, CORE_FEATURES_DEFAULT_WINDOW);
    CHECK_INT_EQ(ch.mo.linear_off, 0);

    rq.linear = 0;
    rq.decay_off = 1;
    rq.max_ctx = 99;
    CHECK_INT_EQ(srv_attn_select(model, &rq, &ch, &err), 0);
    CHECK_INT_EQ(ch.mo.linear_off, 1);
    CHECK_INT_EQ(ch.mo.decay_off, 1);
    CHECK_INT_EQ(ch.mo.max_ctx, 99);

    /* darkformer without an adapter is left to the loader's message */
    rq = flags_unset(CORE_ATTN_DARKFORMER);
    CHECK_INT_EQ(srv_attn_select(model, &rq, &ch, &err), 0);
    CHECK(ch.mo.adapter_path == NULL);
}

TEST(unreadable_adapter_names_it)
{
    srv_attn_choice_t ch;
    core_error_t err = {0};
    srv_attn_request_t rq = flags_unset(SRV_ATTN_AUTO);
    rq.adapter = "/nonexistent/a.gguf";
    CHECK(srv_attn_select(model, &rq, &ch, &err) < 0);
    CHECK_MSG(strstr(err.msg, "adapter /nonexistent/a.gguf: ") != NULL, "%s", err.msg);

    /* a discovered adapter that is not one */
    FILE *f = fopen(beside, "wb");
    CHECK(f != NULL);
    if (f) {
        fputs("not a gguf", f);
        fclose(f);
    }
    rq.adapter = NULL;
    CHECK(srv_attn_select(model, &rq, &ch, &err) < 0);
    CHECK_MSG(strstr(err.msg, beside) != NULL, "%s", err.msg);
    unlink(beside);
}

TEST(describe)
{
    char buf[256];
    core_attn_cfg_t ac = {.kind = CORE_ATTN_DARKFORMER, .n_features = 128, .window = 256,
                          .sinks = 4, .max_ctx = 8192};
    srv_attn_describe(&ac, "models/adapters/x.gguf", buf, sizeof buf);
    CHECK_STR_EQ(buf, "darkformer (features 128, window 256, sinks 4, exact context 8192, "
                      "adapter models/adapters/x.gguf)");
    ac.kind = CORE_ATTN_PERFORMER;
    ac.linear_off = 1;
    srv_attn_describe(&ac, "", buf, sizeof buf);
    CHECK_STR_EQ(buf, "performer (features 128, window 256, sinks 4, linear branch off, exact "
                      "context 8192, adapter none)");
    ac.kind = CORE_ATTN_EXACT;
    srv_attn_describe(&ac, NULL, buf, sizeof buf);
    CHECK_STR_EQ(buf, "exact (exact context 8192, adapter none)");
    /* a sliding-window model says which layers the kind runs */
    ac.n_layer = 18;
    ac.swa_window = 512;
    ac.swa_period = 6;
    srv_attn_describe(&ac, NULL, buf, sizeof buf);
    CHECK_STR_EQ(buf, "exact (exact context 8192, adapter none; on the 3 global layers, the 15 "
                      "local ones exact in a ring of their 512-token window)");
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/darkserve_attn_select_XXXXXX");
    if (!mkdtemp(dir)) {
        printf("cannot make a temporary folder\n");
        return 1;
    }
    snprintf(model, sizeof model, "%s/m.gguf", dir);
    snprintf(beside, sizeof beside, "%s/m.darkformer.gguf", dir);
    snprintf(other, sizeof other, "%s/other.gguf", dir);
    RUN(parse_names);
    RUN(auto_without_adapter_falls_back);
    RUN(auto_picks_exact_for_gemma3);
    RUN(auto_picks_darkformer_for_gemma3_with_its_adapter);
    RUN(auto_uses_the_adapter_beside_the_model);
    RUN(explicit_kinds_do_not_look);
    RUN(unreadable_adapter_names_it);
    RUN(describe);
    rmdir(dir);
    return CHECK_DONE();
}
