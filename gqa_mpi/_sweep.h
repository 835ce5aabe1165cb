/* The fused tile sweep (SPEC's per-rank steps 2 and 3), written once on _simd.h's
 * vectors and included by one unit per instruction set, which defines first:
 *   VL         floats per vector (16, 8 or 4)
 *   ACC        vector accumulators the loops may keep in registers
 *   ROWS_PASS  rows per pass over what is in L1 (AVX2's 16 registers hold 4 rows)
 *   JB_FEW     rows of V per step of P @ V for groups of 4 float32 rows (JB otherwise)
 *   SWEEP      the name of the unit's sweep
 *
 * A tile is swept in blocks of SUB tokens; per block and per group of RB rows (8, 4, 2
 * or 1): the scores, every K value read once for all RB rows; the online softmax of
 * the block; P @ V, every V value read once for all RB rows. Each tile's partial is
 * summed from zero and merged into the running one at the tile's end (FlashAttention-2,
 * Dao 2023): float32 error stays near rounding at long slices.
 */
#include "_simd.h"

/* Rows per pass, vectors of tokens per step of the scores, vectors of O per step of
 * P @ V: as many accumulators as the registers hold. */
#define RS(RB) ((RB) > ROWS_PASS ? ROWS_PASS : (RB))
#define UB(RB) (RS(RB) == 8 ? 1 : ACC / RS(RB) < SUB / VL ? ACC / RS(RB) : SUB / VL)
#define W(RB) (ACC / RS(RB) > 8 ? 8 : ACC / RS(RB))

/* A group that waits on memory (_fused.h's TWICE) asks for each line twice: a core may
 * drop a prefetch it has no room for. Where the flops bind, a second ask costs a load
 * slot. */

/* Lines asked for ahead of a loop that reads a region: in the region's address order,
 * whatever order the loop reads it in, so that memory sees one sequential stream. */
typedef struct {
    const char *at;   /* the region, `ahead` bytes on; NULL: ask for nothing */
    size_t pos;       /* bytes of the region the loop has read */
    size_t again;     /* with TW, each line is asked for once more this much nearer */
} asking;

INLINE void ask(asking *a, const size_t step, const int TW) {
    if (!a->at) return;
#define ASK_LINE(p) do { __builtin_prefetch((p), 0, 2); \
                         if (TW) __builtin_prefetch((p) - a->again, 0, 2); } while (0)
    if (step % 64 == 0)
        for (size_t n = 0; n < step / 64; n++) ASK_LINE(a->at + a->pos + 64 * n);
    else if (64 % step == 0) {
        if (!(a->pos & 63)) ASK_LINE(a->at + a->pos);
    } else
        for (size_t x = (a->pos + 63) & ~(size_t)63; x < a->pos + step; x += 64)
            ASK_LINE(a->at + x);
#undef ASK_LINE
    a->pos += step;
}

/* One block, tokens [s0, s1) of the slice, for one group of rows. */
typedef struct {
    const float *qt;        /* the rows transposed, (d, RB) */
    const void *k, *v;
    Py_ssize_t d, s0, s1;
    const Py_ssize_t *hi;   /* row r's end: its causal limit, or s1 */
    float *mt, *lt, *Ot;    /* the tile's partial of these rows */
    float *sc;              /* the block's scores, then weights: row r at r * SUB */
    asking k_ask, v_ask;
} block;

/* Scores of the block's rows against UBN vectors of tokens (vector u at element kofs[u]
 * of K), into sc. The sum over d goes in chunks of DCH dimensions, each summed from zero:
 * one running sum over d would round d times at the total's magnitude. Passes of RS
 * rows after the first read the chunk of K from L1. */
INLINE void scores(const int RB, const int HALF, const int UBN, block *b,
                   const size_t *kofs, float *sc) {
    const int rs = RS(RB), TW = TWICE(RB, HALF);
    const float *qt = b->qt;
    const void *k = b->k;
    const Py_ssize_t d = b->d;
    const vf zero = {0};
    for (Py_ssize_t i0 = 0; i0 < d; i0 += DCH) {
        const Py_ssize_t i1 = i0 + DCH < d ? i0 + DCH : d;
        for (int r0 = 0; r0 < RB; r0 += rs) {
            vf acc[8][ACC];
            for (int r = 0; r < rs; r++)
                for (int u = 0; u < UBN; u++) acc[r][u] = zero;
            for (Py_ssize_t i = i0; i < i1; i++) {
                if (!r0) ask(&b->k_ask, (size_t)UBN * VL * (HALF ? 2 : 4), TW);
                vf kv[ACC];
                for (int u = 0; u < UBN; u++) kv[u] = vf_load(HALF, k, kofs[u] + (size_t)i * 16);
                for (int r = 0; r < rs; r++) {
                    const float qv = qt[i * RB + r0 + r];
                    for (int u = 0; u < UBN; u++) acc[r][u] += qv * kv[u];
                }
            }
            for (int r = 0; r < rs; r++)
                for (int u = 0; u < UBN; u++) {
                    float *at = sc + (r0 + r) * SUB + u * VL;
                    vf_store(at, i0 ? acc[r][u] + vf_load32(at) : acc[r][u]);
                }
        }
    }
}

/* The online softmax of the block's row r (its scores at row, nv vectors from token
 * base): mask to [s0, hi[r]), raise the tile's max and rescale its partial where the
 * block raises it, and overwrite the scores with the weights exp(s - m). A NaN score
 * makes the row's sum and max NaN. */
INLINE void softmax_row(block *b, const int r, const Py_ssize_t base, const int nv) {
    const vf ninf = (vf){0} + -INFINITY;
    float *row = b->sc + r * SUB, *mt = b->mt, *lt = b->lt;
    const Py_ssize_t d = b->d, hi = b->hi[r];
    vf vmax = ninf;
    if (base == b->s0 && base + nv * VL <= hi)
        for (int u = 0; u < nv; u++) {
            const vf s = vf_load32(row + u * VL);
            vmax = vf_sel(s > vmax, s, vmax);
        }
    else {
        vi lane;
        for (int u = 0; u < VL; u++) lane[u] = u;
        for (int u = 0; u < nv; u++) {
            const vi tok = lane + (int32_t)(base + u * VL);
            const vi ok = (tok >= (int32_t)b->s0) & (tok < (int32_t)hi);
            const vf s = vf_sel(ok, vf_load32(row + u * VL), ninf);
            vf_store(row + u * VL, s);
            vmax = vf_sel(s > vmax, s, vmax);
        }
    }
    const float bmax = vf_hmax(vmax);
    const float m_new = mt[r] != mt[r] ? NAN : mt[r] > bmax ? mt[r] : bmax;
    if (!(m_new == mt[r])) {   /* raised, or NaN */
        if (!(isinf(mt[r]) && mt[r] < 0)) {
            const float alpha = expf(mt[r] - m_new);
            lt[r] *= alpha;
            for (Py_ssize_t c = 0; c < d; c++) b->Ot[r * d + c] *= alpha;
        }
        mt[r] = m_new;
    }
    const float shift = isinf(mt[r]) && mt[r] < 0 ? 0.0f : mt[r];
    vf sum = {0};
    for (int u = 0; u < nv; u++) {
        const vf p = vf_exp(vf_load32(row + u * VL) - shift);
        vf_store(row + u * VL, p);
        sum += p;
    }
    lt[r] += vf_hsum(sum);
    if (lt[r] != lt[r]) mt[r] = NAN;
}

/* O += P @ V over V rows [j0, j1) and columns [c0, c1) (WN vectors at a time): RS x WN
 * accumulators, passes of RS rows after the first reading V from L1. */
INLINE void pv(const int RB, const int HALF, const int WN, block *b, const Py_ssize_t j0,
               const Py_ssize_t j1, const Py_ssize_t c0, const Py_ssize_t c1) {
    const int rs = RS(RB), TW = TWICE(RB, HALF);
    const Py_ssize_t d = b->d, base = b->s0 / 16 * 16;
    const void *v = b->v;
    for (Py_ssize_t c = c0; c < c1; c += (Py_ssize_t)WN * VL)
        for (int r0 = 0; r0 < RB; r0 += rs) {
            float *Or = b->Ot + r0 * d + c;
            const float *pr = b->sc + r0 * SUB - base;
            vf acc[8][8];
            for (int r = 0; r < rs; r++)
                for (int w = 0; w < WN; w++) acc[r][w] = vf_load32(Or + r * d + w * VL);
            for (Py_ssize_t j = j0; j < j1; j++) {
                if (!r0) ask(&b->v_ask, (size_t)WN * VL * (HALF ? 2 : 4), TW);
                vf vv[8];
                for (int w = 0; w < WN; w++)
                    vv[w] = vf_load(HALF, v, (size_t)j * (size_t)d + (size_t)c + (size_t)w * VL);
                for (int r = 0; r < rs; r++) {
                    const float p = pr[r * SUB + j];
                    for (int w = 0; w < WN; w++) acc[r][w] += p * vv[w];
                }
            }
            for (int r = 0; r < rs; r++)
                for (int w = 0; w < WN; w++) vf_store(Or + r * d + w * VL, acc[r][w]);
        }
}

/* One block for one group of RB rows: scores, softmax, P @ V. */
INLINE void block_rows(const int RB, const int HALF, block *b) {
    const Py_ssize_t d = b->d, s0 = b->s0, s1 = b->s1, base = s0 / 16 * 16;
    const int nv = (int)(((s1 + 15) / 16 * 16 - base) / VL);   /* vectors of tokens */
    const int ub = UB(RB), whole = nv / ub * ub;
    size_t kofs[ACC];
    for (int u0 = 0; u0 < nv; u0 += u0 < whole ? ub : 1) {
        const int n = u0 < whole ? ub : 1;
        for (int u = 0; u < n; u++) {
            const Py_ssize_t tok = base + (Py_ssize_t)(u0 + u) * VL;
            kofs[u] = (size_t)(tok / 16) * (size_t)d * 16 + (size_t)(tok % 16);
        }
        if (n == ub) scores(RB, HALF, UB(RB), b, kofs, b->sc + u0 * VL);
        else scores(RB, HALF, 1, b, kofs, b->sc + u0 * VL);
    }
    for (int r = 0; r < RB; r++) softmax_row(b, r, base, nv);
    /* P @ V, jb rows of V at a time: W vectors of columns, then one vector, then one
     * column at a time (d not a multiple of VL) */
    const Py_ssize_t wide = d / (W(RB) * VL) * (W(RB) * VL), vecs = d / VL * VL;
    const Py_ssize_t jb = !HALF && RB == 4 ? JB_FEW : JB;
    for (Py_ssize_t j0 = s0; j0 < s1; j0 += jb) {
        const Py_ssize_t j1 = j0 + jb < s1 ? j0 + jb : s1;
        pv(RB, HALF, W(RB), b, j0, j1, 0, wide);
        if (W(RB) > 1 && wide < vecs) pv(RB, HALF, 1, b, j0, j1, wide, vecs);
        for (Py_ssize_t c = vecs; c < d; c++)
            for (Py_ssize_t j = j0; j < j1; j++) {
                const size_t at = (size_t)j * (size_t)d + (size_t)c;
                const float x = HALF ? (float)((const _Float16 *)b->v)[at]
                                     : ((const float *)b->v)[at];
                for (int r = 0; r < RB; r++) b->Ot[r * d + c] += b->sc[r * SUB + (j - base)] * x;
            }
    }
}

/* Every group of rows of one block; the first group asks for the lines of K and V
 * AHEAD blocks on, as many as it reads. */
INLINE void block_groups(const int HALF, const sweep_args *a, float *qt, float *mt,
                         float *lt, float *Ot, const Py_ssize_t s0, const Py_ssize_t s1) {
    const Py_ssize_t R = a->R, d = a->d, base = s0 / 16 * 16;
    const size_t es = HALF ? 2 : 4, ahead = (size_t)AHEAD * SUB * (size_t)d * es;
    for (Py_ssize_t r0 = 0, rb; r0 < R; r0 += rb) {
        rb = GROUP(R - r0);
        Py_ssize_t cut[8];
        for (Py_ssize_t r = 0; r < rb; r++) {
            const Py_ssize_t h = a->row_hi ? a->row_hi[r0 + r] : s1;
            cut[r] = h < s1 ? h : s1;
        }
        block b = {qt + r0 * d, a->k, a->v, d, s0, s1, cut, mt + r0, lt + r0, Ot + r0 * d,
                   a->scratch,
                   {r0 ? NULL : (const char *)a->k + (size_t)base * (size_t)d * es + ahead, 0,
                    (size_t)SUB * (size_t)d * es},
                   {r0 ? NULL : (const char *)a->v + (size_t)s0 * (size_t)d * es + ahead, 0,
                    (size_t)SUB * (size_t)d * es}};
        switch (rb) {   /* the group's size and the dtype: constants in each call */
        case 8: block_rows(8, HALF, &b); break;
        case 4: block_rows(4, HALF, &b); break;
        case 2: block_rows(2, HALF, &b); break;
        default: block_rows(1, HALF, &b); break;
        }
    }
}

/* Merge a tile's partial (mt, lt, Ot) into the running one (SPEC's step 3). */
static void merge_tile(const sweep_args *a, const float *mt, const float *lt, const float *Ot) {
    const Py_ssize_t d = a->d;
    for (Py_ssize_t r = 0; r < a->R; r++) {
        float *m = a->m + r, *l = a->l + r, *O = a->O + r * d;
        float m_new = *m > mt[r] ? *m : mt[r];
        if (*m != *m || mt[r] != mt[r]) m_new = NAN;
        const float shift = isinf(m_new) && m_new < 0 ? 0.0f : m_new;
        const float x = expf(*m - shift), y = expf(mt[r] - shift);
        *l = *l * x + lt[r] * y;
        for (Py_ssize_t c = 0; c < d; c++) O[c] = O[c] * x + Ot[r * d + c] * y;
        *m = m_new;
    }
}

GQA_HIDDEN void SWEEP(const sweep_args *a) {
    const Py_ssize_t R = a->R, d = a->d;
    float *qt = a->scratch + 8 * SUB, *mt = qt + R * d, *lt = mt + R, *Ot = lt + R;
    /* the rows in groups of 8, 4, 2, 1, each transposed (d x rb) for the scores */
    for (Py_ssize_t r0 = 0, rb; r0 < R; r0 += rb) {
        rb = GROUP(R - r0);
        for (Py_ssize_t i = 0; i < d; i++)
            for (Py_ssize_t r = 0; r < rb; r++) qt[r0 * d + i * rb + r] = a->q[(r0 + r) * d + i];
    }
    for (Py_ssize_t t0 = a->lo; t0 < a->hi; t0 += a->tile) {
        const Py_ssize_t t1 = t0 + a->tile < a->hi ? t0 + a->tile : a->hi;
        for (Py_ssize_t r = 0; r < R; r++) mt[r] = -INFINITY, lt[r] = 0.0f;
        memset(Ot, 0, sizeof(float) * (size_t)R * (size_t)d);
        for (Py_ssize_t s0 = t0, s1; s0 < t1; s0 = s1) {
            s1 = s0 / 16 * 16 + SUB < t1 ? s0 / 16 * 16 + SUB : t1;
            if (a->half) block_groups(1, a, qt, mt, lt, Ot, s0, s1);
            else block_groups(0, a, qt, mt, lt, Ot, s0, s1);
        }
        merge_tile(a, mt, lt, Ot);
    }
}
