/* The fused tile sweep, written once for a vector of VL floats and included by
 * one unit per instruction set (_sweep_avx512.c, _sweep_avx2.c: AVX2+FMA+F16C, and
 * _sweep_generic.c: plain C), after _fused.h.
 *
 * Before each inclusion: VL (lanes per vector: 16, 8 or 4; 16 and 8 use the AVX-512
 * and F16C conversions of float16), ACC (vector accumulators the loops may keep in
 * registers), ROWS_PASS (rows per pass over what is in L1; below), AGAIN_FPB (groups
 * with fewer flops per byte of K and V than this ask for each line twice; see below),
 * TWICE_FPB (but not those with fewer than this),
 * NOASK_FPB (groups with fewer than this ask for none, where `asking` is ASK_NONE, and the
 * float32 groups with fewer than half of it, where it is ASK_NONE32; below),
 * JB_FEW (rows of V per step of P @ V for groups of 4 rows of float32; JB for the rest)
 * and SUFFIX (appended to the function names).
 *
 * One call sweeps tokens [lo, hi) of one KV head for all R query rows, in tiles of
 * `tile` tokens. A tile is swept in blocks of SUB tokens; per block and per group of
 * RB rows (8, 4, 2 or 1):
 *   scores   RB x SUB, every K value loaded from memory once and multiplied into
 *            RS x UB accumulators (UB vectors of tokens at once), RS = RB rows or, in
 *            groups of more than ROWS_PASS rows, passes of ROWS_PASS over the same
 *            32 dimensions of K, from L1;
 *   softmax  the block's max per row; where it raises the tile's max, the tile's
 *            partial is rescaled; the weights exp(s - m) overwrite the scores;
 *   P @ V    RS x W accumulators over the block's V rows, JB rows (in L1) at a time,
 *            in passes of RS rows likewise. On AVX2, 4 rows of float32 read V in
 *            columns of 64 bytes; 16 rows at a time in place of 32 took 3% less time
 *            on a Zen 4 (64K tokens, G = 4, interleaved, best of five processes; 12%
 *            on a Zen 5 in a scratch build), and cost 2-7% at 4 rows of float16 and at
 *            8 rows, on AVX2 and AVX-512, and 6% at 1 row of float32 on the Zen 4.
 * The passes are for AVX2's 16 registers: 8 rows at one vector each need one broadcast
 * load per FMA, 4 rows at two vectors each 3 loads per 4 FMAs. Interleaved with one pass
 * of 8 (EPYC, 64K tokens, G = 8), two passes of 4 took 5% less time (29.3 and 30.8 ms
 * float32, 27.4 and 28.2 float16); on AVX-512 passes of 4 were slower.
 * A tile's partial (its own m, l and O, summed from zero) is merged into the running
 * one at the tile's end: summing each tile from zero keeps float32 error near rounding
 * at 256K tokens.
 *
 * The memory never waits for the flops: while the first row group works on block n,
 * it asks for K and V of block n + AHEAD, a few cache lines per step of its loops, so
 * that the lines of the whole slice are requested at the pace they are used. They are
 * asked for in address order (ask), not in the order the loops read them: P @ V reads
 * V down columns of JB rows, and a read of V in that order with prefetches in that
 * order took twice as long as with prefetches in address order (19 and 10 ms, EPYC).
 * Where the sweep waits on memory, each line is asked for twice: AHEAD blocks ahead and
 * again one block nearer. A core may drop a prefetch it has no room for, and the
 * second request covers the dropped ones (the rest hit in L2). On the EPYC this cut
 * the memory-bound sweeps (G = 1 and 4) by 5-13%. Where the flops bind, it costs a
 * load slot per line: 5% at 8 rows on AVX2 (4 flops per byte of float32 K and V),
 * 3-5% at 4 rows of float16 there (4 too), 2-3% at 8 rows of float16 on the Xeon's
 * AVX-512 (8), and on a Sapphire Rapids Xeon's AVX-512 asking once took 0.90-0.92 of the
 * time of asking twice at float32 G = 8 and 0.92-0.97 at float16 G = 4 (4 flops per byte;
 * four processes, best of 7), where a Zen 4 saw no difference (0.98-1.01). A group of RB
 * rows does 2 RB / es flops per byte (es bytes an element); below AGAIN_FPB it asks
 * twice, where `asking` is not ASK_ONCE. On a Zen 4 (2026-12-07, bench paths, three
 * processes, best of 9) asking once took 1.11-1.18 of the time of asking twice at
 * float32 G = 2 and 4 and 1.09-1.19 at float16 G = 1 and 2, and 0.97-0.98 at float32
 * G = 1 on AVX-512; the AVX2 loops pinned lost likewise: AMD's cores ask twice (_fused.c).
 * But on AVX-512 float32 G = 1 (below TWICE_FPB, 1 there: half a flop per byte) asks
 * once where it asks at all: in bench local, alternated, it swept in 0.93 of the time
 * asking once on the Zen 4 (four runs each), and on a Sapphire Rapids asking once took
 * 0.96 of the time of asking twice (bench paths, best of 7).
 * Below NOASK_FPB it asks for nothing under ASK_NONE: on a Sapphire Rapids Xeon the
 * core's own prefetcher then streams K and V faster than the asking
 * does, while the loops read several K blocks at once or whole V rows. Without asking,
 * AVX-512 swept float32 G = 1, 2 and 4 in 0.76-0.79, 0.77-0.79 and 0.88-0.91 of the
 * time, float16 G = 1 and 2 in 0.87-0.90 and 0.91-0.92; float16 G = 4 0.99-1.01 and
 * G = 8 1.35-1.46, float32 G = 8 1.22-1.30 (three processes, 64K tokens). AVX2 gained
 * at float32 G = 1 and 2 and float16 G = 1 (0.80, 0.92, 0.88) and lost at float32
 * G = 4 (1.32) and float16 G = 2 (1.17), whose V goes in columns of 64 bytes. On a
 * Zen 4 asking for nothing took 1.06-1.33 of the time at float32 G = 1. On an Emerald
 * Rapids Xeon only float32's lightest groups gain (ASK_NONE32: below NOASK_FPB / 2, on
 * AVX-512 G = 1 and 2): there asking twice took 1.04-1.14 and 1.15 of the time of asking
 * for nothing at float32 G = 1 and 2, but 0.89-0.93 at float32 G = 4, 0.85-0.86 at
 * float16 G = 1 and 0.80-0.81 at float16 G = 2 (AVX-512, three processes, best of 7).
 */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define NAME(x) CAT(x, SUFFIX)
#define FPB(RB, HALF) (2 * (RB) / ((HALF) ? 2 : 4))   /* flops per byte of K and V */

/* How often a group of rb rows asks for each line of K and V: 0, 1 or 2 (see above). */
GQA_HIDDEN int NAME(asks)(int rb, int half) {
    const int fpb = FPB(rb, half);
    const int none_below = asking == ASK_NONE ? NOASK_FPB
                         : asking == ASK_NONE32 && !half ? NOASK_FPB / 2 : 0;
    return fpb < none_below ? 0
         : asking != ASK_ONCE && fpb >= TWICE_FPB && fpb < AGAIN_FPB ? 2 : 1;
}

typedef float NAME(vf) __attribute__((vector_size(VL * 4)));
typedef int32_t NAME(vi) __attribute__((vector_size(VL * 4)));
#define VF NAME(vf)
#define VI NAME(vi)

static inline __attribute__((always_inline)) VF NAME(ld32)(const float *p) {
    VF v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) VF NAME(ld16)(const uint16_t *p) {
#if VL == 16
    return (VF)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif VL == 8
    return (VF)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    VF out;  /* portable path: no vector conversion instruction assumed */
    for (int u = 0; u < VL; u++) out[u] = (float)((const _Float16 *)p)[u];
    return out;
#endif
}

#define LOADV(half, p, i) ((half) ? NAME(ld16)((const uint16_t *)(p) + (i)) \
                                  : NAME(ld32)((const float *)(p) + (i)))

static inline __attribute__((always_inline)) VF NAME(sel)(VI mask, VF a, VF b) {
    return (VF)(((VI)a & mask) | ((VI)b & ~mask));
}

/* The stream of prefetches: a loop that has read *pos bytes of a region, and reads
 * `step` more now, asks for the lines at [*pos, *pos + step) of `at` (the region,
 * so many bytes on). The lines are asked for in the region's order, whatever order
 * the loop reads them in: the memory and its prefetchers see one sequential stream.
 * With TW (a constant in each call: a test per line costs the small loops of G = 1 a
 * fifth of their time) each line is asked for a second time `again` bytes nearer: a
 * core drops prefetches it has no room for, and a line dropped far ahead is asked for
 * once more before it is read (see the file's comment). */
static inline __attribute__((always_inline)) void NAME(ask)(const char *at, size_t *pos,
                                                             const size_t step, const int TW,
                                                             const size_t again) {
    if (!at) return;
#define ASK_LINE(p) do { PREFETCH(p); if (TW) PREFETCH((p) - again); } while (0)
    if (step % 64 == 0)
        for (size_t n = 0; n < step / 64; n++) ASK_LINE(at + *pos + 64 * n);
    else if (64 % step == 0) {
        if (!(*pos & 63)) ASK_LINE(at + *pos);
    } else
        for (size_t x = (*pos + 63) & ~(size_t)63; x < *pos + step; x += 64) ASK_LINE(at + x);
#undef ASK_LINE
    *pos += step;
}

/* exp(x) for x <= 0 (or -inf, or NaN): Cephes' expf, vectorised. 0 below -87.3 (so
 * -inf gives exactly 0), NaN stays NaN; about 1 ulp elsewhere. */
static inline __attribute__((always_inline)) VF NAME(vexp)(VF x) {
    const VF zero = {0};
    const VF lo = zero + -87.0f;
    VI tiny = x < lo;
    VF xc = NAME(sel)(tiny, lo, x);
    VF t = xc * 1.44269504088896341f + 12582912.0f;   /* round to nearest via 1.5*2^23 */
    VI n = (VI)t - 0x4B400000;
    VF nf = t - 12582912.0f;
    VF r = xc - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    VF p = r * 1.9875691500E-4f + 1.3981999507E-3f;
    p = p * r + 8.3334519073E-3f;
    p = p * r + 4.1665795894E-2f;
    p = p * r + 1.6666665459E-1f;
    p = p * r + 5.0000001201E-1f;
    p = p * (r * r) + r + 1.0f;
    VF scale = (VF)((n + 127) << 23);
    return NAME(sel)(tiny, zero, p * scale);   /* NaN is not tiny: it stays NaN */
}

/* Scores of RB rows against UB vectors of tokens (vector u at element offset kofs[u]
 * of K, dimension i at + 16 * i), into sc (row r at r * SUB, vector u at u * VL).
 * The sum over d goes in chunks of DCH dimensions, each summed from zero and then
 * added to the total: with |scores| large (1e5, say) a single running sum over d
 * rounds d times at the total's magnitude, several times what BLAS does. The rows go
 * in passes of RS over each chunk: the first pass reads the chunk of K from memory
 * (and asks for the lines ahead), the others from L1. */
static inline __attribute__((always_inline)) void NAME(scores)(
        const int RB, const int RS, const int UB, const int half, const int TW, const float *qt,
        const void *k, const Py_ssize_t d, const size_t *kofs, float *sc, const char *ask,
        size_t *asked, const size_t again) {
    const VF zero = {0};
    for (Py_ssize_t i0 = 0; i0 < d; i0 += DCH) {
        const Py_ssize_t i1 = i0 + DCH < d ? i0 + DCH : d;
        for (int r0 = 0; r0 < RB; r0 += RS) {
            VF acc[8][ACC];
            for (int r = 0; r < RS; r++)
                for (int u = 0; u < UB; u++) acc[r][u] = zero;
            for (Py_ssize_t i = i0; i < i1; i++) {
                NAME(ask)(r0 ? NULL : ask, asked, (size_t)UB * VL * (half ? 2 : 4), TW, again);
                VF kv[ACC];
                for (int u = 0; u < UB; u++) kv[u] = LOADV(half, k, kofs[u] + (size_t)i * 16);
                for (int r = 0; r < RS; r++) {
                    const float qv = qt[i * RB + r0 + r];
                    for (int u = 0; u < UB; u++) acc[r][u] += qv * kv[u];
                }
            }
            for (int r = 0; r < RS; r++)
                for (int u = 0; u < UB; u++) {
                    float *at = sc + (r0 + r) * SUB + u * VL;
                    VF s = acc[r][u];
                    if (i0) s += NAME(ld32)(at);
                    memcpy(at, &s, sizeof s);
                }
        }
    }
}

/* P @ V of RB rows over V rows [j0, j1), columns [c0, c1) (c1 - c0 a multiple of W * VL):
 * RS x W accumulators per chunk of W vectors of columns, over the rows of V, in passes
 * of RS rows (the first from memory, asking for the lines ahead; the others from L1).
 * sc holds the rows' weights (row r at r * SUB, token j at j - base). */
static inline __attribute__((always_inline)) void NAME(pv)(
        const int RB, const int RS, const int W, const int half, const int TW, const float *sc,
        const Py_ssize_t base, const void *v, const Py_ssize_t d, const Py_ssize_t j0,
        const Py_ssize_t j1, const Py_ssize_t c0, const Py_ssize_t c1, float *Ot,
        const char *askv, size_t *askedv, const size_t again) {
    const size_t es = half ? 2 : 4;
    for (Py_ssize_t c = c0; c < c1; c += (Py_ssize_t)W * VL)
        for (int r0 = 0; r0 < RB; r0 += RS) {
            float *Or = Ot + r0 * d + c;
            const float *pr = sc + r0 * SUB - base;
            VF acc[8][8];
            for (int r = 0; r < RS; r++)
                for (int w = 0; w < W; w++) acc[r][w] = NAME(ld32)(Or + r * d + w * VL);
            for (Py_ssize_t j = j0; j < j1; j++) {
                NAME(ask)(r0 ? NULL : askv, askedv, (size_t)W * VL * es, TW, again);
                VF vv[8];
                for (int w = 0; w < W; w++)
                    vv[w] = LOADV(half, v, (size_t)j * (size_t)d + (size_t)c + (size_t)w * VL);
                for (int r = 0; r < RS; r++) {
                    const float p = pr[r * SUB + j];
                    for (int w = 0; w < W; w++) acc[r][w] += p * vv[w];
                }
            }
            for (int r = 0; r < RS; r++)
                for (int w = 0; w < W; w++) memcpy(Or + r * d + w * VL, &acc[r][w], sizeof(VF));
        }
}

/* One block, tokens [s0, s1) of the slice (s1 - 16 * (s0 / 16) <= SUB), for RB rows in
 * passes of RS (UB vectors of tokens at a time in the scores, W of O's in P @ V):
 * qt the rows transposed (d x RB, pre-scaled), hi[r] row r's end (causal mask and s1),
 * mt, lt, Ot the tile's partial of these rows, sc the block's scratch. With ahead > 0
 * (the first row group), as many lines of K and V as it reads are asked for `ahead`
 * bytes on, in order: the lines of the block two ahead; with TW, once more
 * `again` bytes nearer. */
static inline __attribute__((always_inline)) void NAME(block_rows)(
        const int RB, const int RS, const int UB, const int W, const int half, const int TW,
        const float *qt, const void *k, const void *v, const Py_ssize_t d, const Py_ssize_t s0,
        const Py_ssize_t s1, const Py_ssize_t *hi, float *mt, float *lt, float *Ot,
        float *sc, const size_t ahead, const size_t again) {
    const Py_ssize_t b0 = s0 / 16, base = 16 * b0;
    const size_t es = half ? 2 : 4;
    const char *askk = ahead ? (const char *)k + (size_t)base * (size_t)d * es + ahead : NULL;
    const char *askv = ahead ? (const char *)v + (size_t)s0 * (size_t)d * es + ahead : NULL;
    size_t askedk = 0, askedv = 0;
    const int nv = (int)(((s1 + 15) / 16 - b0) * 16 / VL);   /* vectors of tokens */
    const VF zero = {0}, ninf = zero + -INFINITY;
    /* scores: UB vectors at a time, then one at a time for the rest */
    const int whole = nv / UB * UB;
    size_t kofs[ACC];
    for (int u0 = 0; u0 < nv; u0 += u0 < whole ? UB : 1) {
        const int n = u0 < whole ? UB : 1;
        for (int u = 0; u < n; u++) {
            const Py_ssize_t tok = base + (Py_ssize_t)(u0 + u) * VL;
            kofs[u] = (size_t)(tok / 16) * (size_t)d * 16 + (size_t)(tok % 16);
        }
        if (n == UB) NAME(scores)(RB, RS, UB, half, TW, qt, k, d, kofs, sc + u0 * VL, askk, &askedk, again);
        else NAME(scores)(RB, RS, 1, half, TW, qt, k, d, kofs, sc + u0 * VL, askk, &askedk, again);
    }
    /* softmax: mask to [s0, hi[r]) (unless the block lies inside it), the block's max,
     * the weights and their sum. A NaN score makes the row's sum NaN, and its max too. */
    VI lane;
    for (int u = 0; u < VL; u++) lane[u] = u;
    for (int r = 0; r < RB; r++) {
        float *row = sc + r * SUB;
        VF vmax = ninf;
        if (base == s0 && base + nv * VL <= hi[r])
            for (int u = 0; u < nv; u++) {
                const VF s = NAME(ld32)(row + u * VL);
                vmax = NAME(sel)(s > vmax, s, vmax);
            }
        else
            for (int u = 0; u < nv; u++) {
                const VI tok = lane + (int32_t)(base + u * VL);
                const VI ok = (tok >= (int32_t)s0) & (tok < (int32_t)hi[r]);
                const VF s = NAME(sel)(ok, NAME(ld32)(row + u * VL), ninf);
                memcpy(row + u * VL, &s, sizeof s);
                vmax = NAME(sel)(s > vmax, s, vmax);
            }
        float bmax = -INFINITY;
        for (int u = 0; u < VL; u++) bmax = vmax[u] > bmax ? vmax[u] : bmax;
        const float m_new = mt[r] != mt[r] ? NAN : mt[r] > bmax ? mt[r] : bmax;
        if (!(m_new == mt[r])) {        /* raised, or NaN: rescale the tile so far */
            if (!(isinf(mt[r]) && mt[r] < 0)) {
                const float alpha = expf(mt[r] - m_new);
                lt[r] *= alpha;
                for (Py_ssize_t c = 0; c < d; c++) Ot[r * d + c] *= alpha;
            }
            mt[r] = m_new;
        }
        const float shift = isinf(mt[r]) && mt[r] < 0 ? 0.0f : mt[r];
        VF sum = zero;
        for (int u = 0; u < nv; u++) {
            const VF p = NAME(vexp)(NAME(ld32)(row + u * VL) - shift);
            memcpy(row + u * VL, &p, sizeof p);
            sum += p;
        }
        float tsum = 0.0f;
        for (int u = 0; u < VL; u++) tsum += sum[u];
        lt[r] += tsum;
        if (lt[r] != lt[r]) mt[r] = NAN;
    }
    /* P @ V over the block's tokens, jb rows of V at a time: the columns in chunks of W
     * vectors, then one vector at a time where fewer than W are left (d = 64 or 80 with
     * W = 8 on AVX-512), then one column at a time (d not a multiple of VL) */
    const Py_ssize_t wide = d / (W * VL) * (W * VL), vecs = d / VL * VL;
    const Py_ssize_t jb = !half && RB == 4 ? JB_FEW : JB;
    for (Py_ssize_t j0 = s0; j0 < s1; j0 += jb) {
        const Py_ssize_t j1 = j0 + jb < s1 ? j0 + jb : s1;
        NAME(pv)(RB, RS, W, half, TW, sc, base, v, d, j0, j1, 0, wide, Ot, askv, &askedv, again);
        if (W > 1 && wide < vecs)
            NAME(pv)(RB, RS, 1, half, TW, sc, base, v, d, j0, j1, wide, vecs, Ot, askv, &askedv,
                     again);
        for (Py_ssize_t c = vecs; c < d; c++) {
            for (Py_ssize_t j = j0; j < j1; j++) {
                const size_t at = (size_t)j * (size_t)d + (size_t)c;
                const float x = half ? (float)((const _Float16 *)v)[at] : ((const float *)v)[at];
                for (int r = 0; r < RB; r++) Ot[r * d + c] += sc[r * SUB + (j - base)] * x;
            }
        }
    }
}

/* Tokens [lo, hi) of nh KV heads, all R rows of each, in tiles of `tile` tokens: head x
 * has its rows at q + x R d, its K and V kstride and vstride bytes on from head 0's, and
 * its partial at m + x R, l + x R, O + x R d. The heads go block by block in turn, each
 * with its own tile partial: the same arithmetic per head as one at a time, bit for bit,
 * but the memory sees 2 nh streams (see sweep's `heads` in _fused.c). Scratch:
 * SCRATCH_FLOATS(R, d, nh) floats, 64-byte aligned. With wrap > 0 (timing only; lo = 0
 * and wrap a multiple of SUB) a block at s0 reads K and V at s0 - (s0 - s0 % wrap): the
 * first wrap + SUB tokens over and over, with no prefetch, so they stay in cache. */
GQA_HIDDEN void NAME(sweep_head)(const float *q, const void *k, const void *v, int half,
                             Py_ssize_t R, Py_ssize_t d, Py_ssize_t lo, Py_ssize_t hi,
                             Py_ssize_t tile, const Py_ssize_t *row_hi, float *m, float *l,
                             float *O, float *scratch, Py_ssize_t wrap, int nh,
                             size_t kstride, size_t vstride) {
    /* a block's scores (shared), then per head: the rows transposed, the tile's m, l, O */
    float *sc = scratch;
    const Py_ssize_t per = 2 * R * d + 2 * R;
#define QT(x) (scratch + 8 * SUB + (x) * per)
#define MT(x) (QT(x) + R * d)
#define LT(x) (MT(x) + R)
#define OT(x) (LT(x) + R)
    /* the rows in groups of 8, 4, 2, 1, each transposed (d x rb) for the scores */
    for (int x = 0; x < nh; x++)
        for (Py_ssize_t r0 = 0, rb; r0 < R; r0 += rb) {
            rb = GROUP(R - r0);
            for (Py_ssize_t i = 0; i < d; i++)
                for (Py_ssize_t r = 0; r < rb; r++)
                    QT(x)[r0 * d + i * rb + r] = q[x * R * d + (r0 + r) * d + i];
        }
    const size_t es = half ? 2 : 4;
    /* bytes, K and V alike (none where wrap keeps them in cache); again: one block nearer */
    const size_t ahead = wrap ? 0 : (size_t)AHEAD * SUB * (size_t)d * es;
    const size_t again = (size_t)SUB * (size_t)d * es;
    for (Py_ssize_t t0 = lo; t0 < hi; t0 += tile) {
        const Py_ssize_t t1 = t0 + tile < hi ? t0 + tile : hi;
        for (int x = 0; x < nh; x++) {
            for (Py_ssize_t r = 0; r < R; r++) {
                MT(x)[r] = -INFINITY;
                LT(x)[r] = 0.0f;
            }
            memset(OT(x), 0, sizeof(float) * (size_t)R * (size_t)d);
        }
        for (Py_ssize_t s0 = t0, s1; s0 < t1; s0 = s1) {
            s1 = s0 / 16 * 16 + SUB < t1 ? s0 / 16 * 16 + SUB : t1;
            const size_t back = wrap ? (size_t)(s0 - s0 % wrap) * (size_t)d * es : 0;
            for (int x = 0; x < nh; x++) {
                const void *kb = (const char *)k + x * kstride - back;
                const void *vb = (const char *)v + x * vstride - back;
                for (Py_ssize_t r0 = 0, rb; r0 < R; r0 += rb) {
                    rb = GROUP(R - r0);
                    Py_ssize_t cut[8];
                    for (Py_ssize_t r = 0; r < rb; r++) {
                        const Py_ssize_t h = row_hi ? row_hi[r0 + r] : s1;
                        cut[r] = h < s1 ? h : s1;
                    }
                    const float *qr = QT(x) + r0 * d;
                    float *mr = MT(x) + r0, *lr = LT(x) + r0, *Or = OT(x) + r0 * d;
                    /* RB, UB, W and the element type are compile-time constants in each call */
#define RSS(RB) (RB > ROWS_PASS ? ROWS_PASS : RB)
#define UBS(RB) (RSS(RB) == 8 ? 1 : (ACC / RSS(RB)) < SUB / VL ? (ACC / RSS(RB)) : SUB / VL)
#define WS(RB) ((ACC / RSS(RB)) > 8 ? 8 : (ACC / RSS(RB)))
#define BLOCK_ROWS_UB(RB, UB, HALF, TW, AH) NAME(block_rows)(RB, RSS(RB), UB, WS(RB), HALF, \
                                                         TW, qr, kb, vb, d, s0, s1, cut, mr, \
                                                         lr, Or, sc, r0 ? 0 : (AH), again)
/* 8 rows in one pass (AVX-512) take two vectors of tokens a step where wide8 says so */
#define BLOCK_ROWS_TW(RB, HALF, TW, AH) do {                                  \
                    if (VL == 16 && RSS(RB) == 8 && wide8)                    \
                        BLOCK_ROWS_UB(RB, RSS(RB) == 8 ? 2 : UBS(RB), HALF, TW, AH); \
                    else BLOCK_ROWS_UB(RB, UBS(RB), HALF, TW, AH);            \
                } while (0)
#define BLOCK_ROWS(RB, HALF) do {                                       \
                    const int n_ask = NAME(asks)(RB, HALF);             \
                    if (n_ask == 2) BLOCK_ROWS_TW(RB, HALF, 1, ahead);  \
                    else BLOCK_ROWS_TW(RB, HALF, 0, n_ask ? ahead : 0); \
                } while (0)
#define BY_ROWS(HALF) switch (rb) {                  \
                case 8: BLOCK_ROWS(8, HALF); break;  \
                case 4: BLOCK_ROWS(4, HALF); break;  \
                case 2: BLOCK_ROWS(2, HALF); break;  \
                default: BLOCK_ROWS(1, HALF); break; \
            }
                    if (half) { BY_ROWS(1) } else { BY_ROWS(0) }
#undef BY_ROWS
#undef BLOCK_ROWS
#undef BLOCK_ROWS_TW
#undef BLOCK_ROWS_UB
#undef WS
#undef UBS
#undef RSS
                }
            }
        }
        /* merge each head's tile partial into its running one */
        for (int x = 0; x < nh; x++) {
            float *mx = m + x * R, *lx = l + x * R, *Ox = O + x * R * d;
            const float *mt = MT(x), *lt = LT(x), *Ot = OT(x);
            for (Py_ssize_t r = 0; r < R; r++) {
                float m_new = mx[r] > mt[r] ? mx[r] : mt[r];
                if (mx[r] != mx[r] || mt[r] != mt[r]) m_new = NAN;
                const float shift = isinf(m_new) && m_new < 0 ? 0.0f : m_new;
                const float a = expf(mx[r] - shift), b = expf(mt[r] - shift);
                lx[r] = lx[r] * a + lt[r] * b;
                for (Py_ssize_t c = 0; c < d; c++)
                    Ox[r * d + c] = Ox[r * d + c] * a + Ot[r * d + c] * b;
                mx[r] = m_new;
            }
        }
    }
#undef QT
#undef MT
#undef LT
#undef OT
}

#include "_stream.h"   /* the overlap probe, on the same vectors and loads */

#undef VF
#undef VI
#undef LOADV
#undef FPB
