/* core/kernels/qdot.h — matrix products against quantized (or F16, BF16) weight rows,
 * read in place.
 *
 * Decode multiplies a few activation rows by every weight matrix, so it is
 * bound by reading the weights. These kernels read the GGUF blocks directly
 * (Q4_1 is ~5 bits per weight instead of 32, F16 16) and dequantize in
 * registers.
 *
 * Error contract (what tests/unit/test_core_qdot.c checks against
 * core_dot_ref): every output is within gamma(k/4 + 8) * S of the exact sum,
 * gamma(n) = n u / (1 - n u), u = 2^-24, S = sum_i |y_i x_i| with y the
 * values core_dequantize gives; for types with a block offset (Q4_1: y = d q +
 * m) the one-row kernel factors d and m out of the block sums, so there S =
 * sum_i (|y_i| + 2 |m_b|) |x_i| (>= sum_i (|d q_i| + |m_b|) |x_i|). F16 and
 * BF16 have no scale or offset and every value converts to f32 exactly, so
 * for them the bound is gamma(k/4 + 8) * sum_i |y_i x_i| for any k (the
 * kernels keep at most k/4 + 8 operations in any value's chain).
 *
 * Integer path (core_q8_*, the decode path of core/model.c): activation rows
 * are quantized once per product to 8 bits per block of 32 (core_q8_act_t),
 * and every weight block of 32 is multiplied in integers: I_b = sum_i u_i *
 * q_a,i is exact, u_i the block's integer weights (the stored quants; for
 * Q6_K, whose 16-value halves have their own int8 scale sc, sc * (q - 32)),
 * then scaled by d_w * d_a (plus m_w * (d_a * sum_i q_a,i) for the offset
 * types: Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K). Kernels: a scalar reference
 * (CORE_QDOT_GENERIC), AVX2 (u8 x s8 with maddubs) and AVX-512 VNNI
 * (dpbusd, two blocks per vector); on aarch64 NEON (s8 x s8 with SMULL)
 * and NEON with SDOT, which form the same lane sums (the same bits).
 * Error contract, what tests/unit/test_core_qdot_q8.c checks:
 *  - every variant computes the same per-block integer sums as the scalar
 *    reference (checked bit for bit with power-of-two scales, where every
 *    float operation is exact);
 *  - against E = sum_b d_w d_a I_b + m_w ds_b in exact arithmetic (I_b the
 *    block's integer sum, ds_b = fl(d_a s_b), s_b the sum of its q_a) every
 *    output is within gamma(nb + 8) * S8, S8 = sum_b |d_w d_a| sum_i |u_i
 *    q_a,i| + |m_w ds_b|
 *    (SIMD kernels scale partial sums of a block's products, lane by lane,
 *    whose magnitudes are bounded by sum_i |u_i q_a,i|, not by |I_b|);
 *  - against core_dot_ref on the unquantized activations, E is within
 *    sum_b sum_{i in b} |y_i| (d_a,b / 2 + 2u |x_i|), the rounding of x to
 *    d_a q (|x - d_a q| <= d_a / 2 plus the rounding of x / d_a).
 * Each output element is computed by the same operations whatever range of
 * weight rows a call covers and however many activation rows it has, so
 * splitting rows across threads is bit-exact, and so is batching decode
 * rows (a row alone gives the bits it gets in a batch).
 *
 * No allocation, no I/O; global state is a 256 KiB fp16->f32 table, filled
 * once (pthread_once); the CPU probe and the ISA override are cpu.h's.
 * Thread-safe.
 */
#ifndef DARKSERVE_CORE_QDOT_H
#define DARKSERVE_CORE_QDOT_H

#include <stddef.h>
#include <stdint.h>

#include "core/kernels/cpu.h"
#include "core/kernels/pool.h"


/* 1 when core_qmatmul_nt accepts weights of this type: the dequantizable
 * block types (block of 32 or 256 values), F16 and BF16; 0 for F32 (sgemm
 * reads it as it is) and unknown types. */
int core_qdot_supported(int type);
/* 1 when this type has a dedicated SIMD kernel (Q4_0, Q4_1, Q8_0, F16,
 * BF16); the other supported types go through a dequantize-one-block-then-FMA
 * path. */
int core_qdot_has_fast_kernel(int type);
/* The ISA choice (core_qdot_isa, core_qdot_force_isa) lives in
 * core/kernels/cpu.h. */

/* C[m][n] = A[m][k] · Wᵀ + beta * C, W being n rows of k values of the given
 * type, row j starting at (const char *)w + j * row_bytes (row_bytes >=
 * core_ttype_row_bytes(type, k)). a (borrowed, [m][lda] floats), w
 * (borrowed), c (caller-owned, [m][ldc] floats). beta == 0 overwrites C (NaN
 * in C does not propagate). Preconditions (caller's, not checked in the hot
 * path): core_qdot_supported(type), k a multiple of the type's block (any k
 * for F16, BF16), m, n >= 0. Best ISA of this CPU. */
void core_qmatmul_nt(int type, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                     const void *w, size_t row_bytes, float beta, float *c, int64_t ldc);
/* Same with an explicit ISA (for tests comparing paths). Returns 0, or
 * CORE_EUNSUPPORTED when this CPU cannot run isa (nothing is written), or
 * CORE_EINVAL when type is not supported or k is not a multiple of its
 * block. */
int core_qmatmul_nt_isa(core_qdot_isa_t isa, int type, int64_t m, int64_t n, int64_t k,
                        const float *a, int64_t lda, const void *w, size_t row_bytes, float beta,
                        float *c, int64_t ldc);

/* dst[0..n) = the n values of type at src, exactly what core_dequantize
 * gives (n a multiple of the type's block, src whole blocks), with SIMD for
 * Q4_0, Q4_1, Q8_0, F16 and BF16 where the CPU has AVX2 or NEON: for prompt
 * products that dequantize weight tiles (core/model.c). One exception to
 * "exactly": an F16 signaling NaN comes out of F16C or FCVTL as a quiet NaN
 * (core_dequantize keeps the pattern); still a NaN. Preconditions as core_qmatmul_nt's
 * (core_qdot_supported(type)); not checked. */
void core_qdot_dequant(int type, const void *src, float *dst, int64_t n);
/* The same on an explicit ISA; CORE_EUNSUPPORTED when this CPU cannot run
 * it, CORE_EINVAL for a type or n core_dequantize refuses. */
int core_qdot_dequant_isa(core_qdot_isa_t isa, int type, const void *src, float *dst, int64_t n);

/* ---- integer path ---- */

enum { CORE_Q8_BLOCK = 32 };

/* m activation rows of k values quantized per block of 32 consecutive values
 * of a row (k padded with zeros to nb * 32): x ~= d * q, q in [-127, 127],
 * d = max |x| / 127 over the block (0 for an all-zero block), q = x / d
 * rounded to nearest even; s is the block's sum of q and ds = d * s (float
 * product; the offset types use it). Views into a caller-owned buffer of
 * core_q8_act_bytes(m, k) bytes. */
typedef struct core_q8_act {
    int64_t m, k, nb; /* rows, values per row, blocks per row = ceil(k / 32) */
    int8_t *q;        /* [m][nb * 32] */
    float *d;         /* [m][nb] */
    int32_t *s;       /* [m][nb] */
    float *ds;        /* [m][nb] */
} core_q8_act_t;

/* 1 for the weight types core_q8_matmul multiplies: Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0, and the K-quants Q4_K, Q5_K, Q6_K (each 32 values of a super-block
 * meet one activation block: one sub-block, or two of 16 for Q6_K). */
int core_q8_supported(int type);
/* Bytes of the buffer behind an activation of m rows of k values (m, k >= 0;
 * m * k <= 2^40), a multiple of 64. */
size_t core_q8_act_bytes(int64_t m, int64_t k);
/* Lays qa out over buf (borrowed by qa; core_q8_act_bytes(m, k) bytes, any
 * alignment >= 4). */
void core_q8_act_init(core_q8_act_t *qa, void *buf, int64_t m, int64_t k);
/* Quantizes a ([qa->m][lda] floats, borrowed) into qa. Every ISA gives the
 * same bytes. */
void core_q8_quantize(core_q8_act_t *qa, const float *a, int64_t lda);
int core_q8_quantize_isa(core_qdot_isa_t isa, core_q8_act_t *qa, const float *a, int64_t lda);

/* C[i][j] = qa row i . W row j + beta * C[i][j] for i < qa->m and j in
 * [j0, j1): W rows of qa->k values of the given type, row j at (const char
 * *)w + j * row_bytes; c points at C[0][0] ([qa->m][ldc], caller-owned).
 * beta == 0 overwrites C. Preconditions (not checked): core_q8_supported(type),
 * qa->k a multiple of the type's block (32, or 256 for the K-quants),
 * 0 <= j0 <= j1. */
void core_q8_matmul(int type, const core_q8_act_t *qa, int64_t j0, int64_t j1, const void *w,
                    size_t row_bytes, float beta, float *c, int64_t ldc);
/* Same with an explicit ISA. 0, CORE_EUNSUPPORTED (CPU) or CORE_EINVAL (type,
 * k, range). */
int core_q8_matmul_isa(core_qdot_isa_t isa, int type, const core_q8_act_t *qa, int64_t j0,
                       int64_t j1, const void *w, size_t row_bytes, float beta, float *c,
                       int64_t ldc);

/* ---- weights repacked for the packed decode kernels (core/kernels/qdot_pack.c: AVX-512
 * VNNI; core/kernels/qdot_pack_avx2.c: AVX2; core/kernels/qdot_pack_neon.c: aarch64
 * NEON with or without dotprod; the same bits) ----
 * Q4_0, Q4_1 and Q8_0 matrices laid out CORE_Q8_PACK_ROWS rows to a block, so
 * that one vector holds a block of 16 rows: no per-row float work or
 * horizontal sums, and a block's unpacked weights serve every activation row
 * (batched decode). The same integers and products as core_q8_matmul, summed
 * in block order with fused multiply-adds: within the same bound of the
 * reference, and a row's bits do not depend on the rows or activation rows
 * that share a call. */
#define CORE_Q8_PACK_ROWS 16
/* 1 when type packs and the chosen ISA (core_qdot_isa) is AVX2, AVX-512 VNNI,
 * NEON or NEON-dotprod (every one but the portable C). */
int core_q8_pack_supported(int type);
/* Bytes of rows x k weights packed (rows padded to whole groups of 16); 0
 * when the type does not pack or k is not a positive multiple of 32. */
size_t core_q8_pack_bytes(int type, int64_t rows, int64_t k);
/* Packs rows x k weights (row j at (const char *)w + j * row_bytes) into dst
 * (core_q8_pack_bytes bytes, 64-byte aligned for speed). */
void core_q8_pack(int type, const void *w, size_t row_bytes, int64_t rows, int64_t k, void *dst);
/* Rows [j0, j0 + n) of a matrix of k values per row packed by core_q8_pack,
 * written to dst in the type's own block layout (k / 32 blocks a row, rows
 * one after the other): the bytes core_q8_pack read, so that a packed copy
 * can stand in for the original weights (core/model.c's embedding rows). */
void core_q8_unpack(int type, const void *pk, int64_t k, int64_t j0, int64_t n, void *dst);
/* core_q8_matmul on packed weights pk (rows [j0, j1) of the matrix packed
 * with qa->k values per row). 0, or CORE_EINVAL when the type does not pack
 * here or the range is bad. */
int core_q8_matmul_packed(int type, const core_q8_act_t *qa, int64_t j0, int64_t j1,
                          const void *pk, float beta, float *c, int64_t ldc);

/* Where the CPU has Intel AMX (AMX-TILE, AMX-INT8) and the OS grants its tile
 * state, core_q8_matmul_packed runs batches of CORE_Q8_AMX_MIN_ROWS or more
 * activation rows on tiles: the same integer sums from tile multiplies, the
 * same float work in the same order, so the same bits as the VNNI kernel
 * (tested); faster once a block's weights serve several rows. */
#define CORE_Q8_AMX_MIN_ROWS 8
#define CORE_Q8_AMX_MAX_BLOCKS 256 /* k <= 8192 (longer rows: the VNNI kernel) */
typedef enum core_q8_amx_mode {
    CORE_Q8_AMX_AUTO = -1,
    CORE_Q8_AMX_OFF = 0,
    CORE_Q8_AMX_ON = 1
} core_q8_amx_mode_t;
/* 1 when this CPU and OS run the tiles (probed once). */
int core_q8_amx_available(void);
/* Tests and benchmarks: CORE_Q8_AMX_AUTO (the default: tiles from
 * CORE_Q8_AMX_MIN_ROWS rows on), _OFF (never), _ON (for any row count).
 * Process-wide, meant for when no product runs. 0, CORE_EUNSUPPORTED (_ON
 * where the tiles are not available) or CORE_EINVAL. */
int core_q8_force_amx(core_q8_amx_mode_t mode);
/* 1 when core_q8_matmul_packed takes m activation rows onto the tiles. */
int core_q8_amx_used(int64_t m);

/* core_qmatmul_nt's product (f32 activation rows a[m][lda], prompts) on
 * packed weights pk, output columns [j0, j1) (j0 a multiple of 16):
 * C[i][j] = A[i] . W[j] + beta C[i][j]. CORE_Q8_PANEL_ROWS weight rows at a
 * time are dequantized (core_dequantize's floats) into panel, scratch of
 * core_q8_panel_floats(k) floats, 64-byte aligned; each output is then one
 * chain of k fused multiply-adds in order, so |C - exact| <= gamma(k) *
 * sum_e |a_e w_e| (plus the beta term's rounding) and a row's bits depend on
 * nothing but its own values: not on m, the rows beside it, the columns
 * asked for or the thread. 0, or CORE_EINVAL when the type does not pack
 * here or the arguments are bad. */
#define CORE_Q8_PANEL_ROWS 64
#define core_q8_panel_floats(k) ((size_t)CORE_Q8_PANEL_ROWS * (size_t)(k))
int core_qmatmul_packed(int type, int64_t m, int64_t j0, int64_t j1, int64_t k, const float *a,
                        int64_t lda, const void *pk, float *panel, float beta, float *c,
                        int64_t ldc);

/* The same product on Intel AMX-BF16 tiles, where the CPU has them
 * (core_q8_amx_panels_available: AMX-BF16 and AVX512-BF16 besides the
 * tiles). core_q8_amx_split first splits each f32 value v of the m rows of a
 * into hi = bf16(v) and lo = bf16(v - hi) (nearest even both; hi + lo holds
 * 16 bits of v's 24) at out: row r's k hi values at out + 2 k r, its k lo
 * values right after (core_q8_amx_split_words(m, k) uint16_t, 64-byte
 * aligned). core_qmatmul_packed_amx then takes those rows (as) instead of a:
 * the weights split the same way into the panel, per block of 32 values the
 * tile products a_hi w_hi, a_lo w_hi, a_hi w_lo (bf16 pairs, each product
 * exact in f32) added to one f32 sum per output, blocks in order. So |C -
 * exact| <= (2^-15 + k 2^-24) sum_e |a_e w_e| (the dropped a_lo w_lo and the
 * splits' remainders, then the f32 additions), and a row's bits again depend
 * on its own values only. 1.4x the f32 panels' speed at 28 rows, 2.3-2.5x
 * at 448 (the split of the weights is the fixed cost; one row is slower). Both return 0, or
 * CORE_EINVAL where the tiles are missing or the arguments are bad (k a
 * multiple of 32, j0 of 16, pointers 64-byte aligned).
 * core_q8_force_amx_panels / core_q8_amx_panels_used: the model's choice
 * (CORE_Q8_AMX_AUTO, the default: the tiles where available; _OFF: the f32
 * panels; _ON: CORE_EUNSUPPORTED where not available), process-wide, for
 * tests and benchmarks. */
#define core_q8_amx_split_words(m, k) ((size_t)2 * (size_t)(m) * (size_t)(k))
int core_q8_amx_panels_available(void);
int core_q8_force_amx_panels(core_q8_amx_mode_t mode);
int core_q8_amx_panels_used(void);
int core_q8_amx_split(const float *a, int64_t lda, int64_t m, int64_t k, uint16_t *out);
int core_qmatmul_packed_amx(int type, int64_t m, int64_t j0, int64_t j1, int64_t k,
                            const uint16_t *as, const void *pk, float *panel, float beta,
                            float *c, int64_t ldc);

/* One product of a batch run on a pool: n weight rows against qa (integer
 * path) or, when qa is NULL, against the f32 rows a (core_qmatmul_nt's
 * path, any core_qdot_supported type). Everything borrowed. pk: the same
 * weights packed (core_q8_pack), or NULL; used with qa when the ISA chosen
 * for the run packs. */
typedef struct core_qdot_job {
    int type;
    const void *w;
    const void *pk;
    size_t row_bytes;
    int64_t n;
    const core_q8_act_t *qa; /* or NULL */
    const float *a;          /* [m][lda] when qa is NULL */
    int64_t m, k, lda;       /* when qa is NULL */
    float beta;
    float *c;
    int64_t ldc;
} core_qdot_job_t;

/* Runs all jobs with their weight rows shared out among the pool's threads
 * in chunks (pool NULL: on the caller). Results equal a one-thread run bit for
 * bit. Same preconditions as the single products. */
void core_qdot_run_jobs(core_pool_t *pool, const core_qdot_job_t *jobs, int n_jobs);

#endif
