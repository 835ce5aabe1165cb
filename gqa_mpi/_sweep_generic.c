/* The sweep in portable C: every CPU. */
#include "_fused.h"

#define VL 4
#define ACC 8
#define ROWS_PASS 8
#define JB_FEW JB
#define SWEEP sweep_generic
#include "_sweep.h"
