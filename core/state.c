/* core/state.c — framing of a session's compute state (core/state.h).
 *
 * This file owns the header, the sections around the attention payload and
 * the checksum; what an attention kind keeps is serialized by the kind itself
 * (vtable entries in core/attn/attn_impl.h), so a new kind never touches this file.
 *
 * Load validates the whole blob before it changes anything: the attention
 * payload goes into a fresh state of the same configuration, which is swapped
 * in only once every other step that can fail (pending copy, sampler) has
 * succeeded. A checksum is no authentication: a blob that passes it is still
 * treated as untrusted input (sizes bounded, every payload value checked by
 * the kind).
 */
#include "core/state.h"
#include "core/crc32.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn/attn_impl.h"
#include "core/attn/attn_linear.h"
#include "core/attn/features.h"
#include "core/le.h"

enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 4,
    OFF_TOTAL = 8,
    OFF_FP = 16,
    FP_BYTES = 32,
    OFF_KIND = 48, /* then n_layer, n_head, n_head_kv, head_dim, n_features, window */
    OFF_SINKS = 76, /* linear kinds' sinks S (was reserved, 0, before sinks existed) */
    OFF_SEED = 80,
    OFF_MAX_CTX = 88,
    OFF_DIGEST = 96,
    OFF_POS = 104,
    OFF_ATTN = 112,
    OFF_SAMPLER = 120,
    OFF_PENDING = 124,
    OFF_OWNER = 128,
    OFF_CKPT = 132, /* version 2: checkpoints; version 1: reserved, 0 */
    CRC_BYTES = 4,
    CKPT_LEN_BYTES = 8 /* the length before each checkpoint */
};

_Static_assert(CORE_STATE_HEADER_BYTES == 136, "header layout");

static const unsigned char state_magic[4] = {'D', 'S', 'S', 'T'};

/* core_error_set returns its code; spelling the code out as the value lets
 * static analysis see that every failure path returns nonzero. */
#define STATE_FAIL(err, code, ...) (core_error_set((err), (code), __VA_ARGS__), (code))
_Static_assert(CORE_STATE_FINGERPRINT_MAX + 1 == FP_BYTES, "fingerprint field");

/* ---- the learned attention parameters ---- */

static uint64_t mix(uint64_t h, uint32_t w)
{
    h = (h ^ w) * 0x9e3779b97f4a7c15ULL;
    return h ^ (h >> 29);
}

static uint64_t mix_floats(uint64_t h, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t w;
        memcpy(&w, &x[i], sizeof w);
        h = mix(h, w);
    }
    return h;
}

/* Hash of what an adapter contributes beyond (kind, M, W, seed), which the
 * header names already: DARKFormer's Mat exactly as read from the adapter,
 * Flexformer's frequencies (and -n's τ),
 * DARKFormer-IS's per-feature weights (they depend on Λ through Σ*), the v2
 * decays and mixing weights, and the salt of parameters kept elsewhere (the
 * model's LoRA). Two adapters with the same settings but other parameters
 * must not accept each other's states: the continuation would be silently
 * wrong. */
uint64_t core_state_params_digest(const core_attn_t *outer)
{
    /* with sliding-window layers the learned parameters are the global
     * layers' attention's; the salt stays the model's */
    const core_attn_t *a = core_attn_global_attn(outer);
    const core_attn_cfg_t *c = &a->cfg;
    if (c->kind == CORE_ATTN_EXACT)
        return 0;
    const uint64_t h0 = 0xcbf29ce484222325ULL;
    uint64_t h = h0;
    for (int l = 0; l < c->n_layer; l++) {
        for (int kv = 0; kv < c->n_head_kv && c->kind != CORE_ATTN_PERFORMER; kv++) {
            const core_features_t *f = core_attn_linear_features(a, l, kv);
            if (!f)
                continue;
            size_t nw = (size_t)f->n_features / 2 * (size_t)f->head_dim;
            if (core_attn_kind_is_trig(c->kind)) { /* the frequencies and τ as in use */
                h = mix_floats(h, f->omega, nw);
                if (f->omega2)
                    h = mix_floats(mix_floats(h, f->omega2, nw), &f->tau, 1);
                if (f->radius > 0.0f) /* absent before the sphere: digests kept */
                    h = mix_floats(h, &f->radius, 1);
            } else if (c->kind == CORE_ATTN_DARKFORMER && f->mat)
                h = mix_floats(h, f->mat, (size_t)f->head_dim * (size_t)f->head_dim);
            else if (f->bias)
                h = mix_floats(h, f->bias, (size_t)f->n_features);
        }
    }
    /* v2 settings and parameters, mixed in only where they differ from v1
     * behaviour, so v1 states keep their digest. */
    int v2 = c->prerope || c->linear_off;
    for (int l = 0; l < c->n_layer && !v2; l++) {
        const float *gam, *mix;
        if (core_attn_linear_params(a, l, &gam, &mix) != 0)
            break;
        for (int i = 0; i < c->n_head_kv; i++)
            v2 |= gam[i] != 1.0f;
        for (int i = 0; i < c->n_head; i++)
            v2 |= mix[i] != 0.0f;
    }
    if (v2) {
        const float flags[2] = {(float)c->prerope, (float)c->linear_off};
        h = mix_floats(h, flags, 2);
        for (int l = 0; l < c->n_layer; l++) {
            const float *gam, *mix;
            if (core_attn_linear_params(a, l, &gam, &mix) != 0)
                break;
            h = mix_floats(h, gam, (size_t)c->n_head_kv);
            h = mix_floats(h, mix, (size_t)c->n_head);
        }
    }
    if (outer->params_salt) /* mixed in only when set: states without it keep their digest */
        h = mix(mix(h, (uint32_t)outer->params_salt), (uint32_t)(outer->params_salt >> 32));
    if (h == h0 && c->kind == CORE_ATTN_PERFORMER)
        return 0;
    return h ? h : 1;
}

static int is_linear(core_attn_kind_t k)
{
    return k == CORE_ATTN_PERFORMER || k == CORE_ATTN_DARKFORMER || k == CORE_ATTN_DARKFORMER_IS ||
           core_attn_kind_is_trig(k);
}

static void attn_desc(char *out, size_t n, const core_attn_cfg_t *c)
{
    if (is_linear(c->kind))
        snprintf(out, n, "%s m=%d W=%d S=%d seed=%llu", core_attn_kind_name(c->kind),
                 c->n_features, c->window, c->sinks, (unsigned long long)c->seed);
    else
        snprintf(out, n, "%s", core_attn_kind_name(c->kind));
}

/* ---- header ---- */

typedef struct hdr {
    core_state_info_t in;
    size_t sampler_bytes;
    size_t off_pending, off_sampler, off_attn;
} hdr_t;

/* Smallest checkpoint entry: its length and a blob with empty sections. */
#define CKPT_MIN_ENTRY ((uint64_t)CKPT_LEN_BYTES + CORE_STATE_HEADER_BYTES + CRC_BYTES)

/* Magic, version and the blob's extent: the checks that need only the first
 * 16 bytes, so that a damaged blob says what it is before its checksum does.
 * whole = 1: buf must hold exactly the blob. */
static int parse_frame(const unsigned char *b, size_t len, int whole, uint64_t *total,
                       core_error_t *err)
{
    if (len >= 4 && memcmp(b + OFF_MAGIC, state_magic, sizeof state_magic) != 0)
        return STATE_FAIL(err, CORE_EFORMAT, "not a darkserve state blob (bad magic)");
    const uint32_t v = len >= 8 ? core_le_get_u32(b + OFF_VERSION) : 1u;
    if (v < 1 || v > CORE_STATE_VERSION)
        return STATE_FAIL(err, CORE_EUNSUPPORTED,
                              "state blob version %u is not supported (this server reads 1 to %u)",
                              v, CORE_STATE_VERSION);
    uint64_t t = len >= 16 ? core_le_get_u64(b + OFF_TOTAL) : 0;
    if (len < CORE_STATE_HEADER_BYTES || (whole && len < t))
        return STATE_FAIL(err, CORE_EFORMAT, "truncated: %zu bytes, need %llu", len,
                              (unsigned long long)(t > CORE_STATE_HEADER_BYTES
                                                       ? t
                                                       : CORE_STATE_HEADER_BYTES + CRC_BYTES));
    if (t < CORE_STATE_HEADER_BYTES + CRC_BYTES || t > SIZE_MAX)
        return STATE_FAIL(err, CORE_EFORMAT, "state blob header: total size %llu is invalid",
                              (unsigned long long)t);
    if (whole && len > t)
        return STATE_FAIL(err, CORE_EFORMAT, "trailing bytes: %zu bytes, the blob is %llu", len,
                              (unsigned long long)t);
    *total = t;
    return 0;
}

/* Every header field after the frame; the sections must add up to total. */
static int parse_fields(const unsigned char *b, uint64_t total, hdr_t *h, core_error_t *err)
{
    memset(h, 0, sizeof *h);
    core_state_info_t *in = &h->in;
    in->version = core_le_get_u32(b + OFF_VERSION);
    in->total = (size_t)total;
    const unsigned char *fp = b + OFF_FP;
    const unsigned char *nul = memchr(fp, 0, FP_BYTES);
    if (!nul)
        return STATE_FAIL(err, CORE_EFORMAT, "state blob header: fingerprint not terminated");
    for (const unsigned char *q = nul; q < fp + FP_BYTES; q++)
        if (*q)
            return STATE_FAIL(err, CORE_EFORMAT, "state blob header: fingerprint padding");
    memcpy(in->fingerprint, fp, FP_BYTES);

    uint32_t f[7];
    for (int i = 0; i < 7; i++)
        f[i] = core_le_get_u32(b + OFF_KIND + 4 * (size_t)i);
    if (f[0] > (uint32_t)CORE_ATTN_FLEXFORMER_N)
        return STATE_FAIL(err, CORE_EFORMAT, "state blob header: unknown attention kind %u",
                              f[0]);
    for (int i = 1; i < 7; i++)
        if (f[i] > (uint32_t)INT32_MAX || (i <= 4 && f[i] == 0))
            return STATE_FAIL(err, CORE_EFORMAT,
                                  "state blob header: attention field %d is %u", i, f[i]);
    uint32_t n_ckpt = core_le_get_u32(b + OFF_CKPT);
    if (in->version == 1 && n_ckpt)
        return STATE_FAIL(err, CORE_EFORMAT, "state blob header: reserved field is not 0");
    if (n_ckpt > CORE_STATE_MAX_CHECKPOINTS)
        return STATE_FAIL(err, CORE_EFORMAT, "state blob header: %u checkpoints (limit %d)",
                              n_ckpt, CORE_STATE_MAX_CHECKPOINTS);
    uint32_t sinks = core_le_get_u32(b + OFF_SINKS);
    if (sinks > CORE_FEATURES_MAX_SINKS || (sinks && f[0] == (uint32_t)CORE_ATTN_EXACT))
        return STATE_FAIL(err, CORE_EFORMAT, "state blob header: %u sinks", sinks);
    in->cfg = (core_attn_cfg_t){.kind = (core_attn_kind_t)f[0], .n_layer = (int)f[1],
                                .n_head = (int)f[2], .n_head_kv = (int)f[3],
                                .head_dim = (int)f[4], .n_features = (int)f[5],
                                .window = (int)f[6], .seed = core_le_get_u64(b + OFF_SEED),
                                .max_ctx = (int64_t)core_le_get_u64(b + OFF_MAX_CTX),
                                .sinks = (int)sinks};
    in->params_digest = core_le_get_u64(b + OFF_DIGEST);
    in->pos = (int64_t)core_le_get_u64(b + OFF_POS);
    if (in->pos < 0 || in->pos > CORE_ATTN_MAX_POS || in->cfg.max_ctx < 0)
        return STATE_FAIL(err, CORE_EFORMAT, "state blob header: position %lld outside [0, "
                              "2^48] or negative context %lld", (long long)in->pos, (long long)in->cfg.max_ctx);

    uint64_t attn = core_le_get_u64(b + OFF_ATTN);
    uint32_t smp = core_le_get_u32(b + OFF_SAMPLER), np = core_le_get_u32(b + OFF_PENDING),
             own = core_le_get_u32(b + OFF_OWNER);
    if (smp != 0 && smp != core_sampler_state_size())
        return STATE_FAIL(err, CORE_EFORMAT, "state blob header: sampler section of %u bytes "
                              "(expected 0 or %zu)", smp, core_sampler_state_size());
    if (np > CORE_STATE_MAX_PENDING || own > CORE_STATE_MAX_OWNER)
        return STATE_FAIL(err, CORE_EFORMAT, "state blob header: %u pending tokens or %u owner "
                              "bytes over the limits (%zu, %zu)", np, own, CORE_STATE_MAX_PENDING,
                              CORE_STATE_MAX_OWNER);
    /* Every term but attn is bounded far below 2^40, so this cannot wrap;
     * total >= fixed is checked before it is subtracted. In version 2 the
     * checkpoint section takes what is left. */
    uint64_t fixed = CORE_STATE_HEADER_BYTES + (uint64_t)own + 4 * (uint64_t)np + smp + CRC_BYTES;
    uint64_t ckpt = fixed <= total && attn <= total - fixed ? total - fixed - attn : 0;
    if (fixed > total || attn > total - fixed || (n_ckpt == 0 && ckpt != 0))
        return STATE_FAIL(err, CORE_EFORMAT, "state blob header: sections (%llu + %llu) do not "
                              "add up to the total of %llu bytes", (unsigned long long)fixed,
                              (unsigned long long)attn, (unsigned long long)total);
    if (ckpt < (uint64_t)n_ckpt * CKPT_MIN_ENTRY)
        return STATE_FAIL(err, CORE_EFORMAT, "state blob header: %u checkpoints cannot fit in "
                              "the %llu bytes the sections leave", n_ckpt,
                              (unsigned long long)ckpt);
    in->attn_bytes = (size_t)attn;
    in->has_sampler = smp != 0;
    in->n_pending = np;
    in->owner_off = CORE_STATE_HEADER_BYTES;
    in->owner_len = own;
    h->sampler_bytes = smp;
    h->off_pending = CORE_STATE_HEADER_BYTES + (size_t)own;
    h->off_sampler = h->off_pending + 4 * (size_t)np;
    h->off_attn = h->off_sampler + smp;
    in->n_checkpoints = n_ckpt;
    in->checkpoints_off = h->off_attn + (size_t)attn;
    in->checkpoints_bytes = (size_t)ckpt;
    return 0;
}

/* Entry i of the checkpoint section of a blob whose header h was parsed
 * (b holds the whole blob): its bytes at b + *off, *n of them. Bounds only;
 * no checksum. */
static int ckpt_entry(const unsigned char *b, const hdr_t *h, size_t i, size_t *off, size_t *n,
                      core_error_t *err)
{
    size_t p = h->in.checkpoints_off, end = p + h->in.checkpoints_bytes;
    for (size_t k = 0;; k++) {
        if (end - p < CKPT_LEN_BYTES)
            return STATE_FAIL(err, CORE_EFORMAT, "checkpoint %zu: truncated length field", k);
        uint64_t l = core_le_get_u64(b + p);
        p += CKPT_LEN_BYTES;
        if (l > end - p)
            return STATE_FAIL(err, CORE_EFORMAT, "checkpoint %zu: length %llu runs past the "
                                  "section's %zu bytes", k, (unsigned long long)l, end - p);
        if (k == i) {
            *off = p;
            *n = (size_t)l;
            return 0;
        }
        p += (size_t)l;
    }
}

/* Is this blob for this model and this attention? (After the checksum.) */
static int check_compat(const hdr_t *h, const char *fingerprint, const core_attn_t *a,
                        core_error_t *err)
{
    const core_attn_cfg_t *bc = &h->in.cfg, *c = &a->cfg;
    if (fingerprint && strcmp(h->in.fingerprint, fingerprint) != 0)
        return STATE_FAIL(err, CORE_EMISMATCH, "blob is for model %s, this server runs %s",
                              h->in.fingerprint, fingerprint);
    if (bc->n_layer != c->n_layer || bc->n_head != c->n_head || bc->n_head_kv != c->n_head_kv ||
        bc->head_dim != c->head_dim)
        return STATE_FAIL(err, CORE_EMISMATCH,
                              "blob has attention shape L=%d H=%d Hkv=%d Hd=%d, this server runs "
                              "L=%d H=%d Hkv=%d Hd=%d", bc->n_layer, bc->n_head, bc->n_head_kv,
                              bc->head_dim, c->n_layer, c->n_head, c->n_head_kv, c->head_dim);
    if (bc->kind != c->kind ||
        (is_linear(c->kind) && (bc->n_features != c->n_features || bc->window != c->window ||
                                bc->sinks != c->sinks ||
                                bc->seed != c->seed))) {
        char have[128], want[128];
        attn_desc(have, sizeof have, bc);
        attn_desc(want, sizeof want, c);
        return STATE_FAIL(err, CORE_EMISMATCH, "blob has attention %s, this server runs %s",
                              have, want);
    }
    uint64_t dg = core_state_params_digest(a);
    if (h->in.params_digest != dg)
        return STATE_FAIL(err, CORE_EMISMATCH,
                              "blob has other %s parameters than this server's adapter "
                              "(digest %016llx, this server %016llx)",
                              core_attn_kind_name(c->kind),
                              (unsigned long long)h->in.params_digest, (unsigned long long)dg);
    if (c->kind == CORE_ATTN_EXACT && h->in.pos > c->max_ctx)
        return STATE_FAIL(err, CORE_EMISMATCH,
                              "exact attention state of %lld tokens does not fit this server's "
                              "context of %lld", (long long)h->in.pos, (long long)c->max_ctx);
    return 0;
}

/* Frame, checksum, fields, compatibility, and those of the checkpoints:
 * everything but the payloads. nested: buf is a checkpoint, which may not
 * have checkpoints of its own (checked before they are walked, so nesting
 * never recurses deeper than one level). */
static int check_blob_in(const void *buf, size_t len, const char *fingerprint,
                         const core_attn_t *a, int nested, hdr_t *h, core_error_t *err)
{
    const unsigned char *b = buf;
    uint64_t total = 0;
    if (!buf)
        return STATE_FAIL(err, CORE_EINVAL, "no state blob");
    int rc = parse_frame(b, len, 1, &total, err);
    if (rc < 0)
        return rc;
    uint32_t stored = core_le_get_u32(b + total - CRC_BYTES);
    uint32_t got = core_crc32(0, b, (size_t)total - CRC_BYTES);
    if (stored != got)
        return STATE_FAIL(err, CORE_ECHECKSUM, "checksum mismatch (stored %08x, computed %08x)",
                              stored, got);
    if ((rc = parse_fields(b, total, h, err)) < 0)
        return rc;
    if (nested && h->in.n_checkpoints)
        return STATE_FAIL(err, CORE_EFORMAT, "has checkpoints of its own");
    if ((rc = check_compat(h, fingerprint, a, err)) < 0)
        return rc;
    /* Every checkpoint is a blob for this model and attention, without
     * checkpoints of its own, and they fill the section exactly. */
    size_t end = h->in.checkpoints_off;
    for (size_t i = 0; i < h->in.n_checkpoints; i++) {
        size_t off = 0, n = 0;
        if ((rc = ckpt_entry(b, h, i, &off, &n, err)) < 0)
            return rc;
        hdr_t sub;
        core_error_t se = {0};
        if ((rc = check_blob_in(b + off, n, fingerprint, a, 1, &sub, &se)) < 0)
            return STATE_FAIL(err, rc, "checkpoint %zu: %s", i, se.msg);
        end = off + n;
    }
    if (end != h->in.checkpoints_off + h->in.checkpoints_bytes)
        return STATE_FAIL(err, CORE_EFORMAT, "checkpoint section: %zu bytes after the last "
                              "checkpoint", h->in.checkpoints_off + h->in.checkpoints_bytes - end);
    return 0;
}

static int check_blob(const void *buf, size_t len, const char *fingerprint, const core_attn_t *a,
                      hdr_t *h, core_error_t *err)
{
    return check_blob_in(buf, len, fingerprint, a, 0, h, err);
}

/* ---- public ---- */

size_t core_state_size(const core_attn_state_t *s, const core_sampler_t *smp, size_t n_pending,
                       size_t owner_len)
{
    if (!s || n_pending > CORE_STATE_MAX_PENDING || owner_len > CORE_STATE_MAX_OWNER)
        return 0;
    size_t attn = s->a->vt->state_save_size(s);
    size_t fixed = CORE_STATE_HEADER_BYTES + owner_len + 4 * n_pending +
                   (smp ? core_sampler_state_size() : 0) + CRC_BYTES;
    if (attn > SIZE_MAX - fixed)
        return 0;
    return fixed + attn;
}

/* Bytes of the checkpoint section for d's checkpoints; 0 with *ok = 0 when
 * it overflows. */
static size_t ckpt_bytes(const core_state_desc_t *d, int *ok)
{
    size_t n = 0;
    *ok = 1;
    for (size_t i = 0; i < d->n_checkpoints; i++) {
        size_t l = d->checkpoints[i].len;
        if (l > SIZE_MAX - CKPT_LEN_BYTES || n > SIZE_MAX - CKPT_LEN_BYTES - l) {
            *ok = 0;
            return 0;
        }
        n += CKPT_LEN_BYTES + l;
    }
    return n;
}

size_t core_state_desc_size(const core_state_desc_t *d)
{
    if (!d || d->n_checkpoints > CORE_STATE_MAX_CHECKPOINTS ||
        (d->n_checkpoints && !d->checkpoints))
        return 0;
    size_t base = core_state_size(d->state, d->sampler, d->n_pending, d->owner_len);
    int ok;
    size_t ck = ckpt_bytes(d, &ok);
    if (base == 0 || !ok || ck > SIZE_MAX - base)
        return 0;
    return base + ck;
}

int core_state_save(const core_state_desc_t *d, void *buf, size_t cap, size_t *len,
                    core_error_t *err)
{
    if (!d || !d->state || !len)
        return STATE_FAIL(err, CORE_EINVAL, "state save: no descriptor, state or length");
    if (!d->fingerprint || strlen(d->fingerprint) > CORE_STATE_FINGERPRINT_MAX)
        return STATE_FAIL(err, CORE_EINVAL, "state save: fingerprint missing or longer than %d",
                              CORE_STATE_FINGERPRINT_MAX);
    if (d->n_pending > CORE_STATE_MAX_PENDING || (d->n_pending && !d->pending))
        return STATE_FAIL(err, CORE_EINVAL, "state save: %zu pending tokens (limit %zu)",
                              d->n_pending, CORE_STATE_MAX_PENDING);
    if (d->owner_len > CORE_STATE_MAX_OWNER || (d->owner_len && !d->owner))
        return STATE_FAIL(err, CORE_EINVAL, "state save: owner section of %zu bytes (limit %zu)",
                              d->owner_len, CORE_STATE_MAX_OWNER);
    for (size_t i = 0; i < d->n_pending; i++)
        if (d->pending[i] < 0)
            return STATE_FAIL(err, CORE_EINVAL, "state save: pending token %zu has id %d", i,
                                  (int)d->pending[i]);
    if (d->n_checkpoints > CORE_STATE_MAX_CHECKPOINTS || (d->n_checkpoints && !d->checkpoints))
        return STATE_FAIL(err, CORE_EINVAL, "state save: %zu checkpoints (limit %d)",
                              d->n_checkpoints, CORE_STATE_MAX_CHECKPOINTS);
    for (size_t i = 0; i < d->n_checkpoints; i++) {
        /* the frame and the header's sections; the checksum is the part's
         * own business (checked when the blob is loaded) */
        const core_state_part_t *pt = &d->checkpoints[i];
        uint64_t t = 0;
        hdr_t ph;
        core_error_t pe = {0};
        if (!pt->blob || parse_frame(pt->blob, pt->len, 1, &t, &pe) < 0 ||
            parse_fields(pt->blob, t, &ph, &pe) < 0 || ph.in.n_checkpoints)
            return STATE_FAIL(err, CORE_EINVAL, "state save: checkpoint %zu is not a state blob "
                                  "without checkpoints (%s)", i,
                                  pe.msg[0] ? pe.msg : "it has checkpoints");
    }
    const core_attn_state_t *s = d->state;
    const core_attn_t *a = s->a;
    const core_attn_cfg_t *c = &a->cfg;
    size_t base = core_state_size(s, d->sampler, d->n_pending, d->owner_len);
    size_t total = core_state_desc_size(d);
    if (total == 0)
        return STATE_FAIL(err, CORE_ERANGE, "state save: blob size overflows");
    if (!buf || cap < total)
        return STATE_FAIL(err, CORE_ERANGE, "state save needs %zu bytes, buffer has %zu", total,
                              buf ? cap : (size_t)0);
    size_t smp = d->sampler ? core_sampler_state_size() : 0;
    size_t attn = base - CORE_STATE_HEADER_BYTES - d->owner_len - 4 * d->n_pending - smp -
                  CRC_BYTES;
    unsigned char *b = buf;
    memset(b, 0, CORE_STATE_HEADER_BYTES);
    memcpy(b, state_magic, sizeof state_magic);
    /* version 1 unless there are checkpoints: such blobs stay readable by
     * servers that know only version 1 */
    core_le_put_u32(b + OFF_VERSION, d->n_checkpoints ? CORE_STATE_VERSION : 1u);
    core_le_put_u64(b + OFF_TOTAL, total);
    memcpy(b + OFF_FP, d->fingerprint, strlen(d->fingerprint));
    const uint32_t f[7] = {(uint32_t)c->kind,      (uint32_t)c->n_layer,    (uint32_t)c->n_head,
                           (uint32_t)c->n_head_kv, (uint32_t)c->head_dim,   (uint32_t)c->n_features,
                           (uint32_t)c->window};
    for (int i = 0; i < 7; i++)
        core_le_put_u32(b + OFF_KIND + 4 * (size_t)i, f[i]);
    core_le_put_u32(b + OFF_SINKS, c->kind == CORE_ATTN_EXACT ? 0u : (uint32_t)c->sinks);
    core_le_put_u64(b + OFF_SEED, c->seed);
    core_le_put_u64(b + OFF_MAX_CTX, (uint64_t)c->max_ctx);
    core_le_put_u64(b + OFF_DIGEST, core_state_params_digest(a));
    core_le_put_u64(b + OFF_POS, (uint64_t)s->pos);
    core_le_put_u64(b + OFF_ATTN, attn);
    core_le_put_u32(b + OFF_SAMPLER, (uint32_t)smp);
    core_le_put_u32(b + OFF_PENDING, (uint32_t)d->n_pending);
    core_le_put_u32(b + OFF_OWNER, (uint32_t)d->owner_len);
    core_le_put_u32(b + OFF_CKPT, (uint32_t)d->n_checkpoints);
    unsigned char *p = b + CORE_STATE_HEADER_BYTES;
    if (d->owner_len)
        memcpy(p, d->owner, d->owner_len);
    p += d->owner_len;
    for (size_t i = 0; i < d->n_pending; i++, p += 4)
        core_le_put_u32(p, (uint32_t)d->pending[i]);
    int rc;
    if (smp && (rc = core_sampler_state_save(d->sampler, p, smp, err)) < 0)
        return rc;
    p += smp;
    if ((rc = a->vt->state_save(s, p, attn, err)) < 0)
        return rc;
    p += attn;
    for (size_t i = 0; i < d->n_checkpoints; i++) {
        core_le_put_u64(p, d->checkpoints[i].len);
        memcpy(p + CKPT_LEN_BYTES, d->checkpoints[i].blob, d->checkpoints[i].len);
        p += CKPT_LEN_BYTES + d->checkpoints[i].len;
    }
    core_le_put_u32(p, core_crc32(0, b, total - CRC_BYTES));
    *len = total;
    return 0;
}

int core_state_load(const void *buf, size_t len, const char *fingerprint, core_attn_state_t *state,
                    core_sampler_t *sampler, int32_t **pending, size_t *n_pending,
                    const void **owner, size_t *owner_len, core_error_t *err)
{
    if (!state || !pending != !n_pending || !owner != !owner_len)
        return STATE_FAIL(err, CORE_EINVAL, "state load: no state, or an output without "
                              "its count");
    hdr_t h;
    int rc = check_blob(buf, len, fingerprint, state->a, &h, err);
    if (rc < 0)
        return rc;
    const unsigned char *b = buf;
    int32_t *pend = NULL;
    core_attn_state_t *tmp = NULL;
    for (size_t i = 0; i < h.in.n_pending; i++) {
        uint32_t v = core_le_get_u32(b + h.off_pending + 4 * i);
        if (v > (uint32_t)INT32_MAX)
            return STATE_FAIL(err, CORE_EFORMAT, "state blob: pending token %zu has id %u", i,
                                  v);
    }
    if (pending && h.in.n_pending) {
        pend = malloc(h.in.n_pending * sizeof *pend);
        if (!pend)
            return STATE_FAIL(err, CORE_ENOMEM, "out of memory for %zu pending tokens",
                                  h.in.n_pending);
        for (size_t i = 0; i < h.in.n_pending; i++)
            pend[i] = (int32_t)core_le_get_u32(b + h.off_pending + 4 * i);
    }
    if ((rc = core_attn_state_new(state->a, &tmp, err)) < 0)
        goto fail;
    if ((rc = state->a->vt->state_load(tmp, h.in.pos, b + h.off_attn, h.in.attn_bytes, err)) < 0)
        goto fail;
    tmp->pos = h.in.pos;
    /* Last step that can fail; it leaves the sampler unchanged when it does. */
    if (sampler && h.sampler_bytes &&
        (rc = core_sampler_state_load(sampler, b + h.off_sampler, h.sampler_bytes, err)) < 0)
        goto fail;

    void *impl = state->impl;
    int64_t pos = state->pos;
    state->impl = tmp->impl;
    state->pos = tmp->pos;
    tmp->impl = impl;
    tmp->pos = pos;
    core_attn_state_free(tmp);
    if (pending) {
        *pending = pend;
        *n_pending = h.in.n_pending;
    }
    if (owner) {
        *owner = h.in.owner_len ? b + h.in.owner_off : NULL;
        *owner_len = h.in.owner_len;
    }
    return 0;
fail:
    free(pend);
    core_attn_state_free(tmp);
    return rc;
}

int core_state_peek(const void *buf, size_t len, core_state_info_t *out, core_error_t *err)
{
    uint64_t total = 0;
    hdr_t h;
    if (!buf || !out)
        return STATE_FAIL(err, CORE_EINVAL, "state peek: no blob or output");
    int rc = parse_frame(buf, len, 0, &total, err);
    if (rc < 0)
        return rc;
    if ((rc = parse_fields(buf, total, &h, err)) < 0)
        return rc;
    *out = h.in;
    return 0;
}

int core_state_checkpoint(const void *buf, size_t len, size_t i, const void **part,
                          size_t *part_len, core_error_t *err)
{
    uint64_t total = 0;
    hdr_t h;
    if (!buf || !part || !part_len)
        return STATE_FAIL(err, CORE_EINVAL, "state checkpoint: no blob or output");
    int rc = parse_frame(buf, len, 1, &total, err);
    if (rc < 0 || (rc = parse_fields(buf, total, &h, err)) < 0)
        return rc;
    if (i >= h.in.n_checkpoints)
        return STATE_FAIL(err, CORE_ERANGE, "the blob has %zu checkpoints, not %zu",
                              h.in.n_checkpoints, i + 1);
    size_t off = 0, n = 0;
    if ((rc = ckpt_entry(buf, &h, i, &off, &n, err)) < 0)
        return rc;
    *part = (const unsigned char *)buf + off;
    *part_len = n;
    return 0;
}

int core_state_verify(const void *buf, size_t len, const char *fingerprint, const core_attn_t *a,
                      core_error_t *err)
{
    hdr_t h;
    if (!a)
        return STATE_FAIL(err, CORE_EINVAL, "state verify: no attention configuration");
    return check_blob(buf, len, fingerprint, a, &h, err);
}
