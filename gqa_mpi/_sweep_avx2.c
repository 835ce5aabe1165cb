/* The sweep on AVX2 with FMA and F16C. Its 16 registers hold 4 rows a pass; 4 rows of
 * float32 read V in columns of 64 bytes, 16 rows at a time. */
#include "_fused.h"

#ifdef GQA_X86
#pragma GCC target("avx2,fma,f16c")
#define VL 8
#define ACC 8
#define ROWS_PASS 4
#define JB_FEW 16
#define SWEEP sweep_avx2
#include "_sweep.h"
#else
typedef int gqa_no_avx2;   /* ISO C wants a declaration in every unit */
#endif
