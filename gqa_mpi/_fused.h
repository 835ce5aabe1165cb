/* What the fused kernel's units share: its constants, the arguments of one sweep, and
 * the sweep of each instruction set (_sweep.h, compiled once per unit so that an
 * install compiles them on as many cores as it has). */
#ifndef GQA_FUSED_H
#define GQA_FUSED_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define SUB 128   /* tokens per block of a tile: a block's scores stay in L1 */
#define AHEAD 2   /* blocks ahead of the loops that K and V are asked for */
#define DCH 32    /* dimensions per chunk of a score's sum, each chunk summed from zero */
#define JB 32     /* rows of V per step of P @ V: 32 rows of d = 128 floats are 16 KiB */

/* The rows of a group: 8, 4, 2 or 1 of the `left` rows still to go. */
#define GROUP(left) ((left) >= 8 ? 8 : (left) >= 4 ? 4 : (left) >= 2 ? 2 : 1)

/* Flops per byte of K and V of a group of RB rows (half: float16 K and V). A group of
 * 1 to 3 waits on memory and asks for each line twice (_sweep.h's ask, _fused.c's pick);
 * float32 rows alone are left to the core's stream prefetcher's pace. */
#define FPB(RB, HALF) (2 * (RB) / ((HALF) ? 2 : 4))
#define TWICE(RB, HALF) (FPB(RB, HALF) >= 1 && FPB(RB, HALF) < 4)

/* One sweep's scratch, in floats: a block's scores (8 rows), the rows transposed and
 * the tile's partial (m, l, O). */
#define SCRATCH_FLOATS(R, d) (8 * SUB + 2 * (R) * (d) + 2 * (R))

/* One sweep: tokens [lo, hi) of one KV head, for all R query rows, in tiles. */
typedef struct {
    const float *q;            /* (R, d), the scores' scale applied */
    const void *k;             /* (ceil(S / 16), d, 16): K in blocks of 16 tokens */
    const void *v;             /* (S, d), K's dtype */
    int half;                  /* K and V are float16 (else float32) */
    Py_ssize_t R, d, lo, hi, tile;
    const Py_ssize_t *row_hi;  /* NULL, or (R,): row r sees tokens < row_hi[r] */
    float *m, *l, *O;          /* (R,), (R,), (R, d): the running partial, updated */
    float *scratch;            /* SCRATCH_FLOATS(R, d), 64-byte aligned */
} sweep_args;

typedef void sweep_fn(const sweep_args *);

#define GQA_HIDDEN __attribute__((visibility("hidden")))
GQA_HIDDEN sweep_fn sweep_generic;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GQA_X86 1
#include <immintrin.h>
GQA_HIDDEN sweep_fn sweep_avx512;
GQA_HIDDEN sweep_fn sweep_avx2;
#endif

#endif
