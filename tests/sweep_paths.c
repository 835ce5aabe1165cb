/* Every instruction-set path of the fused sweep, exported for tests/fused_paths.py: the
 * module itself runs only the best path the CPU has. */
#include "_fused.h"

void run_generic(const sweep_args *a) { sweep_generic(a); }
#ifdef GQA_X86
void run_avx2(const sweep_args *a) { sweep_avx2(a); }
void run_avx512(const sweep_args *a) { sweep_avx512(a); }
#endif
