/* The sweep and the overlap probe (_sweep.h, _stream.h) on AVX2 with FMA and F16C. */
#include "_fused.h"

#ifdef GQA_X86
#pragma GCC target("avx2,fma,f16c")
#define VL 8
#define ACC 8
#define SUFFIX avx2
#define ROWS_PASS 4
#define NOASK_FPB 2
#define AGAIN_FPB 4
#define TWICE_FPB 0
#define JB_FEW 16
#include "_sweep.h"
#else
typedef int gqa_no_avx2;   /* ISO C wants a declaration in every unit */
#endif
