/* The overlap probe: does this core hide a stream's reads under its flops? Included by
 * _sweep.h at its end, so once per instruction set (it takes that file's vector type and
 * its loads, which widen float16 as the sweep does).
 *
 * stream(p, half, n, wrap, ahead, G) reads n bytes of float32 (half = 0) or float16
 * elements in address order, widens each vector of VL to float32 and does G vector FMAs
 * on it: G FMAs per element, as a sweep of G query rows does per element of K and of V.
 * The FMAs go round ACC independent accumulators, so they are bound by the FMA ports and
 * not by their latency; G = 0 adds each vector once (the read alone). With ahead > 0
 * each line is prefetched `ahead` bytes before it is read, as the sweep does; with
 * wrap > 0 the first `wrap` bytes are read again and again (in cache, no prefetch), so
 * that the same work is timed without the memory. n and wrap are multiples of
 * STREAM_GROUP (eight vectors of float32 on the widest path). Returns the sum of the
 * accumulators, so that nothing is optimised away: the sum of the elements read, times
 * the sum of the G coefficients, which alternate between c0 and c1 (1 for G = 0).
 */
static inline __attribute__((always_inline)) double NAME(stream_g)(
        const int G, const char *p, const int half, const size_t n, const size_t wrap,
        const size_t ahead, const float c0, const float c1) {
    const size_t es = half ? 2 : 4, gb = 8 * VL * es;   /* bytes per group of 8 vectors */
    const VF zero = {0}, c[2] = {zero + c0, zero + c1};
    VF acc[ACC];
    for (int a = 0; a < ACC; a++) acc[a] = zero;
    for (size_t pos = 0, at = 0; pos < n; pos += gb, at += gb) {
        if (wrap && at == wrap) at = 0;
        if (ahead && !wrap)
            for (size_t b = 0; b < gb; b += 64) PREFETCH(p + at + b + ahead);
        for (int u = 0; u < 8; u++) {
            const VF x = LOADV(half, p + at, (size_t)u * VL);
            if (G == 0) acc[u % ACC] += x;
            for (int j = 0; j < G; j++) acc[(u * G + j) % ACC] += x * c[j % 2];
        }
    }
    double out = 0;
    for (int a = 0; a < ACC; a++)
        for (int u = 0; u < VL; u++) out += acc[a][u];
    return out;
}

/* G FMAs per element: G is 0, 1, 2, 4, 8 or 16 (the caller checks; 0 otherwise). */
GQA_HIDDEN double NAME(stream)(const char *p, int half, size_t n, size_t wrap, size_t ahead,
                           int G, float c0, float c1) {
    switch (G) {
#define STREAM_CASE(g) case g: return NAME(stream_g)(g, p, half, n, wrap, ahead, c0, c1);
    STREAM_CASE(0) STREAM_CASE(1) STREAM_CASE(2) STREAM_CASE(4) STREAM_CASE(8) STREAM_CASE(16)
#undef STREAM_CASE
    default: return 0;
    }
}
