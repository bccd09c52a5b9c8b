/* dconv: conv2d's forward, input gradient and weight gradient as gathered products, without a
 * column matrix.
 *
 * The product is turned around compared with conv.c's im2col: output POSITIONS are the rows of
 * the register tile (one broadcast each) and output CHANNELS its columns (two 16-float AVX-512
 * vectors, 32 channels):
 *     y[n, o, q] = sum_p  B[p, o] * img(n, q, p)        p = (c, i, j) in c_in x kh x kw
 * B[p, o] = w[o, p] is the weight transposed, packed once into 32-channel panels (and kept by the
 * caller's struct ps_cpu_convcache until the weights change). img(n, q, p) is read straight from a
 * zero-padded copy of a few input rows (the chunk's scratch, a few hundred KB that stay in the
 * L2 cache): position q's window starts at qin[q], tap p sits poff[p] floats further, so a tile
 * needs no packing at all; conv.c's implicit im2col writes 9 floats per input float for a 3x3
 * kernel and that packing cost as much as a third of the product on 64-channel layers.
 *
 * The input gradient of a stride-1 convolution is itself a convolution (conv.c, conv_dx): of dy,
 * padded by k-1-padding, with the weight transposed in channels and flipped in space; its B is
 * packed straight from w. The weight gradient turns the roles once more (taps broadcast, dy
 * transposed per block of positions; "the weight gradient" below).
 *
 * Invariants:
 *  1. Same bits as conv.c's path on the same machine: per output element, the products over p
 *     run in K blocks of KC = 256 in the same order, each block a chain of fused multiply-adds
 *     from +0, and the element is 0 + block_0, then + block_1, ... (the sgemm's beta = 0 then
 *     c + 1 * acc); the bias is added last. fma(x, w, acc) == fma(w, x, acc) exactly.
 *  2. Used only with the AVX-512 kernel selected (ps_cpu_gemm_kernel) and at least 8 output
 *     channels (a panel of 32 with 16 real channels still beats packing columns: seed1's
 *     16-channel layers run 1.2-1.6x faster); everything else keeps conv.c's path.
 *  3. Threads (ps_cpu_threads) take disjoint chunks of positions (y, dx) or tap tiles (dw);
 *     every output element is computed by one thread with the same operations, so results do
 *     not depend on the count.
 *  4. Buffers are per call except the packed weights, which the caller's cache owns.
 */
#include "kernels/cpu/dconv.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__OPTIMIZE__)
#include <immintrin.h>
#define HAVE_DCONV 1
#define AVX512_TARGET __attribute__((target("avx512f,avx2,fma")))
#else
#define HAVE_DCONV 0
#endif

enum { TQ = 8, TO = 32, KC = 256, KS = 128, CHUNK_Q = 1024, MAX_THREADS = 16 };
#define PAR_MIN_WORK ((size_t)1 << 21)

static size_t round_up(size_t x, size_t m)
{
    return (x + m - 1) / m * m;
}

void ps_cpu_convcache_invalidate(struct ps_cpu_convcache *c)
{
    if (!c) return;
    c->fwd_valid = c->dx_valid = false;
}

void ps_cpu_convcache_free(struct ps_cpu_convcache *c)
{
    if (!c) return;
    free(c->fwd);
    free(c->dx);
    memset(c, 0, sizeof(*c));
}

bool ps_cpu_dconv_usable(size_t n_out)
{
#if HAVE_DCONV
    return n_out >= TO / 4 && strcmp(ps_cpu_gemm_kernel(), "avx512") == 0;
#else
    (void)n_out;
    return false;
#endif
}

/* B for the forward product: panel s, row p, lane j = w[s*TO + j, p] (0 past c_out). */
static void pack_fwd(const struct ps_conv2d_shape *s, const float *w, float *pb)
{
    size_t k = s->c_in * s->kh * s->kw, np = round_up(s->c_out, TO) / TO;
    for (size_t sp = 0; sp < np; sp++)
        for (size_t p = 0; p < k; p++) {
            float *d = pb + (sp * k + p) * TO;
            for (size_t j = 0; j < TO; j++) {
                size_t o = sp * TO + j;
                d[j] = o < s->c_out ? w[o * k + p] : 0.0f;
            }
        }
}

/* B for the input gradient: row p' = (o, t) over c_out x kh*kw, lane c: w[o, c, kk-1-t]. */
static void pack_dx(const struct ps_conv2d_shape *s, const float *w, float *pb)
{
    size_t kk = s->kh * s->kw, k = s->c_out * kk, np = round_up(s->c_in, TO) / TO;
    for (size_t sp = 0; sp < np; sp++)
        for (size_t o = 0; o < s->c_out; o++)
            for (size_t t = 0; t < kk; t++) {
                float *d = pb + (sp * k + o * kk + t) * TO;
                for (size_t j = 0; j < TO; j++) {
                    size_t c = sp * TO + j;
                    d[j] = c < s->c_in ? w[(o * s->c_in + c) * kk + (kk - 1 - t)] : 0.0f;
                }
            }
}

/* The packed B of one direction, from the cache when it holds one, else packed into *own. */
static const float *packed(const struct ps_conv2d_shape *s, const float *w, bool dx,
                           struct ps_cpu_convcache *cache, float **own)
{
    size_t n_out = dx ? s->c_in : s->c_out, k = (dx ? s->c_out : s->c_in) * s->kh * s->kw;
    size_t bytes = round_up(n_out, TO) * k * sizeof(float);
    float **slot = cache ? (dx ? &cache->dx : &cache->fwd) : own;
    bool *valid = cache ? (dx ? &cache->dx_valid : &cache->fwd_valid) : NULL;
    size_t *cap = cache ? (dx ? &cache->dx_bytes : &cache->fwd_bytes) : NULL;
    if (valid && *valid && *slot && *cap == bytes) return *slot;
    if (!*slot || !cap || *cap != bytes) {
        free(*slot);
        *slot = aligned_alloc(64, round_up(bytes, 64));
        if (!*slot) {
            if (cap) *cap = 0;
            return NULL;
        }
        if (cap) *cap = bytes;
    }
    (dx ? pack_dx : pack_fwd)(s, w, *slot);
    if (valid) *valid = true;
    return *slot;
}

/* ---- the gathered product ---------------------------------------------------------------- */

/* The geometry of one product: input img [n, ci, h, w] (with padding pad and stride st), output
 * [n, co, oh, ow], kernel kh x kw, B [ci*kh*kw, round_up(co, TO)] in panels. */
struct gprob {
    size_t n, ci, h, w, co, kh, kw, st, pad, oh, ow;
    const float *img, *pb, *bias;
    float *out;
    size_t rows;  /* output rows per chunk (rows == oh: whole samples) */
    size_t group; /* samples per chunk (1 unless rows == oh) */
    size_t irows; /* input rows held per chunk: (rows - 1) * st + kh */
    size_t pw;    /* padded row length w + 2 pad */
    size_t n_chunks, chunks_per_sample_group;
};

/* One thread's share of a product: items [lo, hi) (chunks of positions for y and dx, tap tiles
 * for dw). */
struct gwork {
    const struct gprob *g;
    const float *dy; /* dw only */
    float *dw;       /* dw only */
    size_t lo, hi;
    int rc;
};

/* Runs fn on nt threads (the caller's one among them), items split evenly; a failed spawn runs
 * its share here (same arithmetic). Returns the first error. */
static int split_run(void *(*fn)(void *), struct gwork base, size_t items, size_t work)
{
    size_t nt = work >= PAR_MIN_WORK ? (size_t)ps_cpu_threads() : 1;
    if (nt > items) nt = items;
    if (nt > MAX_THREADS) nt = MAX_THREADS;
    if (nt < 1) nt = 1;
    struct gwork wk[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (size_t t = 0; t < nt; t++) {
        wk[t] = base;
        wk[t].lo = items * t / nt;
        wk[t].hi = items * (t + 1) / nt;
        wk[t].rc = 0;
    }
    for (size_t t = 1; t < nt; t++)
        started[t] = pthread_create(&tid[t], NULL, fn, &wk[t]) == 0;
    fn(&wk[0]);
    int rc = wk[0].rc;
    for (size_t t = 1; t < nt; t++) {
        if (started[t])
            pthread_join(tid[t], NULL);
        else
            fn(&wk[t]);
        if (!rc) rc = wk[t].rc;
    }
    return rc;
}

#if HAVE_DCONV
/* One TQ x TO tile over kc taps of a K block: acc[i] += img(q_i, p) * B[p, 0..31], a chain of
 * fused multiply-adds that starts from +0 (resume false) or from the part the previous taps of
 * the same K block left in part[] (resume true). finish false leaves the chain in part[]; finish
 * true ends the K block: cb[i] = (first ? 0 : cb[i]) + acc[i] (invariant 1). Splitting a K block
 * into such pieces changes no bit (a float spilled and reloaded is the same float) and keeps the
 * taps' rows of the panel and of the image inside the L1 cache together. xs: the chunk's
 * scratch, qin: the tile's 8 window origins, poff: the piece's kc tap offsets, b: its kc rows of
 * the panel. */
AVX512_TARGET static inline __attribute__((always_inline)) void
tile_kernel(size_t kc, const float *xs, const uint32_t *qin, const uint32_t *poff, const float *b,
            float *part, bool resume, bool finish, float *cb, bool first)
{
    __m512 acc[TQ][2];
    size_t q0 = qin[0], q1 = qin[1], q2 = qin[2], q3 = qin[3];
    size_t q4 = qin[4], q5 = qin[5], q6 = qin[6], q7 = qin[7];
    _Pragma("GCC unroll 8") for (int i = 0; i < TQ; i++) {
        acc[i][0] = resume ? _mm512_load_ps(part + i * TO) : _mm512_setzero_ps();
        acc[i][1] = resume ? _mm512_load_ps(part + i * TO + 16) : _mm512_setzero_ps();
    }
    for (size_t p = 0; p < kc; p++) {
        __m512 b0 = _mm512_load_ps(b + p * TO), b1 = _mm512_load_ps(b + p * TO + 16);
        const float *xp = xs + poff[p]; /* tap p of every window: xp[qin[i]] */
#define ROW(i, qi)                                                                                 \
    do {                                                                                           \
        __m512 av = _mm512_set1_ps(xp[qi]);                                                        \
        acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);                                            \
        acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);                                            \
    } while (0)
        ROW(0, q0);
        ROW(1, q1);
        ROW(2, q2);
        ROW(3, q3);
        ROW(4, q4);
        ROW(5, q5);
        ROW(6, q6);
        ROW(7, q7);
#undef ROW
    }
    if (!finish) {
        _Pragma("GCC unroll 8") for (int i = 0; i < TQ; i++) {
            _mm512_store_ps(part + i * TO, acc[i][0]);
            _mm512_store_ps(part + i * TO + 16, acc[i][1]);
        }
        return;
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < TQ; i++)
    {
        float *c = cb + i * TO;
        __m512 c0 = first ? _mm512_setzero_ps() : _mm512_load_ps(c);
        __m512 c1 = first ? _mm512_setzero_ps() : _mm512_load_ps(c + 16);
        _mm512_store_ps(c, _mm512_add_ps(c0, acc[i][0]));
        _mm512_store_ps(c + 16, _mm512_add_ps(c1, acc[i][1]));
    }
}

/* An 8 x 8 block transposed: col[j][i] = base[i * stride + j]. */
AVX512_TARGET static inline __attribute__((always_inline)) void transpose8(const float *base,
                                                                           size_t stride,
                                                                           __m256 col[8])
{
    __m256 r[8], t[8], u[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps(base + i * stride);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int h = 0; h < 8; h += 4) {
        u[h] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int j = 0; j < 4; j++) {
        col[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
        col[j + 4] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
    }
}

/* out[o, qout[q0 + i]] = cb[q0 + i, j] (+ bias[o]) for the tile's 8 positions and the panel's nj
 * channels o = o0 + j: four 8 x 8 transposes when the 8 outputs of a channel are adjacent (the
 * tile does not cross a sample), one element at a time otherwise. Same additions either way. */
AVX512_TARGET static void tile_store(const float *cb, const size_t *qout, size_t nvalid, size_t o0,
                                     size_t nj, size_t plane, const float *bias, float *out)
{
    if (nvalid == TQ && qout[TQ - 1] - qout[0] == TQ - 1) {
        for (size_t jb = 0; jb < nj; jb += 8) {
            __m256 col[8];
            transpose8(cb + jb, TO, col);
            for (size_t j = 0; j < 8 && jb + j < nj; j++) {
                size_t o = o0 + jb + j;
                __m256 v = col[j];
                if (bias) v = _mm256_add_ps(v, _mm256_set1_ps(bias[o]));
                _mm256_storeu_ps(out + o * plane + qout[0], v);
            }
        }
        return;
    }
    for (size_t j = 0; j < nj; j++) {
        size_t o = o0 + j;
        float *dst = out + o * plane;
        for (size_t i = 0; i < nvalid; i++)
            dst[qout[i]] = bias ? cb[i * TO + j] + bias[o] : cb[i * TO + j];
    }
}

/* Every panel and K block of one chunk: cb [nq_pad, TO] per panel, then out = cb (+ bias). */
AVX512_TARGET static void chunk_product(const struct gprob *g, const float *xs, const uint32_t *qin,
                                        const size_t *qout, size_t nq, const uint32_t *poff,
                                        float *cb, float *part)
{
    size_t k = g->ci * g->kh * g->kw, np = round_up(g->co, TO) / TO, plane = g->oh * g->ow;
    size_t tiles = (nq + TQ - 1) / TQ;
    for (size_t sp = 0; sp < np; sp++) {
        const float *panel = g->pb + sp * k * TO;
        for (size_t p0 = 0; p0 < k; p0 += KC) {
            size_t kc = k - p0 < KC ? k - p0 : KC;
            for (size_t p1 = p0; p1 < p0 + kc; p1 += KS) {
                size_t ks = p0 + kc - p1 < KS ? p0 + kc - p1 : KS;
                bool resume = p1 > p0, finish = p1 + ks == p0 + kc;
                for (size_t t = 0; t < tiles; t++)
                    tile_kernel(ks, xs, qin + t * TQ, poff + p1, panel + p1 * TO,
                                part + t * TQ * TO, resume, finish, cb + t * TQ * TO, p0 == 0);
            }
        }
        size_t nj = g->co - sp * TO < TO ? g->co - sp * TO : TO;
        for (size_t t = 0; t < tiles; t++) {
            size_t q0 = t * TQ, nv = nq - q0 < TQ ? nq - q0 : TQ;
            tile_store(cb + q0 * TO, qout + q0, nv, sp * TO, nj, plane, g->bias, g->out);
        }
    }
}
#endif

/* Chunk c's samples and output rows. */
static void chunk_span(const struct gprob *g, size_t c, size_t *n0, size_t *ng, size_t *r0,
                       size_t *nr)
{
    size_t per = g->chunks_per_sample_group;
    *n0 = c / per * g->group;
    *ng = g->n - *n0 < g->group ? g->n - *n0 : g->group;
    *r0 = c % per * g->rows;
    *nr = g->oh - *r0 < g->rows ? g->oh - *r0 : g->rows;
}

/* The scratch of output rows [r0, r0 + nr) of sample n: for each input channel, the irows input
 * rows r0*st - pad + ir, each zero-padded to pw floats; rows outside the image (or past what the
 * nr rows read) are zeros. */
static void fill_rows(const struct gprob *g, size_t n, size_t r0, size_t nr, float *xs)
{
    for (size_t c = 0; c < g->ci; c++)
        for (size_t ir = 0; ir < g->irows; ir++) {
            float *d = xs + (c * g->irows + ir) * g->pw;
            size_t ih = r0 * g->st + ir; /* in padded coordinates */
            if (ih < g->pad || ih - g->pad >= g->h || ir >= (nr - 1) * g->st + g->kh) {
                memset(d, 0, g->pw * sizeof(float));
                continue;
            }
            const float *src = g->img + ((n * g->ci + c) * g->h + ih - g->pad) * g->w;
            memset(d, 0, g->pad * sizeof(float));
            memcpy(d + g->pad, src, g->w * sizeof(float));
            memset(d + g->pad + g->w, 0, g->pad * sizeof(float));
        }
}

/* The tap offsets inside a scratch of irows rows: tap p = (c, i, j) at (c*irows + i)*pw + j. */
static void tap_offsets(const struct gprob *g, uint32_t *poff)
{
    for (size_t c = 0, p = 0; c < g->ci; c++)
        for (size_t i = 0; i < g->kh; i++)
            for (size_t j = 0; j < g->kw; j++)
                poff[p++] = (uint32_t)((c * g->irows + i) * g->pw + j);
}

/* n consecutive 64-byte aligned pieces of the given sizes, out of the calling thread's
 * workspace (kernels/cpu/scratch.c); false: no memory. */
static bool carve(size_t n, const size_t *bytes, void **out)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += round_up(bytes[i], 64);
    char *base = ps_cpu_scratch(PS_CPU_SCRATCH_DCONV, total);
    if (!base) return false;
    for (size_t i = 0, off = 0; i < n; off += round_up(bytes[i], 64), i++) out[i] = base + off;
    return true;
}

static void *gwork_main(void *arg)
{
    struct gwork *wk = arg;
    const struct gprob *g = wk->g;
    size_t k = g->ci * g->kh * g->kw, cs = g->ci * g->irows * g->pw;
    size_t qmax = g->group * g->rows * g->ow, qpad = round_up(qmax, TQ);
    void *pc[6];
    const size_t sz[6] = {g->group * cs * sizeof(float), qpad * TO * sizeof(float),
                          qpad * TO * sizeof(float),     qpad * sizeof(uint32_t),
                          k * sizeof(uint32_t),          qmax * sizeof(size_t)};
    if (!carve(6, sz, pc)) {
        wk->rc = -ENOMEM;
        return NULL;
    }
    float *xs = pc[0], *cb = pc[1], *part = pc[2];
    uint32_t *qin = pc[3], *poff = pc[4];
    size_t *qout = pc[5];
    (void)cb, (void)part; /* unused without the AVX-512 product */
    tap_offsets(g, poff);
    for (size_t ch = wk->lo; ch < wk->hi; ch++) {
        size_t n0, ng, r0, nr;
        chunk_span(g, ch, &n0, &ng, &r0, &nr);
        for (size_t sm = 0; sm < ng; sm++) fill_rows(g, n0 + sm, r0, nr, xs + sm * cs);
        size_t nq = 0;
        for (size_t s = 0; s < ng; s++)
            for (size_t r = 0; r < nr; r++)
                for (size_t ow = 0; ow < g->ow; ow++, nq++) {
                    qin[nq] = (uint32_t)(s * cs + r * g->st * g->pw + ow * g->st);
                    qout[nq] = (n0 + s) * g->co * g->oh * g->ow + (r0 + r) * g->ow + ow;
                }
        for (size_t q = nq; q < round_up(nq, TQ); q++)
            qin[q] = qin[nq - 1]; /* unused rows */
#if HAVE_DCONV
        chunk_product(g, xs, qin, qout, nq, poff, cb, part);
#endif
    }
    return NULL;
}

static int gather_product(struct gprob *g)
{
    size_t plane = g->oh * g->ow;
    if (plane >= CHUNK_Q) {
        size_t nch = (plane + CHUNK_Q - 1) / CHUNK_Q;
        g->rows = (g->oh + nch - 1) / nch;
        g->group = 1;
    } else {
        g->rows = g->oh;
        g->group = CHUNK_Q / plane;
        if (g->group > g->n) g->group = g->n;
        if (g->group < 1) g->group = 1;
    }
    g->irows = (g->rows - 1) * g->st + g->kh;
    g->pw = g->w + 2 * g->pad;
    g->chunks_per_sample_group = (g->oh + g->rows - 1) / g->rows;
    g->n_chunks = (g->n + g->group - 1) / g->group * g->chunks_per_sample_group;
    /* offsets are 32-bit: a chunk's scratch must stay under 2^32 floats */
    if (g->group * g->ci * g->irows * g->pw >= ((size_t)1 << 32)) return -EOVERFLOW;

    size_t work = g->n * plane * g->co * g->ci * g->kh * g->kw;
    return split_run(gwork_main, (struct gwork){.g = g}, g->n_chunks, work);
}

int ps_cpu_dconv_forward(const struct ps_conv2d_shape *s, const float *x, const float *w,
                         const float *b, float *y, struct ps_cpu_convcache *cache)
{
    float *own = NULL;
    const float *pb = packed(s, w, false, cache, &own);
    if (!pb) return -ENOMEM;
    struct gprob g = {.n = s->n,
                      .ci = s->c_in,
                      .h = s->h,
                      .w = s->w,
                      .co = s->c_out,
                      .kh = s->kh,
                      .kw = s->kw,
                      .st = s->stride,
                      .pad = s->padding,
                      .oh = ps_cpu_conv2d_out_h(s),
                      .ow = ps_cpu_conv2d_out_w(s),
                      .img = x,
                      .pb = pb,
                      .bias = b,
                      .out = y};
    int rc = gather_product(&g);
    free(own);
    return rc;
}

int ps_cpu_dconv_dx(const struct ps_conv2d_shape *s, const float *w, const float *dy, float *dx,
                    struct ps_cpu_convcache *cache)
{
    float *own = NULL;
    const float *pb = packed(s, w, true, cache, &own);
    if (!pb) return -ENOMEM;
    /* the transposed convolution: input dy [n, c_out, oh, ow], output [n, c_in, h, w] */
    struct gprob g = {.n = s->n,
                      .ci = s->c_out,
                      .h = ps_cpu_conv2d_out_h(s),
                      .w = ps_cpu_conv2d_out_w(s),
                      .co = s->c_in,
                      .kh = s->kh,
                      .kw = s->kw,
                      .st = 1,
                      .pad = s->kh - 1 - s->padding,
                      .oh = s->h,
                      .ow = s->w,
                      .img = dy,
                      .pb = pb,
                      .bias = NULL,
                      .out = dx};
    int rc = gather_product(&g);
    free(own);
    return rc;
}

/* ---- the weight gradient ------------------------------------------------------------------
 *
 * dw[o, p] += sum_q dy[n, o, q] * img(n, q, p), the same gathered operand with the roles
 * turned: a tile is 8 taps (broadcasts, xs[qin[q] + poff[p_i]]) x 32 output channels (dy
 * transposed into dyt[q, 32] per block of positions), and the sum runs over positions. conv.c's
 * sgemm does, per sample, K blocks of KC = 256 positions from position 0: dw = dw + block, each
 * block a chain of fused multiply-adds from +0 in position order. So do chunks here: they start
 * at multiples of KC inside a sample and the tile is added to dw after each block. */

enum { WCHUNK = 4 * KC };

#if HAVE_DCONV

/* acc[i][0..31] = sum over the block's nq positions of img(q, tap i) * dyt[q][0..31], a chain of
 * fused multiply-adds from +0 in position order; then tile[i] = tile[i] + acc[i]: the tile holds
 * its piece of dw (transposed) while the blocks are added one by one, as the sgemm's beta = 1
 * write-back c + 1 * acc does per block. */
AVX512_TARGET static void wtile_kernel(size_t nq, const float *xs, const uint32_t *qin,
                                       const uint32_t *taps, const float *dyt, float *tile)
{
    __m512 acc[TQ][2];
    size_t t0 = taps[0], t1 = taps[1], t2 = taps[2], t3 = taps[3];
    size_t t4 = taps[4], t5 = taps[5], t6 = taps[6], t7 = taps[7];
    _Pragma("GCC unroll 8") for (int i = 0; i < TQ; i++) acc[i][0] = acc[i][1] =
        _mm512_setzero_ps();
    for (size_t q = 0; q < nq; q++) {
        __m512 b0 = _mm512_load_ps(dyt + q * TO), b1 = _mm512_load_ps(dyt + q * TO + 16);
        const float *xp = xs + qin[q]; /* position q's window: xp[poff[tap]] */
#define ROW(i, ti)                                                                                 \
    do {                                                                                           \
        __m512 av = _mm512_set1_ps(xp[ti]);                                                        \
        acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);                                            \
        acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);                                            \
    } while (0)
        ROW(0, t0);
        ROW(1, t1);
        ROW(2, t2);
        ROW(3, t3);
        ROW(4, t4);
        ROW(5, t5);
        ROW(6, t6);
        ROW(7, t7);
#undef ROW
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < TQ; i++)
    {
        float *t = tile + i * TO;
        _mm512_store_ps(t, _mm512_add_ps(_mm512_load_ps(t), acc[i][0]));
        _mm512_store_ps(t + 16, _mm512_add_ps(_mm512_load_ps(t + 16), acc[i][1]));
    }
}

/* Between a tap tile's piece of dw (channels o0.., taps p0..) and the tile layout
 * tile[i * TO + j] = dw[o0 + j, p0 + i]: in (to_dw false) or out (true); 8 x 8 transposes when
 * the tile has all 8 taps, one element at a time otherwise. Channels past nj are zero in. */
AVX512_TARGET static void wtile_move(float *tile, size_t nt, size_t nj, size_t o0, size_t p0,
                                     size_t k, float *dw, bool to_dw)
{
    if (!to_dw) memset(tile, 0, TQ * TO * sizeof(float));
    if (nt == TQ) {
        for (size_t jb = 0; jb < nj; jb += 8) {
            __m256 col[8];
            size_t nb = nj - jb < 8 ? nj - jb : 8;
            if (to_dw) {
                transpose8(tile + jb, TO, col);
                for (size_t j = 0; j < nb; j++)
                    _mm256_storeu_ps(dw + (o0 + jb + j) * k + p0, col[j]);
            } else if (nb == 8) {
                transpose8(dw + (o0 + jb) * k + p0, k, col);
                for (size_t i = 0; i < TQ; i++)
                    _mm256_store_ps(tile + i * TO + jb, col[i]);
            } else {
                for (size_t j = 0; j < nb; j++)
                    for (size_t i = 0; i < TQ; i++)
                        tile[i * TO + jb + j] = dw[(o0 + jb + j) * k + p0 + i];
            }
        }
        return;
    }
    for (size_t j = 0; j < nj; j++)
        for (size_t i = 0; i < nt; i++) {
            float *d = dw + (o0 + j) * k + p0 + i;
            if (to_dw)
                *d = tile[i * TO + j];
            else
                tile[i * TO + j] = *d;
        }
}
#endif

static void *wwork_main(void *arg)
{
    struct gwork *wk = arg;
    const struct gprob *g = wk->g;
    size_t k = g->ci * g->kh * g->kw, plane = g->oh * g->ow, np = round_up(g->co, TO) / TO;
    size_t cs = g->ci * g->irows * g->pw, G = g->group;
    /* a chunk: G whole samples, or WCHUNK positions of one sample; its blocks: KC positions of
     * one sample from a multiple of KC */
    size_t span = G > 1 || plane <= WCHUNK ? plane : WCHUNK;
    size_t nblk_max = G * ((span + KC - 1) / KC);
    void *pc[6];
    const size_t sz[6] = {G * cs * sizeof(float),          nblk_max * KC * TO * sizeof(float),
                          TQ * TO * sizeof(float),          G * span * sizeof(uint32_t),
                          round_up(k, TQ) * sizeof(uint32_t), nblk_max * 3 * sizeof(size_t)};
    if (!carve(6, sz, pc)) {
        wk->rc = -ENOMEM;
        return NULL;
    }
    float *xs = pc[0], *dyt = pc[1], *tile = pc[2];
    (void)tile; /* unused without the AVX-512 product */
    uint32_t *qin = pc[3], *poff = pc[4];
    size_t *blk = pc[5]; /* per block: sample, first position, count */
    tap_offsets(g, poff);
    for (size_t p = k; p < round_up(k, TQ); p++)
        poff[p] = poff[k - 1]; /* unused taps of the last tile */
    for (size_t n0 = 0; n0 < g->n; n0 += G)
        for (size_t qa = 0; qa < plane; qa += span) {
            size_t ng = g->n - n0 < G ? g->n - n0 : G;
            size_t qb = plane - qa < span ? plane : qa + span;
            size_t r0 = qa / g->ow, nr = (qb - 1) / g->ow - r0 + 1, nq = 0, nb = 0;
            for (size_t sm = 0; sm < ng; sm++) {
                fill_rows(g, n0 + sm, r0, nr, xs + sm * cs);
                for (size_t b0 = qa; b0 < qb; b0 += KC) {
                    size_t cnt = qb - b0 < KC ? qb - b0 : KC;
                    blk[3 * nb] = n0 + sm, blk[3 * nb + 1] = nq, blk[3 * nb + 2] = b0;
                    nb++;
                    for (size_t q = b0; q < b0 + cnt; q++)
                        qin[nq++] = (uint32_t)(sm * cs + (q / g->ow - r0) * g->st * g->pw +
                                               q % g->ow * g->st);
                }
            }
            for (size_t sp = 0; sp < np; sp++) {
                size_t o0 = sp * TO, nj = g->co - o0 < TO ? g->co - o0 : TO;
                for (size_t b = 0; b < nb; b++) {
                    size_t n = blk[3 * b], b0 = blk[3 * b + 2];
                    size_t cnt = qb - b0 < KC ? qb - b0 : KC;
                    float *d = dyt + b * KC * TO;
                    for (size_t j = 0; j < TO; j++) {
                        const float *src = wk->dy + (n * g->co + o0 + j) * plane + b0;
                        for (size_t q = 0; q < cnt; q++)
                            d[q * TO + j] = j < nj ? src[q] : 0.0f;
                    }
                }
#if HAVE_DCONV
                /* a tile's blocks one after the other: its 8 x 32 piece of dw stays in L1 */
                for (size_t t = wk->lo; t < wk->hi; t++) {
                    size_t p0 = t * TQ, nt = k - p0 < TQ ? k - p0 : TQ;
                    wtile_move(tile, nt, nj, o0, p0, k, wk->dw, false);
                    for (size_t b = 0; b < nb; b++) {
                        size_t b0 = blk[3 * b + 2], cnt = qb - b0 < KC ? qb - b0 : KC;
                        wtile_kernel(cnt, xs, qin + blk[3 * b + 1], poff + p0, dyt + b * KC * TO,
                                     tile);
                    }
                    wtile_move(tile, nt, nj, o0, p0, k, wk->dw, true);
                }
#endif
            }
        }
    return NULL;
}

int ps_cpu_dconv_dw(const struct ps_conv2d_shape *s, const float *x, const float *dy, float *dw)
{
    struct gprob g = {.n = s->n, .ci = s->c_in, .h = s->h, .w = s->w, .co = s->c_out,
                      .kh = s->kh, .kw = s->kw, .st = s->stride, .pad = s->padding,
                      .oh = ps_cpu_conv2d_out_h(s), .ow = ps_cpu_conv2d_out_w(s), .img = x};
    /* whole samples, as many as fit WCHUNK positions; or chunks of WCHUNK positions of one
     * sample, spanning at most this many output rows */
    size_t plane = g.oh * g.ow, rows = (WCHUNK + g.ow - 2) / g.ow + 1;
    g.group = plane <= WCHUNK ? WCHUNK / plane : 1;
    if (g.group > g.n) g.group = g.n;
    if (plane <= WCHUNK || rows > g.oh) rows = g.oh;
    g.irows = (rows - 1) * g.st + g.kh;
    g.pw = g.w + 2 * g.pad;
    if (g.group * g.ci * g.irows * g.pw >= ((size_t)1 << 32)) return -EOVERFLOW;
    size_t k = g.ci * g.kh * g.kw, tiles = (k + TQ - 1) / TQ;
    size_t work = g.n * g.oh * g.ow * g.co * k;
    return split_run(wwork_main, (struct gwork){.g = &g, .dy = dy, .dw = dw}, tiles, work);
}
