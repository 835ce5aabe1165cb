/* The sweep and the overlap probe (_sweep.h, _stream.h) on AVX-512, where the CPU has it. */
#include "_fused.h"

#ifdef GQA_X86
#pragma GCC target("avx512f,avx512vl,avx2,fma,f16c")
#define VL 16
#define ACC 16
#define SUFFIX avx512
#define ROWS_PASS 8
#define NOASK_FPB 4
#define AGAIN_FPB 4   /* 8 before 2026-12-07: a Sapphire Rapids gained at 4 (_sweep.h) */
#define TWICE_FPB 1   /* float32 G = 1 asks once (_sweep.h) */
#define JB_FEW JB
#include "_sweep.h"
#else
typedef int gqa_no_avx512;   /* ISO C wants a declaration in every unit */
#endif
