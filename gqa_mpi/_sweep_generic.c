/* The sweep and the overlap probe (_sweep.h, _stream.h) in portable C: every CPU. */
#include "_fused.h"

#define VL 4
#define ACC 8
#define SUFFIX generic
#define ROWS_PASS 8
#define NOASK_FPB 0
#define AGAIN_FPB 8
#define TWICE_FPB 0
#define JB_FEW JB
#include "_sweep.h"
