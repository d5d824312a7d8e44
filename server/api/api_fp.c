/* server/api/api_fp.c — the system fingerprint of the OpenAI responses
 * ("system_fingerprint": "fp_<16 hex>"): a hash of what decides the output
 * for a given request, so a client can tell when the serving configuration
 * changed. It covers
 *   - the binary: its GNU build id (the linker's hash of the code; the
 *     version string when the binary has none),
 *   - the model: core_model_info()->fingerprint,
 *   - the attention configuration: every field of core_attn_cfg_t (kind,
 *     shape, context of exact attention, M, W, seed, sinks, pre-RoPE, decay
 *     and linear switches, RoPE) and the digest of its learned parameters
 *     (core_state_params_digest: the adapter's M, γ, β and LoRA).
 * Nothing that changes between two runs of the same binary on the same
 * files (time, pid, paths) goes in. Loop thread (computed once, cached).
 */
#include "server/api/api.h"

#include "core/state.h"
#include "server/base/version.h"

#include <elf.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

typedef struct build_id {
    unsigned char bytes[64];
    size_t len;
} build_id_t;

/* dl_iterate_phdr callback: the first object is the executable itself; its
 * PT_NOTE segments hold the NT_GNU_BUILD_ID note ("GNU\0" + the id). */
static int find_build_id(struct dl_phdr_info *info, size_t size, void *ud)
{
    (void)size;
    build_id_t *b = ud;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_NOTE)
            continue;
        const unsigned char *p = (const unsigned char *)(info->dlpi_addr + ph->p_vaddr);
        size_t left = ph->p_memsz;
        while (left >= sizeof(ElfW(Nhdr))) {
            ElfW(Nhdr) nh;
            memcpy(&nh, p, sizeof nh);
            size_t name_sz = (nh.n_namesz + 3u) & ~(size_t)3u;
            size_t desc_sz = (nh.n_descsz + 3u) & ~(size_t)3u;
            if (name_sz > left - sizeof nh || desc_sz > left - sizeof nh - name_sz)
                break;
            const unsigned char *name = p + sizeof nh, *desc = name + name_sz;
            if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 && memcmp(name, "GNU", 4) == 0 &&
                nh.n_descsz > 0 && nh.n_descsz <= sizeof b->bytes) {
                memcpy(b->bytes, desc, nh.n_descsz);
                b->len = nh.n_descsz;
                return 1;
            }
            p += sizeof nh + name_sz + desc_sz;
            left -= sizeof nh + name_sz + desc_sz;
        }
    }
    return 1; /* only the executable */
}

/* FNV-1a, 64 bits: not cryptographic, a label that changes with its input. */
static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3u;
    }
    return h;
}

size_t api_attn_config_text(const api_app_t *app, char *buf, size_t len)
{
    const core_attn_cfg_t *c = core_attn_config(core_model_attn(app->model));
    int n = snprintf(buf, len,
                     "kind=%d L=%d H=%d Hkv=%d Hd=%d ctx=%lld M=%d W=%d seed=%llu sinks=%d "
                     "prerope=%d decay_off=%d linear_off=%d n_rot=%d base=%.17g scale=%.17g "
                     "params=%016llx",
                     (int)c->kind, c->n_layer, c->n_head, c->n_head_kv, c->head_dim,
                     (long long)c->max_ctx, c->n_features, c->window, (unsigned long long)c->seed,
                     c->sinks, c->prerope, c->decay_off, c->linear_off, c->n_rot, c->rope_base,
                     c->rope_scale,
                     (unsigned long long)core_state_params_digest(core_model_attn(app->model)));
    /* 8-bit rows hold other numbers than halves: their states are not
     * interchangeable (16-bit configurations keep the text they had) */
    if (n >= 0 && (size_t)n < len && c->kind != CORE_ATTN_EXACT && c->kv_bits == 8) {
        const int m = snprintf(buf + n, len - (size_t)n, " kv_bits=8");
        n = m < 0 ? n : n + m;
    }
    /* the exact memory: its rows, rule and heads shape every state */
    if (n >= 0 && (size_t)n < len && c->kind != CORE_ATTN_EXACT && c->memory) {
        char heads[CORE_ATTN_HEADS_SPEC_MAX];
        const size_t hn = core_attn_memory_heads_format(c, heads, sizeof heads);
        const int m = snprintf(buf + n, len - (size_t)n, " memory=%d keep=%s heads=%016llx",
                               c->memory, core_attn_keep_name(c->memory_keep),
                               (unsigned long long)fnv1a(0xcbf29ce484222325u, heads,
                                                         hn < sizeof heads ? hn : sizeof heads - 1));
        n = m < 0 ? n : n + m;
    }
    return n < 0 ? 0 : (size_t)n < len ? (size_t)n : len - 1;
}

const char *api_system_fingerprint(api_app_t *app)
{
    if (app->system_fp[0] || !app->model)
        return app->system_fp[0] ? app->system_fp : NULL;
    build_id_t b = {{0}, 0};
    dl_iterate_phdr(find_build_id, &b);
    uint64_t h = 0xcbf29ce484222325u;
    if (b.len)
        h = fnv1a(h, b.bytes, b.len);
    else
        h = fnv1a(h, DARKSERVE_VERSION, strlen(DARKSERVE_VERSION));
    const char *mfp = core_model_info(app->model)->fingerprint;
    h = fnv1a(h, mfp, strlen(mfp) + 1);
    /* the fields as text: no struct padding in the hash */
    char cfg[512];
    const size_t cfg_len = api_attn_config_text(app, cfg, sizeof cfg);
    h = fnv1a(h, cfg, cfg_len);
    snprintf(app->system_fp, sizeof app->system_fp, "fp_%016llx", (unsigned long long)h);
    return app->system_fp;
}
