/* gqa_mpi._fused: the fused local attention kernel (one pass over K and V), and the
 * streaming read the bench holds it to.
 *
 * sweep(q, k, v, m, l, O, lo, hi, tile, row_hi, wrap=0, heads=0)
 *   q    (B, H, R, d) float32, scores' scale already applied
 *   k    (B, H, nb, d, 16) float32 or float16: K in blocks of 16 tokens, transposed
 *   v    (B, H, S, d) same dtype as k, S <= 16 * nb
 *   m, l (B, H, R) float32 and O (B, H, R, d) float32: the running partial, updated
 *   lo, hi   tokens [lo, hi) of the slice to sweep; tiles start at lo
 *   tile     tokens per tile
 *   row_hi   None, or (R,) int64: row r sees slice tokens < row_hi[r] (causal mask)
 *   wrap     for timing only: with wrap > 0 (a multiple of SUB, lo = 0, wrap + SUB <= S)
 *            every block reads the K and V of the first `wrap` tokens of its head again
 *            and again, with no prefetch: what the loops cost with K and V in cache,
 *            the memory left out. The scores, the mask and the tiles are the sweep's.
 *   heads    KV heads swept at once (0: one), block by block in turn, each with its own
 *            tile partial: the same results, bit for bit, with 2 x heads streams of K and
 *            V for the memory. For timing: on a Zen 4, four heads took 0.87-0.92 of one
 *            head's time at float32 G = 1 and 2 with d = 128, and 1.01-1.16 at d = 64, 80,
 *            96 and 256 (bench paths and scratch builds, 2026-12-06), so the sweep keeps one.
 *
 * read(buffers, ahead=0, chunk=0, again=0): every byte of the buffers once (see its docstring).
 *
 * stream(buffer, fmas, wrap=0, ahead=0): the overlap probe (_stream.h): a float32 or
 *   float16 buffer streamed once with `fmas` FMAs per element, or with wrap > 0 its first
 *   `wrap` bytes again and again (the same work in cache).
 *
 * The arithmetic (_sweep.h) is compiled three times, one unit each (_sweep_avx512.c,
 * _sweep_avx2.c, _sweep_generic.c), and picked at import from what the CPU supports:
 * AVX-512, AVX2 with FMA and F16C, or portable C. No NumPy C API:
 * arrays arrive through the buffer protocol, so the build needs only a C compiler.
 */
#include "_fused.h"

/* How the sweep asks for lines ahead (_fused.h's ASK_*), set at import as auto_asking says
 * for this core, unless asking(name) pinned it (asking_as; ASK_AUTO: not). What each way
 * gained on which core: _sweep.h. */
int asking = ASK_NONE;
#define ASK_AUTO (-1)
static int asking_as = ASK_AUTO;

/* On a Zen 4 (AMD family 25 with AVX-512, which it runs as two halves of 256 bits) the
 * AVX2 loops sweep 1 and 2 rows of float16 and 4 rows of float32 per KV head in less
 * time than the AVX-512 ones. `bench paths` here (64K tokens at d = 128, 128K at d = 64,
 * h_kv = 8, 2026-12-06), AVX-512's time over AVX2's: float16 1 row 1.03-1.29, 2 rows
 * 0.95-1.09 (1.10-1.28 in earlier runs), 3 rows (2 + 1) 0.93-0.97; float32 4 rows
 * 1.13-1.19, 5 rows (4 + 1) 1.04-1.10, 1 row 0.88-1.02, 2 rows 0.90-1.08; 8 rows of
 * either and 4 of float16 0.69-0.90. The default path (not a pinned one) runs the three
 * row counts that are one group on the AVX2 loops; a mixed count (5 = 4 + 1) stays on
 * AVX-512, as float16's 3 = 2 + 1 shows the groups' gains need not add. Set by pick(). */
static int zen4_table = 0;

/* Whether a call of R rows per KV head is one the AVX2 loops sweep faster on a Zen 4. */
static int avx2_rows(Py_ssize_t R, int half) { return half ? R == 1 || R == 2 : R == 4; }

/* Bytes the overlap probe's buffers and wrap are a multiple of: eight vectors of float32
 * on the widest path. */
#define STREAM_GROUP 512

#define STR_(x) #x
#define STR(x) STR_(x)

/* Stream n bytes once with vectors of VB bytes, eight loads in flight and, with
 * ahead > 0, each line asked for `ahead` bytes before it is read (and, with again > 0,
 * asked for once more `again` bytes nearer, as the sweep does); the sum of their
 * 64-bit words keeps the loads from being optimised away. Compiled per instruction
 * set like the sweep: the read limit the bench holds the sweep to. */
#define READ_FN(NAME_, VB, TARGET)                                                      \
    TARGET static uint64_t NAME_(const char *p, size_t n, size_t ahead, size_t again) { \
        typedef uint64_t vu __attribute__((vector_size(VB)));                           \
        vu acc[8] = {{0}};                                                              \
        size_t i = 0;                                                                   \
        for (; i + 8 * VB <= n; i += 8 * VB) {                                          \
            if (ahead)                                                                  \
                for (size_t b = 0; b < 8 * VB; b += 64) {                               \
                    __builtin_prefetch(p + i + b + ahead, 0, HINT);                     \
                    if (again) __builtin_prefetch(p + i + b + ahead - again, 0, HINT);  \
                }                                                                       \
            for (int u = 0; u < 8; u++) {                                               \
                vu x;                                                                   \
                memcpy(&x, p + i + (size_t)u * VB, VB);                                 \
                acc[u] += x;                                                            \
            }                                                                           \
        }                                                                               \
        uint64_t out = 0;                                                               \
        for (int u = 1; u < 8; u++) acc[0] += acc[u];                                   \
        for (size_t w = 0; w < VB / 8; w++) out += acc[0][w];                          \
        for (; i + 8 <= n; i += 8) {                                                    \
            uint64_t w;                                                                 \
            memcpy(&w, p + i, 8);                                                       \
            out += w;                                                                   \
        }                                                                               \
        for (; i < n; i++) out += (unsigned char)p[i];                                  \
        return out;                                                                     \
    }
#ifdef GQA_X86
READ_FN(read_avx512, 64, __attribute__((target("avx512f"))))
READ_FN(read_avx2, 32, __attribute__((target("avx2"))))
#endif
READ_FN(read_generic, 16, )

typedef uint64_t (*read_fn)(const char *, size_t, size_t, size_t);

/* One instruction-set path: its name, its sweep, the read and the overlap probe on the
 * same instructions, and how its sweep asks for lines ahead. */
typedef struct {
    const char *name;
    sweep_fn sweep;
    read_fn read;
    stream_fn stream;
    asks_fn asks;
} path_t;

static const path_t GENERIC = {"generic", sweep_head_generic, read_generic, stream_generic,
                               asks_generic};
#ifdef GQA_X86
static const path_t AVX512 = {"avx512", sweep_head_avx512, read_avx512, stream_avx512,
                              asks_avx512};
static const path_t AVX2 = {"avx2", sweep_head_avx2, read_avx2, stream_avx2, asks_avx2};
#endif

/* The path pick() chose; with zen4_table, calls of avx2_rows run AVX2's sweep (plan). */
static const path_t *chosen = &GENERIC;

/* The path a call of R rows per KV head runs on now (see zen4_table). */
static const path_t *plan(Py_ssize_t R, int half) {
#ifdef GQA_X86
    if (zen4_table && avx2_rows(R, half)) return &AVX2;
#else
    (void)R, (void)half;
#endif
    return chosen;
}

/* The name isa() and use() give: the path's, or on a Zen 4 "avx512+avx2". */
static const char *chosen_name(void) { return zen4_table ? "avx512+avx2" : chosen->name; }

static int is_f32(const Py_buffer *b) { return b->itemsize == 4 && b->format && !strcmp(b->format, "f"); }
static int is_f16(const Py_buffer *b) { return b->itemsize == 2 && b->format && !strcmp(b->format, "e"); }
static int is_i64(const Py_buffer *b) {
    return b->itemsize == 8 && b->format && (!strcmp(b->format, "l") || !strcmp(b->format, "q"));
}

static PyObject *sweep(PyObject *self, PyObject *args) {
    PyObject *objs[7];
    Py_ssize_t lo, hi, tile, wrap = 0, heads_asked = 0;
    if (!PyArg_ParseTuple(args, "OOOOOOnnnO|nn", &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5], &lo, &hi, &tile, &objs[6], &wrap, &heads_asked))
        return NULL;
    Py_buffer b[7];
    int got = 0;
    PyObject *result = NULL;
    const int flags[7] = {PyBUF_C_CONTIGUOUS | PyBUF_FORMAT, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT,
                          PyBUF_C_CONTIGUOUS | PyBUF_FORMAT,
                          PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE,
                          PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE,
                          PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE,
                          PyBUF_C_CONTIGUOUS | PyBUF_FORMAT};
    const int n_bufs = objs[6] == Py_None ? 6 : 7;
    for (; got < n_bufs; got++)
        if (PyObject_GetBuffer(objs[got], &b[got], flags[got]) < 0) goto done;
    Py_buffer *q = &b[0], *k = &b[1], *v = &b[2], *m = &b[3], *l = &b[4], *O = &b[5];
#define REQUIRE(cond, msg) if (!(cond)) { PyErr_SetString(PyExc_ValueError, msg); goto done; }
    REQUIRE(q->ndim == 4 && k->ndim == 5 && v->ndim == 4 && m->ndim == 3 && l->ndim == 3
            && O->ndim == 4, "sweep: q, k, v, m, l, O must be 4-, 5-, 4-, 3-, 3-, 4-D");
    const Py_ssize_t B = q->shape[0], H = q->shape[1], R = q->shape[2], d = q->shape[3];
    const Py_ssize_t nb = k->shape[2], S = v->shape[2];
    REQUIRE(is_f32(q) && is_f32(m) && is_f32(l) && is_f32(O), "sweep: q, m, l, O must be float32");
    const int half = is_f16(k);
    REQUIRE((half && is_f16(v)) || (is_f32(k) && is_f32(v)),
            "sweep: k and v must both be float32 or both float16");
    REQUIRE(k->shape[0] == B && k->shape[1] == H && k->shape[3] == d && k->shape[4] == 16
            && v->shape[0] == B && v->shape[1] == H && v->shape[3] == d && S <= 16 * nb
            && m->shape[0] == B && m->shape[1] == H && m->shape[2] == R
            && l->shape[0] == B && l->shape[1] == H && l->shape[2] == R
            && O->shape[0] == B && O->shape[1] == H && O->shape[2] == R && O->shape[3] == d,
            "sweep: shapes do not agree");
    REQUIRE(0 <= lo && lo <= hi && hi <= S && tile >= 1 && S < INT32_MAX - 64,
            "sweep: need 0 <= lo <= hi <= S < 2**31 and tile >= 1");
    REQUIRE(wrap == 0 || (wrap > 0 && wrap % SUB == 0 && lo == 0 && wrap + SUB <= S),
            "sweep: wrap must be 0, or a multiple of " STR(SUB) " tokens with lo = 0 and wrap + "
            STR(SUB) " <= S");
    REQUIRE(heads_asked >= 0 && heads_asked <= 64, "sweep: heads must be 0 (one) to 64");
    const Py_ssize_t *row_hi = NULL;
    if (n_bufs == 7) {
        REQUIRE(b[6].ndim == 1 && b[6].shape[0] == R && is_i64(&b[6]), "sweep: row_hi must be (R,) int64");
        row_hi = (const Py_ssize_t *)b[6].buf;
    }
    if (tile > S) tile = S > 0 ? S : 1;
    if (hi > lo && R > 0 && d > 0) {
        const path_t *p = plan(R, half);
        const Py_ssize_t want = heads_asked ? heads_asked : 1;
        const int heads = B * H < want ? (int)(B * H) : (int)want;
        float *scratch = NULL;
        const size_t floats = (size_t)SCRATCH_FLOATS(R, d, heads);
        if (posix_memalign((void **)&scratch, 64, sizeof(float) * floats)) {
            PyErr_NoMemory();
            goto done;
        }
        const size_t es = half ? 2 : 4;
        const size_t kstride = (size_t)nb * d * 16 * es, vstride = (size_t)S * d * es;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t h = 0; h < B * H; h += heads) {
            const int nh = B * H - h < heads ? (int)(B * H - h) : heads;
            p->sweep((const float *)q->buf + h * R * d, (const char *)k->buf + (size_t)h * kstride,
                 (const char *)v->buf + (size_t)h * vstride, half, R, d, lo, hi, tile, row_hi,
                 (float *)m->buf + h * R, (float *)l->buf + h * R, (float *)O->buf + h * R * d,
                 scratch, wrap, nh, kstride, vstride);
        }
        Py_END_ALLOW_THREADS
        free(scratch);
    }
    result = Py_None;
    Py_INCREF(result);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&b[i]);
    return result;
#undef REQUIRE
}

/* read(buffers, ahead=0, chunk=0, again=0): see the method table. */
static PyObject *read_all(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"buffers", "ahead", "chunk", "again", NULL};
    PyObject *seq, *objs;
    Py_ssize_t ahead = 0, chunk = 0, again = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|nnn", names, &seq, &ahead, &chunk, &again))
        return NULL;
    if (ahead < 0 || chunk < 0 || again < 0) {
        PyErr_SetString(PyExc_ValueError, "read: ahead, chunk and again are numbers of bytes, at least 0");
        return NULL;
    }
    if (again > ahead) {
        PyErr_SetString(PyExc_ValueError, "read: again must be at most ahead");
        return NULL;
    }
    if (!(objs = PySequence_Fast(seq, "read: buffers must be a sequence of buffers"))) return NULL;
    enum { MAXB = 8 };
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(objs);
    Py_buffer b[MAXB];
    Py_ssize_t got = 0, longest = 0;
    PyObject *result = NULL;
    if (n > MAXB) {
        PyErr_SetString(PyExc_ValueError, "read: at most 8 buffers");
        goto done;
    }
    for (; got < n; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(objs, got), &b[got], PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        longest = b[got].len > longest ? b[got].len : longest;
    }
    const read_fn fn = chosen->read;
    uint64_t out = 0;
    Py_BEGIN_ALLOW_THREADS
    const Py_ssize_t step = chunk ? chunk : longest;   /* round robin over the buffers */
    for (Py_ssize_t at = 0; at < longest; at += step)
        for (Py_ssize_t i = 0; i < n; i++)
            if (at < b[i].len) {
                const Py_ssize_t len = b[i].len - at < step ? b[i].len - at : step;
                out += fn((const char *)b[i].buf + at, (size_t)len, (size_t)ahead, (size_t)again);
            }
    Py_END_ALLOW_THREADS
    result = PyLong_FromUnsignedLongLong(out);
done:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&b[i]);
    Py_DECREF(objs);
    return result;
}

/* stream(buffer, fmas, wrap=0, ahead=0): see the method table. */
static PyObject *stream(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"buffer", "fmas", "wrap", "ahead", NULL};
    PyObject *obj;
    int fmas;
    Py_ssize_t wrap = 0, ahead = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi|nn", names, &obj, &fmas, &wrap, &ahead))
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    PyObject *result = NULL;
    const char *why = !is_f32(&b) && !is_f16(&b) ? "stream: the buffer must be float32 or float16"
        : b.len % STREAM_GROUP ? "stream: the buffer's bytes must be a multiple of " STR(STREAM_GROUP)
        : wrap < 0 || wrap % STREAM_GROUP || wrap > b.len
            ? "stream: wrap must be 0 or a multiple of " STR(STREAM_GROUP) " up to the buffer's bytes"
        : ahead < 0 ? "stream: ahead is a number of bytes, at least 0"
        : fmas != 0 && fmas != 1 && fmas != 2 && fmas != 4 && fmas != 8 && fmas != 16
            ? "stream: fmas must be 0, 1, 2, 4, 8 or 16" : NULL;
    if (why) {
        PyErr_SetString(PyExc_ValueError, why);
        goto done;
    }
    const stream_fn fn = chosen->stream;
    volatile float one = 1.0f;   /* coefficients the compiler cannot fold */
    const float c0 = one + 1.0f / 1024, c1 = one + 2.0f / 1024;
    double out;
    Py_BEGIN_ALLOW_THREADS
    out = fn((const char *)b.buf, is_f16(&b), (size_t)b.len, (size_t)wrap, (size_t)ahead, fmas,
             c0, c1);
    Py_END_ALLOW_THREADS
    result = PyFloat_FromDouble(out);
done:
    PyBuffer_Release(&b);
    return result;
}

/* The CPU's family and model as the kernel's /proc/cpuinfo shows them (0 and 0 off x86). */
static void family_model(unsigned *family, unsigned *model) {
    *family = *model = 0;
#ifdef GQA_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    const unsigned base = (a >> 8) & 0xf;
    *family = base == 0xf ? base + ((a >> 20) & 0xff) : base;
    *model = (a >> 4) & 0xf;
    if (base == 0x6 || base == 0xf) *model |= ((a >> 16) & 0xf) << 4;
#endif
}

/* The asking this core takes by default: ASK_TWICE on AMD's cores, ASK_NONE32 on an Emerald
 * Rapids Xeon (Intel family 6, model 207), ASK_NONE on the others (measured on a Sapphire
 * Rapids, model 143). */
static int auto_asking(void) {
#ifdef GQA_X86
    __builtin_cpu_init();
    if (__builtin_cpu_is("amd")) return ASK_TWICE;
    unsigned family, model;
    family_model(&family, &model);
    if (__builtin_cpu_is("intel") && family == 6 && model == 207) return ASK_NONE32;
#endif
    return ASK_NONE;
}

/* Intel's cores take 8 rows at two vectors of tokens (_fused.h's wide8); AMD's at one. On a
 * Sapphire Rapids (instance O, 2026-12-07, a scratch build interleaved with the one vector of
 * the day, three processes) the loops alone took 0.88-0.89 of the time at float16 G = 8 and
 * 0.97-0.98 at float32 G = 8, from memory 0.96-0.98 at float16; on an Emerald Rapids
 * (instance S, three processes) from memory 0.97-0.99 at float16 G = 8, 0.99-1.02 at float32;
 * on a Zen 4 it cost 3-4% at float16 G = 8. Set at import; wide8(n) pins it, wide8(-1) sets
 * it back. */
int wide8 = 0;

static int auto_wide8(void) {
#ifdef GQA_X86
    __builtin_cpu_init();
    return __builtin_cpu_is("intel");
#else
    return 0;
#endif
}

static PyObject *wide8_method(PyObject *self, PyObject *args) {
    int n = 0, given = PyTuple_GET_SIZE(args) > 0;
    if (!PyArg_ParseTuple(args, "|i", &n)) return NULL;
    if (given && (n < -1 || n > 1)) {
        PyErr_Format(PyExc_ValueError, "wide8 takes 1, 0 or -1 (this core's default), not %d", n);
        return NULL;
    }
    if (given) wide8 = n == -1 ? auto_wide8() : n;
    return PyLong_FromLong(wide8);
}

/* Set `asking` as asking_as says, or by default as auto_asking. */
static void apply_asking(void) { asking = asking_as != ASK_AUTO ? asking_as : auto_asking(); }

/* Whether this is a Zen 4: AMD, family 25 (Zen 3 and 4), with AVX-512 (Zen 4 only). */
static int zen4(void) {
#ifdef GQA_X86
    unsigned family, model;
    family_model(&family, &model);
    return __builtin_cpu_is("amd") && __builtin_cpu_supports("avx512f") && family == 25;
#else
    return 0;
#endif
}

/* Point `chosen` at the best path the CPU runs, no better than `want` (NULL or "auto":
 * the best, and on a Zen 4 the AVX2 loops where they are faster: zen4_table). */
static int pick(const char *want) {
    const int autom = !want || !strcmp(want, "auto");
    const int rank = autom ? 3 : !strcmp(want, "avx512") ? 3 : !strcmp(want, "avx2") ? 2
                   : !strcmp(want, "generic") ? 1 : 0;
    if (!rank) return -1;
    zen4_table = 0;
    chosen = &GENERIC;
#ifdef GQA_X86
    __builtin_cpu_init();
    if (rank >= 3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) {
        chosen = &AVX512;
        zen4_table = autom && zen4();
    } else if (rank >= 2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
               && __builtin_cpu_supports("f16c")) {
        chosen = &AVX2;
    }
#endif
    return 0;
}

static PyObject *use(PyObject *self, PyObject *arg) {
    const char *want = PyUnicode_AsUTF8(arg);
    if (!want) return NULL;
    if (pick(want) < 0) {
        PyErr_Format(PyExc_ValueError, "unknown instruction set %R (auto, avx512, avx2, generic)", arg);
        return NULL;
    }
    return PyUnicode_FromString(chosen_name());
}

/* The names asking(name) takes besides "auto", in _fused.h's ASK_* order (the ways: there
 * and in the method table). */
static const char *const ASKING_NAMES[] = {"once", "twice", "none", "none32"};
#define N_ASKING ((int)(sizeof ASKING_NAMES / sizeof *ASKING_NAMES))

/* "auto, once, twice, ...": the names asking() and GQA_MPI_ASKING take, for their errors. */
static const char *asking_choices(void) {
    static char out[64] = "auto";
    if (!strchr(out, ','))
        for (int n = 0; n < N_ASKING; n++)
            snprintf(out + strlen(out), sizeof out - strlen(out), ", %s", ASKING_NAMES[n]);
    return out;
}

static int set_asking(const char *name) {
    int as = strcmp(name, "auto") ? -2 : ASK_AUTO;
    for (int n = 0; n < N_ASKING; n++)
        if (!strcmp(name, ASKING_NAMES[n])) as = n;
    if (as == -2) return -1;
    asking_as = as;
    apply_asking();
    return 0;
}

static PyObject *asking_method(PyObject *self, PyObject *args) {
    PyObject *arg = NULL;
    if (!PyArg_ParseTuple(args, "|U", &arg)) return NULL;
    if (arg) {
        const char *name = PyUnicode_AsUTF8(arg);
        if (!name) return NULL;
        if (set_asking(name) < 0) {
            PyErr_Format(PyExc_ValueError, "unknown asking %R (%s)", arg, asking_choices());
            return NULL;
        }
    }
    return PyUnicode_FromString(asking_as == ASK_AUTO ? "auto" : ASKING_NAMES[asking_as]);
}

static PyObject *asking_way(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(ASKING_NAMES[asking]);
}

static PyObject *scratch_bytes(PyObject *self, PyObject *args) {
    Py_ssize_t R, d, heads = 1;
    if (!PyArg_ParseTuple(args, "nn|n", &R, &d, &heads)) return NULL;
    return PyLong_FromSsize_t((Py_ssize_t)sizeof(float) * SCRATCH_FLOATS(R, d, heads));
}

static PyObject *isa(PyObject *self, PyObject *unused) { return PyUnicode_FromString(chosen_name()); }

/* runs(R, half): the loops a call of R rows per KV head runs on now. */
static PyObject *runs(PyObject *self, PyObject *args) {
    Py_ssize_t R;
    int half;
    if (!PyArg_ParseTuple(args, "np", &R, &half)) return NULL;
    return PyUnicode_FromString(plan(R, half)->name);
}

static PyObject *asks(PyObject *self, PyObject *args) {
    Py_ssize_t R;
    int half;
    if (!PyArg_ParseTuple(args, "np", &R, &half)) return NULL;
    if (R < 1) {
        PyErr_SetString(PyExc_ValueError, "asks: R must be at least 1");
        return NULL;
    }
    return PyLong_FromLong(plan(R, half)->asks((int)GROUP(R), half));
}

static PyMethodDef methods[] = {
    {"sweep", sweep, METH_VARARGS,
     "sweep(q, k, v, m, l, O, lo, hi, tile, row_hi, wrap=0, heads=0): see the module source"},
    {"use", use, METH_O, "use(name): run the best of avx512 > avx2 > generic that is at most name and that "
                         "this CPU supports; returns the one chosen. 'auto' (the default at "
                         "import) is the best, and on a Zen 4 'avx512+avx2': the AVX2 loops for "
                         "the row counts they sweep faster there (1 or 2 rows of float16 per KV "
                         "head, 4 of float32)"},
    {"read", (PyCFunction)(void (*)(void))read_all, METH_VARARGS | METH_KEYWORDS,
     "read(buffers, ahead=0, chunk=0, again=0): stream each C-contiguous buffer once, on the "
     "sweep's instruction set: one after the other, or with chunk > 0 in turns of `chunk` bytes "
     "each; with ahead > 0 each line is prefetched `ahead` bytes early, and with again > 0 "
     "(at most ahead) once more `again` bytes nearer, as the sweep does. Returns a checksum (the sum "
     "of each piece's 64-bit words) so that no read is optimised away. The bench's read limit "
     "is the fastest of such reads."},
    {"stream", (PyCFunction)(void (*)(void))stream, METH_VARARGS | METH_KEYWORDS,
     "stream(buffer, fmas, wrap=0, ahead=0): the overlap probe. Streams a C-contiguous float32 or "
     "float16 buffer (bytes a multiple of " STR(STREAM_GROUP) ") once in address order on the "
     "sweep's instruction set, widening each vector to float32 and doing `fmas` (0, 1, 2, 4, 8 "
     "or 16) FMAs per element, as a sweep of that many query rows does; with ahead > 0 each line "
     "is prefetched `ahead` bytes early; with wrap > 0 (a multiple of " STR(STREAM_GROUP) ") the "
     "same work reads the first `wrap` bytes again and again, in cache. Returns the sum of the "
     "accumulators: the elements' sum times the sum of the fmas coefficients, which alternate "
     "between 1 + 1/1024 and 1 + 2/1024 (1 where fmas = 0)."},
    {"scratch_bytes", scratch_bytes, METH_VARARGS,
     "scratch_bytes(R, d, heads=1): the bytes of scratch one sweep call of R rows of d per KV "
     "head allocates, sweeping `heads` heads at once"},
    {"isa", isa, METH_NOARGS, "isa(): the instruction set the sweep runs on (see use)"},
    {"runs", runs, METH_VARARGS,
     "runs(R, half): the loops (avx512, avx2 or generic) a sweep of R rows per KV head "
     "(float16 K and V where half is true) runs on now"},
    {"asking", asking_method, METH_VARARGS,
     "asking([name]): the asking pinned now, after pinning name if given: how the sweep "
     "asks for lines of K and V ahead, for benchmarks (the results do not change): 'auto' (the default at import) as this kind of core wants, "
     "'once' every line once (AMD's before 2026-12-07), 'twice' twice where few flops meet "
     "each byte (AMD's cores; Intel's before 2026-12-07), 'none' none where fewest do and "
     "twice where few do "
     "(Intel's but the Emerald Rapids, and any other core), 'none32' as none, but none only "
     "in float32's groups of fewest flops per byte (the Emerald Rapids)"},
    {"asking_way", asking_way, METH_NOARGS,
     "asking_way(): the way the sweep asks for lines ahead now: the pin, or what 'auto' "
     "chose for this core (once, twice, none or none32)"},
    {"wide8", wide8_method, METH_VARARGS,
     "wide8([n]): whether the AVX-512 sweep's groups of 8 rows take two vectors of tokens "
     "per step of the scores (1) or one (0), after pinning n if given (-1: this core's "
     "default, 1 on Intel's cores), for benchmarks and tests: the results do not change"},
    {"asks", asks, METH_VARARGS,
     "asks(R, half): how often a sweep of R rows per KV head (float16 K and V where half is "
     "true) asks for each line of K and V ahead of its loops now: 0 (the core's own "
     "prefetcher streams them), 1 or 2"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fused",
                                    "The fused local attention kernel of gqa_mpi.", -1, methods};

PyMODINIT_FUNC PyInit__fused(void) {
    /* Benchmarks may pin a slower path, and the asking; a value that is neither fails the
     * import with one line (gqa_mpi then says it runs the NumPy sweep, and why), so that
     * a typo is never timed as the pin it meant. */
    const char *want = getenv("GQA_MPI_ISA"), *as = getenv("GQA_MPI_ASKING");
    if (pick(want && *want ? want : NULL) < 0)
        return PyErr_Format(PyExc_ImportError, "GQA_MPI_ISA=%s is not one of auto, avx512, "
                            "avx2, generic", want);
    if (set_asking(as && *as ? as : "auto") < 0)
        return PyErr_Format(PyExc_ImportError, "GQA_MPI_ASKING=%s is not one of %s", as,
                            asking_choices());
    wide8 = auto_wide8();
    PyObject *mod = PyModule_Create(&module), *ways = PyTuple_New(N_ASKING);
    for (int n = 0; ways && n < N_ASKING; n++) {
        PyObject *name = PyUnicode_FromString(ASKING_NAMES[n]);
        if (!name) Py_CLEAR(ways);
        else PyTuple_SET_ITEM(ways, n, name);
    }
    if (!mod || !ways || PyModule_AddObject(mod, "ASKINGS", ways) < 0) {
        Py_XDECREF(ways);
        Py_XDECREF(mod);
        return NULL;
    }
    return mod;
}
