/* The vector primitives the sweep is written on, for a vector of VL floats (16: AVX-512,
 * 8: AVX2 with F16C, 4: portable C). Included by _sweep.h. */
typedef float vf __attribute__((vector_size(VL * 4)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));

#define INLINE static inline __attribute__((always_inline))

INLINE vf vf_load32(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE void vf_store(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* VL float16 values widened to float32. */
INLINE vf vf_load16(const uint16_t *p) {
#if VL == 16
    return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif VL == 8
    return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    vf out;
    for (int u = 0; u < VL; u++) out[u] = (float)((const _Float16 *)p)[u];
    return out;
#endif
}

/* Element i of K or V (float16 where half, else float32) onwards, as float32. */
#define vf_load(half, p, i) ((half) ? vf_load16((const uint16_t *)(p) + (i)) \
                                    : vf_load32((const float *)(p) + (i)))

INLINE vf vf_sel(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }

INLINE float vf_hmax(vf x) {
    float out = -INFINITY;
    for (int u = 0; u < VL; u++) out = x[u] > out ? x[u] : out;
    return out;
}

INLINE float vf_hsum(vf x) {
    float out = 0.0f;
    for (int u = 0; u < VL; u++) out += x[u];
    return out;
}

/* exp(x) for x <= 0, -inf or NaN: Cephes' expf. 0 below -87 (so -inf gives 0), NaN
 * stays NaN, about 1 ulp elsewhere. */
INLINE vf vf_exp(vf x) {
    const vf zero = {0}, lo = zero + -87.0f;
    const vi tiny = x < lo;
    const vf xc = vf_sel(tiny, lo, x);
    const vf t = xc * 1.44269504088896341f + 12582912.0f;   /* round via 1.5 * 2^23 */
    const vi n = (vi)t - 0x4B400000;
    const vf nf = t - 12582912.0f;
    vf r = xc - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    vf p = r * 1.9875691500E-4f + 1.3981999507E-3f;
    p = p * r + 8.3334519073E-3f;
    p = p * r + 4.1665795894E-2f;
    p = p * r + 1.6666665459E-1f;
    p = p * r + 5.0000001201E-1f;
    p = p * (r * r) + r + 1.0f;
    return vf_sel(tiny, zero, p * (vf)((n + 127) << 23));
}
