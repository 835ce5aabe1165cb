/* The sweep on AVX-512 (with AVX-512VL and F16C), where the CPU has it. */
#include "_fused.h"

#ifdef GQA_X86
#pragma GCC target("avx512f,avx512vl,avx2,fma,f16c")
#define VL 16
#define ACC 16
#define ROWS_PASS 8
#define JB_FEW JB
#define SWEEP sweep_avx512
#include "_sweep.h"
#else
typedef int gqa_no_avx512;   /* ISO C wants a declaration in every unit */
#endif
