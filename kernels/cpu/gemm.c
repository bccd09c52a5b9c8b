/* gemm: the single-precision matrix product under linear and conv2d.
 *
 * BLIS-style blocking, in plain C:
 *
 *     for jc in N step NC:            B block  [KC x NC]  packed into NR-wide column panels (L3)
 *       for pc in K step KC:
 *         for ic in M step MC:        A block  [MC x KC]  packed into MR-tall row panels (L2)
 *           for each MR x NR tile:    micro-kernel: KC rank-1 updates into an MR x NR register tile
 *
 * Invariants:
 *  1. Packed panels are zero-padded to full MR / NR, so the micro-kernel always runs a full tile;
 *     only the write-back is clipped at the edges of C.
 *  2. beta is applied once, before the first K block; every K block then adds alpha * A_p B_p.
 *     beta == 0 stores zeros first, so stale NaNs in C never leak into the result.
 *  3. The accumulation order over k is fixed for a given (M, N, K) and does not depend on the
 *     number of threads: threads split C into disjoint row (or column) slices, each computed by
 *     the same serial code. Results are bitwise reproducible across thread counts.
 *  4. Problems under PAR_MIN_WORK multiply-adds stay on the calling thread (a thread spawn costs
 *     tens of microseconds); larger ones use up to ps_cpu_threads() pthreads.
 *
 * The micro-kernel holds one row of the tile per 8-float vector (GCC vector extension), and full
 * panels are packed by fixed-length copies, so the code is vector code at -O2 as at -O3 (gcc
 * -O2 left the earlier scalar-array form scalar). On x86-64 with GCC the macro-kernel is also
 * compiled for AVX2 + FMA (8 x 8 tiles) and for AVX-512 (8 x 32 tiles: two 16-float registers per
 * row, 16 accumulators), picked at run time (__builtin_cpu_supports), so one binary runs
 * everywhere and uses the wide units when present. FMA changes rounding in the last bit compared
 * with the baseline version; the AVX-512 kernel does exactly the FMA kernel's operations per
 * element of C (the same fused multiply-adds in the same k order, then c + alpha * acc per K
 * block as a separate multiply and add), so the two agree bit for bit (test_kernels checks it).
 * Packed B panels are NR = 8 columns wide for the plain and FMA kernels and NB512 = 32 for the
 * AVX-512 one.
 */
#include "kernels/cpu/kernels.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>
#endif

enum { MR = 8, NR = 8, NB512 = 32, MC = 128, KC = 256, NC = 2048 };
#define PAR_MIN_WORK ((size_t)1 << 21)
#define MAX_THREADS 16

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__OPTIMIZE__)
/* (gcc cannot inline the FMA intrinsics into the target clone at -O0) */
#define HAVE_FMA_CLONE 1
#define FMA_TARGET __attribute__((target("avx2,fma")))
#define AVX512_TARGET __attribute__((target("avx512f,avx2,fma")))
#else
#define HAVE_FMA_CLONE 0
#endif

static atomic_int g_threads;
static _Thread_local int tl_threads;

void ps_cpu_set_threads(int n)
{
    atomic_store(&g_threads, n > MAX_THREADS ? MAX_THREADS : n);
}

void ps_cpu_set_threads_local(int n)
{
    tl_threads = n > MAX_THREADS ? MAX_THREADS : n;
}

int ps_cpu_threads(void)
{
    if (tl_threads > 0) return tl_threads;
    int n = atomic_load(&g_threads);
    if (n > 0) return n;
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    if (c < 1) c = 1;
    return c > MAX_THREADS ? MAX_THREADS : (int)c;
}

struct gemm_args {
    bool ta, tb;
    size_t m, n, k;
    float alpha;
    const float *a, *b;
    size_t lda, ldb;
    float beta;
    float *c;
    size_t ldc;
    float *pa, *pb; /* packing buffers: MC*KC and KC*round_up(min(n, NC), nb) floats */
    size_t nb;      /* width of a packed B panel: NR, or NB512 for the AVX-512 kernel */
    const struct ps_cpu_bsource *bs; /* B packs itself (b unused), or NULL */
    size_t j_off;                    /* with bs: this slice's first column of op(B) */
    const struct ps_cpu_apack *ap;   /* op(A) packed once (a unused), or NULL */
    size_t a_row0;                   /* with ap: this slice's first row of op(A) */
};

/* The macro-kernels this machine can run (chosen once, see kernel_kind). */
enum gemm_kernel { GEMM_PLAIN, GEMM_FMA, GEMM_AVX512 };

/* One row of a tile or panel: 8 floats, loaded and stored unaligned. */
_Static_assert(MR == 8 && NR == 8, "a tile row and a packed panel row are one vec8");
typedef float vec8 __attribute__((vector_size(NR * sizeof(float)), aligned(sizeof(float))));

/* Packs kc rows of a panel of `width` (<= W) columns into dst[p*W + j], zero-padded to W columns:
 * element (p, j) is src[p*ps + j*js]. A full panel with contiguous columns (js == 1) is a
 * one vector move per row (W == 8). */
static inline void pack_panel(const float *restrict src, size_t ps, size_t js, size_t kc,
                              size_t width, float *restrict dst, size_t W)
{
    if (width == W && js == 1) {
        if (W == 8) {
            for (size_t p = 0; p < kc; p++) *(vec8 *)(dst + p * W) = *(const vec8 *)(src + p * ps);
            return;
        }
        for (size_t p = 0; p < kc; p++)
            for (size_t v = 0; v < W; v += 8)
                *(vec8 *)(dst + p * W + v) = *(const vec8 *)(src + p * ps + v);
        return;
    }
    if (width == W && ps == 1) {
        /* a transposed panel: read each source column contiguously, write it strided */
        for (size_t j = 0; j < W; j++)
            for (size_t p = 0; p < kc; p++) dst[p * W + j] = src[j * js + p];
        return;
    }
    for (size_t p = 0; p < kc; p++) {
        size_t j = 0;
        for (; j < width; j++) dst[p * W + j] = src[p * ps + j * js];
        for (; j < W; j++) dst[p * W + j] = 0.0f;
    }
}

/* op(A)(i, p) packed as panels of MR rows: panel r holds pa[r*MR*kc + p*MR + i]. */
static void pack_a(const struct gemm_args *g, size_t i0, size_t mc, size_t p0, size_t kc,
                   float *restrict pa)
{
    for (size_t r = 0; r < mc; r += MR) {
        size_t mr = mc - r < MR ? mc - r : MR;
        if (g->ta)
            pack_panel(g->a + p0 * g->lda + i0 + r, g->lda, 1, kc, mr, pa + r * kc, MR);
        else
            pack_panel(g->a + (i0 + r) * g->lda + p0, 1, g->lda, kc, mr, pa + r * kc, MR);
    }
}

/* op(B)(p, j) packed as panels of W = g->nb columns: panel s holds pb[s*W*kc + p*W + j]. */
static void pack_b(const struct gemm_args *g, size_t j0, size_t nc, size_t p0, size_t kc,
                   float *restrict pb)
{
    size_t W = g->nb;
    for (size_t s = 0; s < nc; s += W) {
        size_t nr = nc - s < W ? nc - s : W;
        if (g->bs)
            g->bs->pack(g->bs->ctx, p0, kc, g->j_off + j0 + s, nr, pb + s * kc, W);
        else if (g->tb)
            pack_panel(g->b + (j0 + s) * g->ldb + p0, 1, g->ldb, kc, nr, pb + s * kc, W);
        else
            pack_panel(g->b + p0 * g->ldb + j0 + s, g->ldb, 1, kc, nr, pb + s * kc, W);
    }
}

/* One MR x NR tile: kc rank-1 updates in registers, then c += alpha * acc (clipped at edges).
 * A row of the tile is one vector of NR = 8 floats (GCC vector extension; an AVX register, two
 * SSE ones). Per k: one load of B's row, then per tile row a broadcast of A's element and a
 * multiply-add into that row's accumulator. The tile is computed RB rows at a time so the
 * accumulators fit the register file: RB = 8 with 16 AVX registers, RB = 4 with 16 SSE ones.
 * MADD is a*b+c: _mm256_fmadd_ps in the FMA clone (one rounding, as fmaf), a separate multiply
 * and add otherwise (-std=c17 turns off floating-point contraction). Either way each element of
 * C sees the same operations in the same k order as the scalar definition. */
#define DEFINE_MICRO_KERNEL(name, MADD, RB, attr)                                              \
    attr static inline __attribute__((always_inline)) void name(                              \
        size_t kc, const float *restrict a, const float *restrict b, float *restrict c,       \
        size_t ldc, float alpha, size_t mr, size_t nr)                                         \
    {                                                                                          \
        for (int r0 = 0; r0 < MR && (size_t)r0 < mr; r0 += RB) {                               \
            vec8 acc[RB];                                                                      \
            _Pragma("GCC unroll 8") for (int i = 0; i < RB; i++) acc[i] = (vec8){0};           \
            for (size_t p = 0; p < kc; p++) {                                                  \
                const float *ap = a + p * MR + r0;                                             \
                vec8 bv = *(const vec8 *)(b + p * NR);                                         \
                _Pragma("GCC unroll 8") for (int i = 0; i < RB; i++)                           \
                    acc[i] = MADD(ap[i], bv, acc[i]);                                          \
            }                                                                                  \
            float *cr = c + (size_t)r0 * ldc;                                                  \
            if ((size_t)r0 + RB <= mr && nr == NR) {                                           \
                _Pragma("GCC unroll 8") for (int i = 0; i < RB; i++) {                         \
                    vec8 *ci = (vec8 *)(cr + (size_t)i * ldc);                                 \
                    *ci += alpha * acc[i];                                                     \
                }                                                                              \
            } else {                                                                           \
                for (size_t i = 0; i < RB && r0 + i < mr; i++)                                 \
                    for (size_t j = 0; j < nr; j++) cr[i * ldc + j] += alpha * acc[i][j];      \
            }                                                                                  \
        }                                                                                      \
    }

#define MADD_PLAIN(s, v, acc) ((acc) + (s) * (v))
DEFINE_MICRO_KERNEL(micro_kernel_plain, MADD_PLAIN, 4, )
#if HAVE_FMA_CLONE
#define MADD_FMA(s, v, acc) ((vec8)_mm256_fmadd_ps(_mm256_set1_ps(s), (__m256)(v), (__m256)(acc)))
DEFINE_MICRO_KERNEL(micro_kernel_fma, MADD_FMA, 8, FMA_TARGET)
#endif

#define DEFINE_MACRO_KERNEL(name, micro, attr)                                                   \
    attr static void name(size_t mc, size_t nc, size_t kc, const float *pa, const float *pb,     \
                          float *c, size_t ldc, float alpha)                                      \
    {                                                                                             \
        for (size_t s = 0; s < nc; s += NR) {                                                     \
            size_t nr = nc - s < NR ? nc - s : NR;                                                \
            for (size_t r = 0; r < mc; r += MR) {                                                 \
                size_t mr = mc - r < MR ? mc - r : MR;                                            \
                micro(kc, pa + r * kc, pb + s * kc, c + r * ldc + s, ldc, alpha, mr, nr);         \
            }                                                                                     \
        }                                                                                         \
    }

DEFINE_MACRO_KERNEL(macro_kernel_plain, micro_kernel_plain, )
#if HAVE_FMA_CLONE
DEFINE_MACRO_KERNEL(macro_kernel_fma, micro_kernel_fma, FMA_TARGET)

/* One MR x 32 tile with AVX-512: row i of the tile is acc[i][0] (columns 0-15) and acc[i][1]
 * (16-31), 16 accumulators; per k two loads of B and, per row, one broadcast of A feeding two
 * fused multiply-adds. The write-back is c + alpha * acc (multiply, then add: no contraction, as
 * the FMA kernel), with masked loads and stores for a clipped panel. */
AVX512_TARGET static inline __attribute__((always_inline)) void
micro_kernel_avx512(size_t kc, const float *restrict a, const float *restrict b,
                    float *restrict c, size_t ldc, float alpha, size_t mr, size_t nr)
{
    __m512 acc[MR][2];
    _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] =
        _mm512_setzero_ps();
    for (size_t p = 0; p < kc; p++) {
        __m512 b0 = _mm512_loadu_ps(b + p * NB512), b1 = _mm512_loadu_ps(b + p * NB512 + 16);
        const float *ap = a + p * MR;
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {
            __m512 av = _mm512_set1_ps(ap[i]);
            acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
        }
    }
    __m512 al = _mm512_set1_ps(alpha);
    __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1u);
    __mmask16 m1 = nr >= 32   ? (__mmask16)0xffff
                   : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1u)
                             : (__mmask16)0;
    for (size_t i = 0; i < mr; i++) {
        float *ci = c + i * ldc;
        __m512 c0 = _mm512_maskz_loadu_ps(m0, ci), c1 = _mm512_maskz_loadu_ps(m1, ci + 16);
        _mm512_mask_storeu_ps(ci, m0, _mm512_add_ps(c0, _mm512_mul_ps(al, acc[i][0])));
        _mm512_mask_storeu_ps(ci + 16, m1, _mm512_add_ps(c1, _mm512_mul_ps(al, acc[i][1])));
    }
}

AVX512_TARGET static void macro_kernel_avx512(size_t mc, size_t nc, size_t kc, const float *pa,
                                              const float *pb, float *c, size_t ldc, float alpha)
{
    for (size_t s = 0; s < nc; s += NB512) {
        size_t nr = nc - s < NB512 ? nc - s : NB512;
        for (size_t r = 0; r < mc; r += MR) {
            size_t mr = mc - r < MR ? mc - r : MR;
            micro_kernel_avx512(kc, pa + r * kc, pb + s * kc, c + r * ldc + s, ldc, alpha, mr,
                                nr);
        }
    }
}
#endif

static _Atomic int g_kernel = -1; /* enum gemm_kernel; -1 = not chosen yet */

static enum gemm_kernel best_kernel(void)
{
#if HAVE_FMA_CLONE
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return __builtin_cpu_supports("avx512f") ? GEMM_AVX512 : GEMM_FMA;
#endif
    return GEMM_PLAIN;
}

static enum gemm_kernel kernel_kind(void)
{
    int k = atomic_load(&g_kernel);
    if (k < 0) {
        k = (int)best_kernel();
        atomic_store(&g_kernel, k);
    }
    return (enum gemm_kernel)k;
}

static const char *const kernel_names[] = {"plain", "fma", "avx512"};

const char *ps_cpu_gemm_kernel(void) { return kernel_names[kernel_kind()]; }

int ps_cpu_gemm_use(const char *name)
{
    enum gemm_kernel best = best_kernel();
    if (!name) {
        atomic_store(&g_kernel, (int)best);
        return 0;
    }
    for (int k = 0; k <= (int)best; k++)
        if (strcmp(name, kernel_names[k]) == 0) {
            atomic_store(&g_kernel, k);
            return 0;
        }
    return -ENOTSUP;
}

static void macro_kernel(const struct gemm_args *g, size_t mc, size_t nc, size_t kc,
                         const float *pa, float *c)
{
    switch (g->nb == NB512 ? GEMM_AVX512 : kernel_kind() == GEMM_PLAIN ? GEMM_PLAIN : GEMM_FMA) {
#if HAVE_FMA_CLONE
    case GEMM_AVX512: macro_kernel_avx512(mc, nc, kc, pa, g->pb, c, g->ldc, g->alpha); return;
    case GEMM_FMA: macro_kernel_fma(mc, nc, kc, pa, g->pb, c, g->ldc, g->alpha); return;
#else
    case GEMM_AVX512:
    case GEMM_FMA:
#endif
    case GEMM_PLAIN: break;
    }
    macro_kernel_plain(mc, nc, kc, pa, g->pb, c, g->ldc, g->alpha);
}

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* Pre-packed op(A): K block q (rows p0 = q*KC .. of op(A)'s K) starts at q * KC * round_up(m, MR);
 * inside it, rows i .. i+MR-1 are the panel at i * kc, as pack_a writes them. */
static const float *packed_block(const struct ps_cpu_apack *ap, size_t row, size_t p0, size_t kc)
{
    return ap->buf + (p0 / KC) * KC * round_up(ap->m, MR) + row * kc;
}

int ps_cpu_apack_make(struct ps_cpu_apack *ap, bool trans_a, size_t m, size_t k, const float *a,
                      size_t lda)
{
    memset(ap, 0, sizeof(*ap));
    size_t m8 = round_up(m ? m : 1, MR);
    ap->buf = aligned_alloc(64, round_up(m8 * (k ? k : 1) * sizeof(float), 64));
    if (!ap->buf) return -ENOMEM;
    ap->m = m;
    ap->k = k;
    struct gemm_args g = {.ta = trans_a, .a = a, .lda = lda};
    for (size_t p0 = 0; p0 < k; p0 += KC) {
        size_t kc = k - p0 < KC ? k - p0 : KC;
        pack_a(&g, 0, m, p0, kc, (float *)packed_block(ap, 0, p0, kc));
    }
    return 0;
}

void ps_cpu_apack_free(struct ps_cpu_apack *ap)
{
    free(ap->buf);
    memset(ap, 0, sizeof(*ap));
}

static void gemm_serial(const struct gemm_args *g)
{
    for (size_t i = 0; i < g->m; i++) {
        float *row = g->c + i * g->ldc;
        if (g->beta == 0.0f)
            memset(row, 0, g->n * sizeof(float));
        else if (g->beta != 1.0f)
            for (size_t j = 0; j < g->n; j++) row[j] *= g->beta;
    }
    if (g->k == 0 || g->alpha == 0.0f) return;
    for (size_t jc = 0; jc < g->n; jc += NC) {
        size_t nc = g->n - jc < NC ? g->n - jc : NC;
        for (size_t pc = 0; pc < g->k; pc += KC) {
            size_t kc = g->k - pc < KC ? g->k - pc : KC;
            pack_b(g, jc, nc, pc, kc, g->pb);
            for (size_t ic = 0; ic < g->m; ic += MC) {
                size_t mc = g->m - ic < MC ? g->m - ic : MC;
                const float *pa = g->ap ? packed_block(g->ap, g->a_row0 + ic, pc, kc) : g->pa;
                if (!g->ap) pack_a(g, ic, mc, pc, kc, g->pa);
                macro_kernel(g, mc, nc, kc, pa, g->c + ic * g->ldc + jc);
            }
        }
    }
}

static void *gemm_thread(void *arg)
{
    gemm_serial(arg);
    return NULL;
}

static size_t pack_floats(size_t n, size_t nb)
{
    /* rounded to 16 floats so every slice's buffers start 64-byte aligned */
    return round_up((size_t)MC * KC + (size_t)KC * round_up(n < NC ? n : NC, nb), 16);
}

static int sgemm(bool trans_a, bool trans_b, size_t m, size_t n, size_t k, float alpha,
                 const float *a, size_t lda, const struct ps_cpu_apack *ap, const float *b,
                 size_t ldb, const struct ps_cpu_bsource *bs, float beta, float *c, size_t ldc)
{
    if (m == 0 || n == 0) return 0;
    size_t nb = kernel_kind() == GEMM_AVX512 ? NB512 : NR;
    struct gemm_args base = {trans_a, trans_b, m, n, k, alpha, a, b, lda, ldb, beta, c, ldc,
                             NULL, NULL, nb, bs, 0, ap, 0};
    size_t nt = 1;
    if (m * n * k >= PAR_MIN_WORK) nt = (size_t)ps_cpu_threads();
    /* Split the longer side of C into slices of whole tiles. */
    bool split_rows = m >= n;
    size_t side = split_rows ? m : n, unit = split_rows ? MR : nb;
    size_t tiles = (side + unit - 1) / unit;
    if (nt > tiles) nt = tiles;
    if (nt < 1) nt = 1;

    struct gemm_args parts[MAX_THREADS];
    size_t per = (tiles + nt - 1) / nt * unit;
    size_t total = 0;
    for (size_t t = 0; t < nt; t++) {
        parts[t] = base;
        size_t lo = t * per, hi = lo + per < side ? lo + per : side;
        if (split_rows) {
            parts[t].m = hi - lo;
            if (!ap) parts[t].a = trans_a ? a + lo : a + lo * lda;
            parts[t].a_row0 = lo;
            parts[t].c = c + lo * ldc;
        } else {
            parts[t].n = hi - lo;
            if (!bs) parts[t].b = trans_b ? b + lo * ldb : b + lo;
            parts[t].j_off = lo;
            parts[t].c = c + lo;
        }
        total += pack_floats(parts[t].n, nb);
    }
    float *buf = ps_cpu_scratch(PS_CPU_SCRATCH_GEMM, total * sizeof(float));
    if (!buf) return -ENOMEM;
    float *p = buf;
    for (size_t t = 0; t < nt; t++) {
        parts[t].pa = p;
        parts[t].pb = p + (size_t)MC * KC;
        p += pack_floats(parts[t].n, nb);
    }

    pthread_t tid[MAX_THREADS];
    size_t started = 0;
    for (size_t t = 1; t < nt; t++) {
        if (pthread_create(&tid[t], NULL, gemm_thread, &parts[t]) != 0) break;
        started = t;
    }
    gemm_serial(&parts[0]);
    for (size_t t = 1; t <= started; t++) pthread_join(tid[t], NULL);
    /* A failed spawn is not an error: the remaining slices run here, same arithmetic. */
    for (size_t t = started + 1; t < nt; t++) gemm_serial(&parts[t]);
    return 0;
}

int ps_cpu_sgemm(bool trans_a, bool trans_b, size_t m, size_t n, size_t k, float alpha,
                 const float *a, size_t lda, const float *b, size_t ldb, float beta, float *c,
                 size_t ldc)
{
    return sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, NULL, b, ldb, NULL, beta, c, ldc);
}

int ps_cpu_sgemm_apacked(const struct ps_cpu_apack *a, size_t n, float alpha, const float *b,
                         size_t ldb, const struct ps_cpu_bsource *bs, float beta, float *c,
                         size_t ldc)
{
    return sgemm(false, false, a->m, n, a->k, alpha, NULL, 0, a, b, ldb, bs, beta, c, ldc);
}

int ps_cpu_sgemm_bsource(bool trans_a, size_t m, size_t n, size_t k, float alpha, const float *a,
                         size_t lda, const struct ps_cpu_bsource *b, float beta, float *c,
                         size_t ldc)
{
    return sgemm(trans_a, false, m, n, k, alpha, a, lda, NULL, NULL, 0, b, beta, c, ldc);
}
