/* core/text/tokenizer_encode.c — text -> token ids.
 *
 * Pipeline: the input is cut at special-token texts (leftmost-longest, trie);
 * each stretch between them is a fragment. BPE fragments are cut into valid
 * UTF-8 runs, each run goes through the pre-tokenizer regexes, and each final
 * piece is merged on its own; SPM fragments are escaped ("▁") and merged whole.
 *
 * Merging is the usual symbol list + binary heap: every adjacent pair that can
 * merge is a candidate keyed by (rank or -score, left position); the best is
 * popped, stale candidates (a side already merged elsewhere) are skipped, and
 * the merged symbol's two new neighbour pairs are pushed. O(n log n) per piece
 * instead of rescanning the piece after every merge.
 *
 * All scratch memory belongs to one call, so concurrent calls on one
 * tokenizer are safe.
 */
#include "core/text/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct sym {
    int32_t id;          /* BPE: current token; SPM: unused until the end */
    int32_t prev, next;  /* neighbours in the piece, -1 at the ends */
    uint32_t start, len; /* bytes of the piece this symbol covers; len 0 = merged away */
} sym_t;

typedef struct cand {
    double prio;  /* lower merges first: BPE rank, SPM -score */
    int32_t left; /* symbol index; the right one is syms[left].next when fresh */
    int32_t right;
    uint32_t len; /* left.len + right.len when pushed: detects staleness */
    int32_t id;   /* token the merge produces */
} cand_t;

typedef struct enc {
    const core_tokenizer_t *t;
    int32_t *ids;        /* output */
    size_t n;            /* ids produced (also beyond cap in fixed mode) */
    size_t cap;          /* fixed mode: caller's capacity; growable: allocated */
    size_t limit;        /* growable mode: most ids allowed */
    int fixed;           /* 1: ids is the caller's buffer, count past cap */
    sym_t *syms;         /* [syms_cap] */
    size_t syms_cap;
    cand_t *heap;        /* [heap_cap] */
    size_t heap_n, heap_cap;
    char *buf;           /* SPM escaped fragment, or a byte-level piece */
    size_t buf_cap;
    pcre2_match_data *md[CORE_TOK_MAX_PRE_STEPS];
    core_error_t *err;
} enc_t;

static int emit(enc_t *e, int32_t id)
{
    if (e->fixed) {
        if (e->n < e->cap)
            e->ids[e->n] = id;
        e->n++;
        return 0;
    }
    if (e->n == e->limit)
        return core_error_set(e->err, CORE_ERANGE, "text needs more than %zu tokens", e->limit);
    if (e->n == e->cap) {
        size_t ncap = e->cap ? e->cap * 2 : 256;
        if (ncap > e->limit)
            ncap = e->limit;
        int32_t *nv = realloc(e->ids, ncap * sizeof *nv);
        if (!nv)
            return core_error_set(e->err, CORE_ENOMEM, "out of memory for %zu token ids", ncap);
        e->ids = nv;
        e->cap = ncap;
    }
    e->ids[e->n++] = id;
    return 0;
}

/* Failures return the constant CORE_ENOMEM rather than core_error_set's
 * result: the static analyzer cannot see across files that the two are
 * equal, and would otherwise follow callers on with the buffers unset. */
static int reserve(enc_t *e, size_t n_syms, size_t n_buf)
{
    if (n_syms > e->syms_cap) {
        size_t c = n_syms < 64 ? 64 : n_syms;
        sym_t *ns = realloc(e->syms, c * sizeof *ns);
        if (!ns) {
            core_error_set(e->err, CORE_ENOMEM, "out of memory for %zu symbols", c);
            return CORE_ENOMEM;
        }
        e->syms = ns;
        e->syms_cap = c;
    }
    if (n_buf > e->buf_cap) {
        size_t c = n_buf < 256 ? 256 : n_buf;
        char *nb = realloc(e->buf, c);
        if (!nb) {
            core_error_set(e->err, CORE_ENOMEM, "out of memory for %zu bytes of scratch", c);
            return CORE_ENOMEM;
        }
        e->buf = nb;
        e->buf_cap = c;
    }
    return 0;
}

/* ---- candidate heap ---- */

static int cand_better(const cand_t *a, const cand_t *b)
{
    return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

static int heap_push(enc_t *e, cand_t c)
{
    if (e->heap_n == e->heap_cap) {
        size_t nc = e->heap_cap ? e->heap_cap * 2 : 256;
        cand_t *nh = realloc(e->heap, nc * sizeof *nh);
        if (!nh)
            return core_error_set(e->err, CORE_ENOMEM, "out of memory for %zu merge candidates", nc);
        e->heap = nh;
        e->heap_cap = nc;
    }
    size_t i = e->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_better(&c, &e->heap[p]))
            break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = c;
    return 0;
}

static cand_t heap_pop(enc_t *e)
{
    cand_t top = e->heap[0];
    cand_t last = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, best = l;
        if (l >= n)
            break;
        if (l + 1 < n && cand_better(&e->heap[l + 1], &e->heap[l]))
            best = l + 1;
        if (!cand_better(&e->heap[best], &last))
            break;
        e->heap[i] = e->heap[best];
        i = best;
    }
    if (n)
        e->heap[i] = last;
    return top;
}

/* Merges the linked symbols 0.. until no candidate is left. try_pair pushes
 * the candidate for (l, r) if there is one. */
typedef int (*try_pair_fn)(enc_t *e, int32_t l, int32_t r);

static int merge_loop(enc_t *e, int32_t n_syms, try_pair_fn try_pair)
{
    int rc;
    e->heap_n = 0;
    for (int32_t i = 0; i + 1 < n_syms; i++)
        if ((rc = try_pair(e, i, i + 1)))
            return rc;
    sym_t *s = e->syms;
    while (e->heap_n) {
        cand_t c = heap_pop(e);
        sym_t *l = &s[c.left], *r = &s[c.right];
        if (l->len == 0 || r->len == 0 || l->next != c.right || l->len + r->len != c.len)
            continue; /* stale: a side took part in another merge since */
        l->id = c.id;
        l->len += r->len;
        l->next = r->next;
        if (r->next >= 0)
            s[r->next].prev = c.left;
        r->len = 0;
        if (l->prev >= 0 && (rc = try_pair(e, l->prev, c.left)))
            return rc;
        if (l->next >= 0 && (rc = try_pair(e, c.left, l->next)))
            return rc;
    }
    return 0;
}

/* ---- byte-level BPE ---- */

static int bpe_try_pair(enc_t *e, int32_t l, int32_t r)
{
    const core_tokenizer_t *t = e->t;
    sym_t *s = e->syms;
    uint64_t key = ((uint64_t)(uint32_t)s[l].id << 32) | (uint32_t)s[r].id;
    size_t i = (size_t)core_tok_hash_u64(key) & t->merge_mask;
    while (t->merges[i].key != UINT64_MAX) {
        if (t->merges[i].key == key) {
            cand_t c = {(double)t->merges[i].rank, l, r, s[l].len + s[r].len, t->merges[i].id};
            return heap_push(e, c);
        }
        i = (i + 1) & t->merge_mask;
    }
    return 0;
}

/* One pre-tokenized piece: bytes -> byte-level symbols -> merges. */
static int bpe_piece(enc_t *e, const unsigned char *p, size_t n)
{
    const core_tokenizer_t *t = e->t;
    int rc;
    if (n == 0)
        return 0;
    if ((rc = reserve(e, n, t->ignore_merges ? 2 * n : 0)))
        return rc;
    if (t->ignore_merges) {
        size_t w = 0;
        for (size_t i = 0; i < n; i++)
            w += core_tok_utf8_put(t->byte_cp[p[i]], e->buf + w);
        int32_t id = core_tok_lookup(t, e->buf, w);
        if (id >= 0 && core_tok_mergeable(t, id))
            return emit(e, id);
    }
    sym_t *s = e->syms;
    int32_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_tok[p[i]];
        if (id < 0)
            continue; /* no symbol for this byte: dropped, as HF does without unk */
        s[k].id = id;
        s[k].prev = k - 1;
        s[k].next = k + 1;
        s[k].start = (uint32_t)i;
        s[k].len = 1;
        k++;
    }
    if (k == 0)
        return 0;
    s[k - 1].next = -1;
    if ((rc = merge_loop(e, k, bpe_try_pair)))
        return rc;
    for (int32_t i = 0; i >= 0; i = e->syms[i].next)
        if ((rc = emit(e, e->syms[i].id)))
            return rc;
    return 0;
}

/* Applies pre-tokenizer step `step` to p[0..n): matches and the gaps between
 * them both become pieces for the next step (HF's "Isolated" split). */
static int pre_split(enc_t *e, int step, const unsigned char *p, size_t n)
{
    const core_tokenizer_t *t = e->t;
    if (step == t->n_steps)
        return bpe_piece(e, p, n);
    if (!e->md[step]) {
        e->md[step] = pcre2_match_data_create_from_pattern(t->re[step], NULL);
        if (!e->md[step])
            return core_error_set(e->err, CORE_ENOMEM, "out of memory for regex match data");
    }
    pcre2_match_data *md = e->md[step];
    size_t pos = 0, last = 0;
    int rc;
    while (pos < n) {
        /* NO_UTF_CHECK: the run was validated once; PCRE2 would otherwise
         * re-check the whole subject on every call (quadratic). */
        int m = pcre2_match(t->re[step], p, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (m == PCRE2_ERROR_JIT_STACKLIMIT)
            m = pcre2_match(t->re[step], p, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0)
            return core_error_set(e->err, CORE_ERANGE, "pre-tokenizer regex failed (PCRE2 error %d)", m);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms > last && (rc = pre_split(e, step + 1, p + last, ms - last)))
            return rc;
        if (me > ms && (rc = pre_split(e, step + 1, p + ms, me - ms)))
            return rc;
        last = me;
        if (me == ms) { /* empty match: step over one character */
            size_t cl = core_tok_utf8_len(p + me, n - me);
            pos = me + (cl ? cl : 1);
        } else {
            pos = me;
        }
    }
    if (last < n)
        return pre_split(e, step + 1, p + last, n - last);
    return 0;
}

static int bpe_fragment(enc_t *e, const unsigned char *p, size_t n)
{
    int rc;
    size_t i = 0;
    while (i < n) {
        size_t j = i, cl;
        while (j < n && (cl = core_tok_utf8_len(p + j, n - j)) > 0)
            j += cl;
        if (j > i && (rc = pre_split(e, 0, p + i, j - i)))
            return rc;
        if (j < n) { /* a byte that starts no valid character: a piece of its own */
            if ((rc = bpe_piece(e, p + j, 1)))
                return rc;
            j++;
        }
        i = j;
    }
    return 0;
}

/* ---- SentencePiece-style BPE ---- */

static int spm_try_pair(enc_t *e, int32_t l, int32_t r)
{
    const core_tokenizer_t *t = e->t;
    sym_t *s = e->syms;
    uint32_t len = s[l].len + s[r].len;
    int32_t id = core_tok_lookup(t, e->buf + s[l].start, len);
    if (id < 0 || !core_tok_mergeable(t, id))
        return 0;
    cand_t c = {-(double)t->scores[id], l, r, len, id};
    return heap_push(e, c);
}

static int spm_fragment(enc_t *e, const unsigned char *p, size_t n, int prefix)
{
    const core_tokenizer_t *t = e->t;
    int rc;
    if (n == 0)
        return 0;
    /* escape: optional leading "▁", every space -> "▁" (3 bytes) */
    if ((rc = reserve(e, n + 1, 3 * n + 3)))
        return rc;
    size_t w = 0;
    if (prefix) {
        memcpy(e->buf, "\xE2\x96\x81", 3);
        w = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (p[i] == ' ') {
            memcpy(e->buf + w, "\xE2\x96\x81", 3);
            w += 3;
        } else {
            e->buf[w++] = (char)p[i];
        }
    }
    /* symbols: one per character; a byte that starts no valid character is
     * a symbol of its own (it can only resolve through byte fallback) */
    sym_t *s = e->syms;
    int32_t k = 0;
    for (size_t i = 0; i < w;) {
        size_t cl = core_tok_utf8_len((const unsigned char *)e->buf + i, w - i);
        /* cl <= w - i is core_tok_utf8_len's contract; restated for the
         * analyzer, which cannot see it from here. */
        if (cl == 0 || cl > w - i)
            cl = 1;
        s[k].id = -1;
        s[k].prev = k - 1;
        s[k].next = k + 1;
        s[k].start = (uint32_t)i;
        s[k].len = (uint32_t)cl;
        k++;
        i += cl;
    }
    s[k - 1].next = -1;
    if ((rc = merge_loop(e, k, spm_try_pair)))
        return rc;
    for (int32_t i = 0; i >= 0; i = e->syms[i].next) {
        const sym_t *y = &e->syms[i];
        const unsigned char *q = (const unsigned char *)e->buf + y->start;
        int32_t id = core_tok_lookup(t, (const char *)q, y->len);
        if (id >= 0 && core_tok_mergeable(t, id)) {
            if ((rc = emit(e, id)))
                return rc;
            continue;
        }
        int all_bytes = 1;
        for (uint32_t b = 0; b < y->len; b++)
            all_bytes &= t->byte_tok[q[b]] >= 0;
        if (all_bytes) {
            for (uint32_t b = 0; b < y->len; b++)
                if ((rc = emit(e, t->byte_tok[q[b]])))
                    return rc;
        } else if (t->unk >= 0) {
            if ((rc = emit(e, t->unk)))
                return rc;
        }
    }
    return 0;
}

/* ---- driver ---- */

/* Longest special token starting at p[0..n) that flags allow; 0 if none.
 * SentencePiece (spm) matches its USER_DEFINED pieces in the escaped text,
 * where a space and a literal "▁" are one symbol; GGUF files store those
 * pieces with spaces (llama.cpp's converter unescapes them), so an input
 * "▁" also walks a space edge of the trie when it has no edge of its own. */
static size_t match_special(const core_tokenizer_t *t, const unsigned char *p, size_t n, int parse_special,
                            int spm, int32_t *id)
{
    size_t best = 0;
    int32_t node = 0;
    for (size_t k = 0; k < n;) {
        size_t step = 1;
        int32_t c = t->trie[node].child;
        while (c >= 0 && t->trie[c].byte != p[k])
            c = t->trie[c].sibling;
        if (c < 0 && spm && n - k >= 3 && p[k] == 0xE2 && p[k + 1] == 0x96 && p[k + 2] == 0x81) {
            c = t->trie[node].child;
            while (c >= 0 && t->trie[c].byte != ' ')
                c = t->trie[c].sibling;
            step = 3;
        }
        if (c < 0)
            break;
        node = c;
        k += step;
        int32_t tid = t->trie[node].id;
        if (tid >= 0 && (parse_special || t->types[tid] == CORE_TOK_TYPE_USER_DEFINED)) {
            best = k;
            *id = tid;
        }
    }
    return best;
}

static int fragment(enc_t *e, const unsigned char *p, size_t n, int after_special)
{
    if (e->t->model == CORE_TOK_MODEL_BPE)
        return bpe_fragment(e, p, n);
    return spm_fragment(e, p, n, after_special && e->t->add_space_prefix);
}

/* plain[0..n_plain): ranges where special texts are not recognised (and
 * which no special match crosses); validated by the caller. */
static int encode_run(enc_t *e, const unsigned char *text, size_t len, unsigned flags,
                      const core_tok_range_t *plain, size_t n_plain)
{
    const core_tokenizer_t *t = e->t;
    int rc;
    int add = (flags & CORE_TOK_ADD_SPECIAL) != 0;
    int parse = (flags & CORE_TOK_PARSE_SPECIAL) != 0;
    if (add && t->add_bos && (rc = emit(e, t->bos)))
        return rc;
    size_t start = 0, i = 0, k = 0;
    int after_special = 1; /* the start of the text counts as "after a special" */
    while (i < len) {
        int32_t id = -1;
        while (k < n_plain && plain[k].off + plain[k].len <= i)
            k++;
        const int in_plain = k < n_plain && plain[k].off <= i;
        /* a match ends where the current stretch (plain or not) ends */
        const size_t end = in_plain ? plain[k].off + plain[k].len : k < n_plain ? plain[k].off : len;
        const int spm = t->model == CORE_TOK_MODEL_SPM;
        size_t ml = t->trie_first[text[i]] || (spm && text[i] == 0xE2 && t->trie_first[' '])
                        ? match_special(t, text + i, end - i, parse && !in_plain, spm, &id)
                        : 0;
        if (ml == 0) {
            i++;
            continue;
        }
        if (i > start && (rc = fragment(e, text + start, i - start, after_special)))
            return rc;
        if ((rc = emit(e, id)))
            return rc;
        i += ml;
        start = i;
        after_special = 1;
    }
    if (len > start && (rc = fragment(e, text + start, len - start, after_special)))
        return rc;
    if (add && t->add_eos && (rc = emit(e, t->eos)))
        return rc;
    return 0;
}

static void enc_release(enc_t *e)
{
    for (int i = 0; i < CORE_TOK_MAX_PRE_STEPS; i++)
        pcre2_match_data_free(e->md[i]);
    free(e->syms);
    free(e->heap);
    free(e->buf);
}

static int check_text(const char *text, size_t len, size_t max_len, core_error_t *err)
{
    if (max_len == 0 || max_len > CORE_TOK_MAX_TEXT)
        max_len = CORE_TOK_MAX_TEXT;
    if (len > max_len)
        return core_error_set(err, CORE_ERANGE, "text of %zu bytes exceeds the limit of %zu", len, max_len);
    if (!text && len)
        return core_error_set(err, CORE_EINVAL, "NULL text with length %zu", len);
    return 0;
}

int core_tokenizer_encode(const core_tokenizer_t *t, const char *text, size_t len, size_t max_len,
                          unsigned flags, int32_t *ids, size_t cap, size_t *n_ids, core_error_t *err)
{
    *n_ids = 0;
    int rc = check_text(text, len, max_len, err);
    if (rc)
        return rc;
    if (!ids && cap)
        return core_error_set(err, CORE_EINVAL, "NULL id buffer with capacity %zu", cap);
    enc_t e;
    memset(&e, 0, sizeof e);
    e.t = t;
    e.err = err;
    e.fixed = 1;
    e.ids = ids;
    e.cap = cap;
    rc = encode_run(&e, (const unsigned char *)text, len, flags, NULL, 0);
    enc_release(&e);
    if (rc)
        return rc;
    *n_ids = e.n;
    if (e.n > cap)
        return core_error_set(err, CORE_ERANGE, "text needs %zu tokens, buffer has %zu", e.n, cap);
    return 0;
}

int core_tokenizer_encode_alloc(const core_tokenizer_t *t, const char *text, size_t len,
                                size_t max_len, size_t max_tokens, unsigned flags, int32_t **ids,
                                size_t *n_ids, core_error_t *err)
{
    return core_tokenizer_encode_plain_alloc(t, text, len, max_len, max_tokens, flags, NULL, 0,
                                             ids, n_ids, err);
}

int core_tokenizer_encode_plain_alloc(const core_tokenizer_t *t, const char *text, size_t len,
                                      size_t max_len, size_t max_tokens, unsigned flags,
                                      const core_tok_range_t *plain, size_t n_plain,
                                      int32_t **ids, size_t *n_ids, core_error_t *err)
{
    *ids = NULL;
    *n_ids = 0;
    int rc = check_text(text, len, max_len, err);
    if (rc)
        return rc;
    if (n_plain && !plain)
        return core_error_set(err, CORE_EINVAL, "NULL plain ranges with count %zu", n_plain);
    for (size_t k = 0, prev_end = 0; k < n_plain; k++) {
        if (plain[k].off < prev_end || plain[k].off > len || plain[k].len > len - plain[k].off)
            return core_error_set(err, CORE_EINVAL,
                                  "plain range %zu [%zu, +%zu) is out of order or outside the "
                                  "%zu-byte text",
                                  k, plain[k].off, plain[k].len, len);
        prev_end = plain[k].off + plain[k].len;
    }
    enc_t e;
    memset(&e, 0, sizeof e);
    e.t = t;
    e.err = err;
    e.limit = max_tokens;
    rc = encode_run(&e, (const unsigned char *)text, len, flags, plain, n_plain);
    enc_release(&e);
    if (rc) {
        free(e.ids);
        return rc;
    }
    *ids = e.ids;
    *n_ids = e.n;
    return 0;
}
