/* The fused tile sweep, written once for a vector of VL floats and included by
 * _fused.c once per instruction set (AVX-512, AVX2+FMA+F16C, and plain C).
 *
 * Before each inclusion: VL (lanes per vector: 16, 8 or 4; 16 and 8 use the AVX-512
 * and F16C conversions of float16), ACC (vector accumulators
 * the P @ V loop may keep in registers) and SUFFIX (appended to the function names).
 *
 * One call sweeps tokens [lo, hi) of one KV head for all R query rows, in tiles:
 *   pass 1  scores of a block of 16 tokens for RB rows at once (K block is (d, 16),
 *           so every K value is loaded once and multiplied into RB accumulators);
 *   pass 2  the tile's max, exp(s - m) and its sum, per row;
 *   pass 3  P @ V with RB x W accumulators over the tile's V rows, then the tile's
 *           partial (its own l and O, summed from zero) is merged into the running one.
 * Summing each tile from zero keeps float32 error near rounding at 256K tokens.
 */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define NAME(x) CAT(x, SUFFIX)

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

/* One row block of one tile: rows q[0..RB) (pre-scaled), tokens [t0, t1) of the
 * slice. K blocks are (d, 16); blocks b0 .. b1-1 cover the tile. Scratch: sc holds
 * the scores (RB x sw, token t at column t - 16*b0), pt the weights token-major
 * (sw x RB), qt the rows transposed (d x RB), ot the tile's O (RB x d). With
 * `fetch`, pass 1 also asks for the V rows of its block (for pass 3) and for the K
 * block `AHEAD` blocks on (up to block kb_end), one cache line per step. */
#ifndef AHEAD
#define AHEAD 4
#endif
#ifndef KHINT
#define KHINT 2
#endif
#ifndef DCH
#define DCH 8
#endif
#ifndef VFETCH
#define VFETCH 1
#endif
static inline __attribute__((always_inline)) void NAME(tile_rows)(
        const int RB, const int W, const int half, const float *q, const void *k,
        const void *v, const Py_ssize_t d, const Py_ssize_t t0, const Py_ssize_t t1,
        const Py_ssize_t *row_hi, float *m, float *l, float *O, float *sc, float *pt,
        float *qt, const Py_ssize_t sw, float *ot, const Py_ssize_t kb_end, const int fetch) {
    const Py_ssize_t b0 = t0 / 16, b1 = (t1 + 15) / 16;
    const size_t es = half ? 2 : 4;
    const Py_ssize_t base = 16 * b0;
    const VF zero = {0}, ninf = zero + -INFINITY;
    const VI izero = {0};
    VI lane;
    for (int u = 0; u < VL; u++) lane[u] = u;
    VF vmax[8];
    VI vnan[8];
    for (int r = 0; r < RB; r++) {
        vmax[r] = ninf;
        vnan[r] = izero;
        for (Py_ssize_t i = 0; i < d; i++) qt[i * RB + r] = q[r * d + i];
    }
    /* pass 1: scores, masked to the tile and to each row's causal limit */
    for (Py_ssize_t bi = b0; bi < b1; bi++) {
        const size_t kb = (size_t)bi * (size_t)d * 16;
        const char *kfetch = (const char *)k + (kb + (size_t)AHEAD * d * 16) * es;
        const char *vfetch = (const char *)v + (size_t)bi * 16 * d * es;
        const int fk = fetch && bi + AHEAD < kb_end, fv = fetch && bi + 1 < b1;
        /* q . k for RB rows x UB vectors of tokens at once (all 16 tokens when the
         * accumulators allow it, else one vector at a time), in chunks of DCH
         * dimensions, each summed from zero and then added to the total: with |scores|
         * large (1e5, say) a single running sum over d rounds d times at the total's
         * magnitude, several times what BLAS does */
        enum { NV = 16 / VL };
        const int UB = RB * NV <= ACC ? NV : 1;
        for (int u0 = 0; u0 < NV; u0 += UB) {
            VF acc[8][NV], tot[8][NV];
            for (int r = 0; r < RB; r++)
                for (int u = 0; u < UB; u++) tot[r][u] = zero;
            for (Py_ssize_t i0 = 0; i0 < d; i0 += DCH) {
                const Py_ssize_t i1 = i0 + DCH < d ? i0 + DCH : d;
                for (int r = 0; r < RB; r++)
                    for (int u = 0; u < UB; u++) acc[r][u] = zero;
                for (Py_ssize_t i = i0; i < i1; i++) {
                    if (u0 == 0) {  /* K and V blocks are 16*d*es bytes: 16*es per step */
                        if (fk) __builtin_prefetch(kfetch + (size_t)i * 16 * es, 0, KHINT);
                        if (VFETCH && fv) __builtin_prefetch(vfetch + (size_t)i * 16 * es, 0, 2);
                    }
                    VF kv[NV];
                    for (int u = 0; u < UB; u++)
                        kv[u] = LOADV(half, k, kb + (size_t)i * 16 + (size_t)(u0 + u) * VL);
                    for (int r = 0; r < RB; r++) {
                        const float qv = qt[i * RB + r];
                        for (int u = 0; u < UB; u++) acc[r][u] += qv * kv[u];
                    }
                }
                for (int r = 0; r < RB; r++)
                    for (int u = 0; u < UB; u++) tot[r][u] += acc[r][u];
            }
            for (int u = 0; u < UB; u++) {
                const Py_ssize_t tok0 = bi * 16 + (u0 + u) * VL;
                VI tok = lane + (int32_t)tok0;
                for (int r = 0; r < RB; r++) {
                    VI ok = (tok >= (int32_t)t0) & (tok < (int32_t)row_hi[r]);
                    VF s = NAME(sel)(ok, tot[r][u], ninf);
                    memcpy(sc + r * sw + (tok0 - base), &s, sizeof s);
                    vnan[r] |= s != s;
                    vmax[r] = NAME(sel)(s > vmax[r], s, vmax[r]);
                }
            }
        }
    }
    /* pass 2: the tile's max, weights (stored token-major for pass 3) and their sum */
    float alpha[8];
    const Py_ssize_t width = 16 * (b1 - b0);
    for (int r = 0; r < RB; r++) {
        float tmax = -INFINITY;
        int nan = 0;
        for (int u = 0; u < VL; u++) {
            tmax = vmax[r][u] > tmax ? vmax[r][u] : tmax;
            nan |= vnan[r][u] != 0;
        }
        float m_new = m[r] > tmax ? m[r] : tmax;
        if (nan || m[r] != m[r]) m_new = NAN;
        const float shift = isinf(m_new) && m_new < 0 ? 0.0f : m_new;
        alpha[r] = expf(m[r] - shift);
        VF sum = zero;
        const float *row = sc + r * sw;
        for (Py_ssize_t j = 0; j < width; j += VL) {
            VF p = NAME(vexp)(NAME(ld32)(row + j) - shift);
            for (int u = 0; u < VL; u++) pt[(j + u) * RB + r] = p[u];
            sum += p;
        }
        float tsum = 0.0f;
        for (int u = 0; u < VL; u++) tsum += sum[u];
        l[r] = l[r] * alpha[r] + tsum;
        m[r] = m_new;
    }
    /* pass 3: O_tile = P @ V, in blocks of JB tokens so V stays in L1 */
    const int JB = 32;
    memset(ot, 0, sizeof(float) * (size_t)RB * (size_t)d);
    for (Py_ssize_t j0 = t0; j0 < t1; j0 += JB) {
        const Py_ssize_t j1 = j0 + JB < t1 ? j0 + JB : t1;
        Py_ssize_t c = 0;
        for (; c + W * VL <= d; c += W * VL) {
            VF acc[8][8];
            for (int r = 0; r < RB; r++)
                for (int w = 0; w < W; w++) acc[r][w] = NAME(ld32)(ot + r * d + c + w * VL);
            const float *pj = pt + (j0 - base) * RB;
            for (Py_ssize_t j = j0; j < j1; j++, pj += RB) {
                VF vv[8];
                for (int w = 0; w < W; w++)
                    vv[w] = LOADV(half, v, (size_t)j * (size_t)d + (size_t)c + (size_t)w * VL);
                for (int r = 0; r < RB; r++)
                    for (int w = 0; w < W; w++) acc[r][w] += pj[r] * vv[w];
            }
            for (int r = 0; r < RB; r++)
                for (int w = 0; w < W; w++) memcpy(ot + r * d + c + w * VL, &acc[r][w], sizeof(VF));
        }
        for (; c < d; c++) {  /* a head dimension that is not a multiple of W * VL */
            for (Py_ssize_t j = j0; j < j1; j++) {
                const size_t at = (size_t)j * (size_t)d + (size_t)c;
                const float x = half ? (float)((const _Float16 *)v)[at] : ((const float *)v)[at];
                for (int r = 0; r < RB; r++) ot[r * d + c] += pt[(j - base) * RB + r] * x;
            }
        }
    }
    for (int r = 0; r < RB; r++)
        for (Py_ssize_t c = 0; c < d; c++) O[r * d + c] = O[r * d + c] * alpha[r] + ot[r * d + c];
}

/* Tokens [lo, hi) of one KV head, all R rows, in tiles of `tile` tokens. */
static void NAME(sweep_head)(const float *q, const void *k, const void *v, int half,
                             Py_ssize_t R, Py_ssize_t d, Py_ssize_t lo, Py_ssize_t hi,
                             Py_ssize_t tile, const Py_ssize_t *row_hi, float *m, float *l,
                             float *O, float *scratch, Py_ssize_t sw) {
    float *sc = scratch, *pt = sc + 8 * sw, *qt = pt + 8 * sw, *ot = qt + 8 * d;
    const Py_ssize_t kb_end = (hi + 15) / 16;
    for (Py_ssize_t t0 = lo; t0 < hi; t0 += tile) {
        const Py_ssize_t t1 = t0 + tile < hi ? t0 + tile : hi;
        Py_ssize_t r0 = 0;
        while (r0 < R) {
            Py_ssize_t cut[8];
            const Py_ssize_t left = R - r0;
            const int rb = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
            for (int r = 0; r < rb; r++) {
                const Py_ssize_t h = row_hi ? row_hi[r0 + r] : t1;
                cut[r] = h < t1 ? h : t1;
            }
            const float *qr = q + r0 * d;
            float *mr = m + r0, *lr = l + r0, *Or = O + r0 * d;
            /* RB rows and the element type are compile-time constants in each call */
#define TILE_ROWS(RB, HALF) NAME(tile_rows)(RB, (ACC / RB) > 8 ? 8 : (ACC / RB), HALF, qr, \
                                            k, v, d, t0, t1, cut, mr, lr, Or, sc, pt, qt, \
                                            sw, ot, kb_end, r0 == 0)
#define BY_ROWS(HALF) switch (rb) {                  \
                case 8: TILE_ROWS(8, HALF); break;   \
                case 4: TILE_ROWS(4, HALF); break;   \
                case 2: TILE_ROWS(2, HALF); break;   \
                default: TILE_ROWS(1, HALF); break;  \
            }
            if (half) { BY_ROWS(1) } else { BY_ROWS(0) }
#undef BY_ROWS
#undef TILE_ROWS
            r0 += rb;
        }
    }
}

#undef VF
#undef VI
#undef LOADV
