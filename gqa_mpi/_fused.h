/* What the fused kernel's translation units share (_fused.c, the module, and the sweep
 * compiled once per instruction set: _sweep_avx512.c, _sweep_avx2.c, _sweep_generic.c;
 * separate units so that an install compiles them on as many cores as it has).
 * The tuning constants below may be set with -D for a scratch build. */
#ifndef GQA_FUSED_H
#define GQA_FUSED_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Tokens per block of a tile's sweep (a multiple of 16), blocks of prefetch distance,
 * and dimensions per chunk of a score's sum: see _sweep.h. */
#ifndef SUB
#define SUB 128
#endif
#ifndef AHEAD
#define AHEAD 2
#endif
#ifndef DCH
#define DCH 32
#endif
#ifndef HINT
#define HINT 2
#endif
#ifndef JB
#define JB 32   /* rows of V per step of P @ V: 32 rows of d = 128 floats are 16 KiB (L1) */
#endif

/* The rows of a group: 8, 4, 2 or 1 of the `left` rows still to go. */
#define GROUP(left) ((left) >= 8 ? 8 : (left) >= 4 ? 4 : (left) >= 2 ? 2 : 1)

/* The scratch of one sweep_head call of nh heads, in floats: a block's scores (8 rows),
 * and per head the rows transposed and the tile's partial (m, l, O) of every row. */
#define SCRATCH_FLOATS(R, d, nh) (8 * SUB + (nh) * ((R) * (d) * 2 + 2 * (R)))

/* Ask for the cache line at p (a hint: an address past the array is no fault). */
#ifdef NOPF
#define PREFETCH(p) ((void)0)
#else
#define PREFETCH(p) __builtin_prefetch((p), 0, HINT)
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GQA_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

/* Shared between the units, not exported from the module. */
#define GQA_HIDDEN __attribute__((visibility("hidden")))

/* How the sweep asks for lines of K and V ahead of its loops (_sweep.h's asks): every line
 * once; twice in groups of rows with few flops per byte (below AGAIN_FPB); as twice, but
 * none in groups with fewer still (below NOASK_FPB); or as twice, but none only in the
 * float32 groups below half of NOASK_FPB. Set by _fused.c (see there). */
enum { ASK_ONCE, ASK_TWICE, ASK_NONE, ASK_NONE32 };
extern GQA_HIDDEN int asking;

/* Whether the AVX-512 sweep's groups of 8 rows take two vectors of tokens per step of the
 * scores (16 accumulators) in place of one (8): on Intel's cores, whose two FMA ports and
 * two vector loads a cycle leave the 8 broadcasts of one vector load-bound. Set by _fused.c
 * (see there); the results are the same, bit for bit. */
extern GQA_HIDDEN int wide8;

/* One sweep call (_sweep.h's sweep_head), one overlap probe (_stream.h's stream) and the
 * sweep's asking (_sweep.h's asks): the functions' types, each path's three declared by
 * them, and the pointers of _fused.c's table of paths. */
typedef void sweep_head_t(const float *, const void *, const void *, int, Py_ssize_t,
                          Py_ssize_t, Py_ssize_t, Py_ssize_t, Py_ssize_t, const Py_ssize_t *,
                          float *, float *, float *, float *, Py_ssize_t, int, size_t, size_t);
typedef double stream_t(const char *, int, size_t, size_t, size_t, int, float, float);
typedef int asks_t(int, int);   /* how often a group of rows asks for each line (_sweep.h) */
typedef sweep_head_t *sweep_fn;
typedef stream_t *stream_fn;
typedef asks_t *asks_fn;

#define GQA_PATH(SUFFIX) GQA_HIDDEN sweep_head_t sweep_head_##SUFFIX; \
    GQA_HIDDEN stream_t stream_##SUFFIX; GQA_HIDDEN asks_t asks_##SUFFIX;
GQA_PATH(generic)
#ifdef GQA_X86
GQA_PATH(avx512)
GQA_PATH(avx2)
#endif
#undef GQA_PATH

#endif
