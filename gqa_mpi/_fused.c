/* gqa_mpi._fused: the fused local attention kernel, one pass over K and V per tile.
 *
 * sweep(q, k, v, m, l, O, lo, hi, tile, row_hi)
 *   q        (B, H, R, d) float32, the scores' scale applied
 *   k        (B, H, nb, d, 16) float32 or float16: K in blocks of 16 tokens, transposed
 *   v        (B, H, S, d), k's dtype, S <= 16 * nb
 *   m, l, O  (B, H, R), (B, H, R), (B, H, R, d) float32: the running partial, updated
 *   lo, hi   tokens [lo, hi) of the slice; tiles of `tile` tokens start at lo
 *   row_hi   None, or (R,) int64: row r sees the slice's tokens < row_hi[r] (causal)
 * isa(R=0, half=False): the instruction set a sweep of R query rows per KV head (float16
 *   K and V where half) runs on: avx512, avx2 or generic; with R = 0, the best the CPU
 *   supports, picked at import (see pick for calls that wait on memory).
 * scratch_bytes(R, d): the scratch one sweep allocates.
 *
 * The sweep (_sweep.h) is compiled once per instruction set (_sweep_avx512.c,
 * _sweep_avx2.c, _sweep_generic.c). Arrays arrive through the buffer protocol, so the
 * build needs only a C compiler.
 */
#include <stdlib.h>

#include "_fused.h"

/* The best sweep the CPU runs. A call whose groups wait on memory and ask for each line
 * twice (_fused.h's TWICE) runs on 256-bit vectors (`narrow`) where the CPU has AVX2 too:
 * wider loops read memory no faster, and on cores that run 512-bit instructions as two
 * halves they swept such calls slower (docs/performance.md). */
static sweep_fn *chosen = sweep_generic, *narrow = NULL;
static const char *chosen_name = "generic", *narrow_name = "avx2";

static void pick(void) {
#ifdef GQA_X86
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                     && __builtin_cpu_supports("f16c");
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) {
        chosen = sweep_avx512, chosen_name = "avx512";
        if (avx2) narrow = sweep_avx2;
    } else if (avx2) {
        chosen = sweep_avx2, chosen_name = "avx2";
    }
#endif
}

/* The sweep a call of R rows per KV head runs, and its name. */
static sweep_fn *path(Py_ssize_t R, int half, const char **name) {
    const int narrowed = narrow && R > 0 && TWICE(GROUP(R), half);
    if (name) *name = narrowed ? narrow_name : chosen_name;
    return narrowed ? narrow : chosen;
}

static int is_fmt(const Py_buffer *b, Py_ssize_t size, const char *fmt) {
    return b->itemsize == size && b->format && !strcmp(b->format, fmt);
}
static int is_f32(const Py_buffer *b) { return is_fmt(b, 4, "f"); }
static int is_f16(const Py_buffer *b) { return is_fmt(b, 2, "e"); }
static int is_i64(const Py_buffer *b) { return is_fmt(b, 8, "l") || is_fmt(b, 8, "q"); }

/* Check the buffers' shapes and dtypes; NULL where they agree, else why not. */
static const char *invalid(Py_buffer *b, int n_bufs, Py_ssize_t lo, Py_ssize_t hi,
                           Py_ssize_t tile) {
    Py_buffer *q = &b[0], *k = &b[1], *v = &b[2], *m = &b[3], *l = &b[4], *O = &b[5];
    if (!(q->ndim == 4 && k->ndim == 5 && v->ndim == 4 && m->ndim == 3 && l->ndim == 3
          && O->ndim == 4))
        return "sweep: q, k, v, m, l, O must be 4-, 5-, 4-, 3-, 3-, 4-D";
    if (!(is_f32(q) && is_f32(m) && is_f32(l) && is_f32(O)))
        return "sweep: q, m, l, O must be float32";
    if (!((is_f16(k) && is_f16(v)) || (is_f32(k) && is_f32(v))))
        return "sweep: k and v must both be float32 or both float16";
    const Py_ssize_t *s = q->shape;
    for (int i = 0; i < 2; i++)
        if (k->shape[i] != s[i] || v->shape[i] != s[i] || m->shape[i] != s[i]
            || l->shape[i] != s[i] || O->shape[i] != s[i])
            return "sweep: shapes do not agree";
    if (k->shape[3] != s[3] || k->shape[4] != 16 || v->shape[3] != s[3]
        || v->shape[2] > 16 * k->shape[2] || m->shape[2] != s[2] || l->shape[2] != s[2]
        || O->shape[2] != s[2] || O->shape[3] != s[3])
        return "sweep: shapes do not agree";
    if (!(0 <= lo && lo <= hi && hi <= v->shape[2] && tile >= 1 && v->shape[2] < INT32_MAX - 64))
        return "sweep: need 0 <= lo <= hi <= S < 2**31 and tile >= 1";
    if (n_bufs == 7 && !(b[6].ndim == 1 && b[6].shape[0] == s[2] && is_i64(&b[6])))
        return "sweep: row_hi must be (R,) int64";
    return NULL;
}

static PyObject *sweep(PyObject *self, PyObject *args) {
    PyObject *objs[7];
    Py_ssize_t lo, hi, tile;
    if (!PyArg_ParseTuple(args, "OOOOOOnnnO", &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5], &lo, &hi, &tile, &objs[6]))
        return NULL;
    Py_buffer b[7];
    int got = 0;
    PyObject *result = NULL;
    const int n_bufs = objs[6] == Py_None ? 6 : 7;
    for (; got < n_bufs; got++) {
        const int writable = got >= 3 && got <= 5 ? PyBUF_WRITABLE : 0;
        const int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | writable;
        if (PyObject_GetBuffer(objs[got], &b[got], flags) < 0) goto done;
    }
    const char *why = invalid(b, n_bufs, lo, hi, tile);
    if (why) {
        PyErr_SetString(PyExc_ValueError, why);
        goto done;
    }
    const Py_ssize_t heads = b[0].shape[0] * b[0].shape[1], R = b[0].shape[2], d = b[0].shape[3];
    const Py_ssize_t nb = b[1].shape[2], S = b[2].shape[2];
    if (tile > S) tile = S > 0 ? S : 1;
    if (hi > lo && R > 0 && d > 0) {
        float *scratch = NULL;
        if (posix_memalign((void **)&scratch, 64, sizeof(float) * (size_t)SCRATCH_FLOATS(R, d))) {
            PyErr_NoMemory();
            goto done;
        }
        const int half = is_f16(&b[1]);
        const size_t es = half ? 2 : 4;
        const size_t k_head = (size_t)nb * (size_t)d * 16 * es, v_head = (size_t)S * (size_t)d * es;
        sweep_args a = {NULL, NULL, NULL, half, R, d, lo, hi, tile,
                        n_bufs == 7 ? (const Py_ssize_t *)b[6].buf : NULL,
                        NULL, NULL, NULL, scratch};
        sweep_fn *fn = path(R, half, NULL);
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t h = 0; h < heads; h++) {
            a.q = (const float *)b[0].buf + h * R * d;
            a.k = (const char *)b[1].buf + (size_t)h * k_head;
            a.v = (const char *)b[2].buf + (size_t)h * v_head;
            a.m = (float *)b[3].buf + h * R;
            a.l = (float *)b[4].buf + h * R;
            a.O = (float *)b[5].buf + h * R * d;
            fn(&a);
        }
        Py_END_ALLOW_THREADS
        free(scratch);
    }
    result = Py_None;
    Py_INCREF(result);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&b[i]);
    return result;
}

static PyObject *isa(PyObject *self, PyObject *args) {
    Py_ssize_t R = 0;
    int half = 0;
    const char *name;
    if (!PyArg_ParseTuple(args, "|np", &R, &half)) return NULL;
    path(R, half, &name);
    return PyUnicode_FromString(name);
}

static PyObject *scratch_bytes(PyObject *self, PyObject *args) {
    Py_ssize_t R, d;
    if (!PyArg_ParseTuple(args, "nn", &R, &d)) return NULL;
    return PyLong_FromSsize_t((Py_ssize_t)sizeof(float) * SCRATCH_FLOATS(R, d));
}

static PyMethodDef methods[] = {
    {"sweep", sweep, METH_VARARGS,
     "sweep(q, k, v, m, l, O, lo, hi, tile, row_hi): sweep tokens [lo, hi) of every KV "
     "head, updating the running partial (m, l, O); see the module's source"},
    {"isa", isa, METH_VARARGS,
     "isa(R=0, half=False): the instruction set (avx512, avx2 or generic) a sweep of R query "
     "rows per KV head runs on, float16 K and V where half; with R = 0 the best the CPU has"},
    {"scratch_bytes", scratch_bytes, METH_VARARGS,
     "scratch_bytes(R, d): the bytes of scratch one sweep of R query rows of d allocates"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fused",
                                    "The fused local attention kernel of gqa_mpi.", -1, methods};

PyMODINIT_FUNC PyInit__fused(void) {
    pick();
    return PyModule_Create(&module);
}
