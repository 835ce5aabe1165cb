"""The kernel DSL's ``tl`` on NumPy (gqa_mpi.dsl.tl) against SPEC's table, call by call.

Kernels are written here, in a temporary file, so that faults can name their lines.
"""
import textwrap

import numpy as np
import pytest

from gqa_mpi.dsl.kernel_file import load
from gqa_mpi.dsl.tl import Backend, KernelFault, Tensor, run_kernel


def backend(q=None, k=None, v=None, o=None, link=None, source=None, pe=0, cube=0):
    q = np.zeros((1, 8), np.float16) if q is None else q
    k = np.zeros((4, 8), np.float16) if k is None else k
    v = np.zeros_like(k) if v is None else v
    o = np.zeros_like(q) if o is None else o
    return Backend(pe, cube, [("Q", q, 0, 0), ("K", k, k.shape[1] * 2, 0),
                              ("V", v, v.shape[1] * 2, 0), ("O", o, 0, 0)], link, source)


def kernel_file(tmp_path, body, name="k"):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return load(str(path))


def test_float16_ops_stay_float16_numbers_keep_the_dtype_mixed_promotes():
    tl = backend()
    a = tl.full((2, 3), 1.5, "f16")
    b = tl.full((2, 3), 0.25, "f32")
    assert (a + a).dtype == "f16" and (a * 2).dtype == "f16" and (2.0 - a).dtype == "f16"
    assert (a + b).dtype == "f32" and (b / a).dtype == "f32"
    assert (-a).dtype == "f16" and tl.exp(a).dtype == "f16"
    assert (a / 3).a[0, 0] == np.float16(np.float16(1.5) / np.float16(3))   # rounded once


def test_dot_and_sum_accumulate_in_float32_and_round_once():
    tl = backend()
    ones = tl.full((1, 4096), 1.0, "f16")
    col = tl.full((4096, 1), 1.0, "f16")
    # float16 accumulation would stall at 2048 (its spacing there is 2)
    assert tl.dot(ones, col).a[0, 0] == 4096 and tl.dot(ones, col).dtype == "f16"
    assert tl.sum(ones, axis=-1).a[0] == 4096 and tl.sum(ones).dtype == "f16"
    big = tl.full((1, 2), 40000.0, "f16")
    with np.errstate(over="ignore"):      # as run_kernel calls the kernel: the monitor reports it
        assert np.isinf(tl.sum(big).a[0])                    # 80000 > 65504 once rounded
    assert tl.count.nonfinite and tl.count.nonfinite[0][0] == "sum"
    assert tl.count.dot_flops == 2 * 2 * 4096


def test_row_broadcasting_uses_element_i_for_row_i_even_when_square():
    tl = backend()
    want = np.arange(3, dtype=np.float32)
    got = (tl.zeros((3, 3), "f32") + Tensor_of(tl, want)).a
    assert np.array_equal(got, np.repeat(want[:, None], 3, axis=1))      # row i: element i
    ratio = Tensor_of(tl, np.ones((3, 5), np.float32)) / Tensor_of(tl, want + 1)
    assert np.array_equal(ratio.a, np.ones((3, 5), np.float32) / (want[:, None] + 1))
    assert np.array_equal(tl.where(Tensor_of(tl, want) > 0, tl.zeros((3, 2), "f32"), 1.0).a,
                          [[1, 1], [0, 0], [0, 0]])


def Tensor_of(tl, a):
    from gqa_mpi.dsl.tl import Tensor
    return Tensor(np.asarray(a), tl)


def test_load_is_a_byte_conserving_reshape_not_a_transpose():
    k = np.arange(24, dtype=np.float16).reshape(3, 8)
    tl = backend(k=k)
    got = tl.load(tl.pointer("K"), (8, 3), "f16")
    assert np.array_equal(got.a, k.reshape(8, 3)) and not np.array_equal(got.a, k.T)
    row = tl.load(tl.pointer("K") + 2 * 8 * 2, (8,), "f16")          # third token
    assert np.array_equal(row.a, k[2])
    assert tl.count.loaded_bytes == 24 * 2 + 8 * 2
    assert tl.region("K").rows_read() == 3


def test_store_converts_to_the_stored_dtype_and_reads_back():
    tl = backend()
    x = tl.full((1, 8), 1 / 3, "f32")
    tl.store(tl.pointer("O"), x)
    assert tl.region("O").data.dtype == np.float16
    assert np.array_equal(tl.region("O").data, np.full((1, 8), 1 / 3, np.float16))


@pytest.mark.parametrize("call,where", [
    (lambda tl: tl.load(tl.pointer("K") + 60, (4,), "f16"), "runs past the end of K"),
    (lambda tl: tl.load(tl.pointer("V") - 2, (1,), "f16"), "outside every tensor"),
    (lambda tl: tl.store(tl.pointer("O") + 14, tl.zeros((2,), "f32")), "past the end of O"),
    (lambda tl: tl.load(tl.pointer("Q"), (2,), "f64"), "dtype must be"),
    (lambda tl: tl.dot(tl.zeros((2, 3)), tl.zeros((2, 3))), "needs (M, K) and (K, N)"),
    (lambda tl: tl.zeros((2, 3)) + tl.zeros((3, 2)), "do not broadcast"),
    (lambda tl: tl.copy_to(tl.zeros((2,)), tl.zeros((3,))), "copy_to of (3,) into (2,)"),
    (lambda tl: tl.reshape(tl.zeros((2, 3)), (4,)), "reshape of (2, 3)"),
    (lambda tl: tl.program_id(axis=2), "axis must be 0"),
    (lambda tl: tl.recv(dir="intra_E", shape=(2,)), "no links"),
])
def test_each_fault_names_its_call(call, where):
    with pytest.raises(KernelFault, match=None) as e:
        call(backend())
    assert where in e.value.message


def test_scratch_is_counted_per_scope_and_persistent_apart():
    tl = backend()
    keep = tl.zeros((256,), "f32")                                   # 1 KiB persistent
    for _ in range(5):
        with tl.scratch_scope():
            a = tl.zeros((1024,), "f32")                             # 4 KiB
            with tl.scratch_scope():
                tl.copy_to(keep, tl.zeros((256,), "f32") + 1)        # 2 x 1 KiB
            del a
    assert tl.count.persistent == 1024
    assert tl.count.scratch_peak == 4096 + 2 * 1024                  # not 5x that
    assert tl.monitor.live == 0 and np.all(keep.a == 1)


def test_every_listed_call_against_numpy():
    tl = backend()
    rng = np.random.default_rng(0)
    a32 = rng.standard_normal((3, 4)).astype(np.float32)
    a = Tensor_of(tl, a32)
    assert np.array_equal(tl.trans(a).a, a32.T)
    assert np.array_equal(a[1:3, 0:2].a, a32[1:3, 0:2])
    assert np.array_equal(tl.maximum(a, 0.0).a, np.maximum(a32, 0))
    assert np.array_equal(tl.minimum(a, 0.0).a, np.minimum(a32, 0))
    assert np.array_equal(tl.where(a > 0, a, 0.0).a, np.where(a32 > 0, a32, 0))
    assert np.array_equal((a == a).a, np.ones((3, 4), bool)) and (a < a).a.sum() == 0
    assert np.allclose(tl.log(tl.exp(a)).a, a32, atol=1e-6)
    assert np.array_equal(tl.max(a, axis=-1).a, a32.max(-1))
    assert np.array_equal(tl.cast(a, "f16").a, a32.astype(np.float16))
    assert np.array_equal(tl.full((2,), 7, "f16").a, np.full(2, 7, np.float16))
    b = tl.zeros((3, 4), "f16")
    tl.copy_to(b, a)
    assert b.dtype == "f16" and np.array_equal(b.a, a32.astype(np.float16))


class Pipe:
    """A link between two backends in one process."""

    def __init__(self):
        self.q = []

    def send(self, direction, a, line):
        self.q.append(a.tobytes())

    def recv(self, direction, nbytes, line, what):
        return self.q.pop(0)


def test_send_and_recv_carry_values_in_the_sender_dtype():
    pipe = Pipe()
    tl = backend(link=pipe)
    x = tl.full((2, 3), 0.1, "f32")
    tl.send(dir="intra_W", src=x)
    y = tl.recv(dir="intra_E", shape=(2, 3), dtype="f32")
    assert np.array_equal(y.a, x.a)
    assert tl.count.sent == {"intra_W": [1, 24]} and tl.count.received == {"intra_E": [1, 24]}


def test_a_fault_names_the_kernel_files_line(tmp_path):
    fn, path = kernel_file(tmp_path, """
        def bad_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            x = tl.load(q, shape=(T_q, h_q * d), dtype="f16")
            y = tl.load(k, shape=(S_kv + 1, h_kv * d), dtype="f16")
        """)
    tl = backend(source=path)
    with pytest.raises(KernelFault) as e:
        run_kernel(fn, tl, 1, 4, 1, 1, 8, 1, 1)
    assert e.value.line == 4 and e.value.call == "load"


def test_the_first_inf_is_recorded_with_its_call_and_line(tmp_path):
    fn, path = kernel_file(tmp_path, """
        def hot_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            x = tl.full((2,), 20.0, "f16")
            y = x * 2
            z = tl.exp(y)
            w = z + 1
        """)
    tl = backend(source=path)
    run_kernel(fn, tl, 1, 4, 1, 1, 8, 1, 1)
    assert tl.count.nonfinite == [("exp", 5, 2)]      # e^40 > 65504; z + 1 is not new


def test_kernel_files_are_loaded_by_name_or_by_the_kernel_suffix(tmp_path):
    fn, _ = kernel_file(tmp_path, "def helper(): pass\ndef mine_kernel(*a, tl): pass\n")
    assert fn.__name__ == "mine_kernel"
    path = tmp_path / "two.txt"                                   # any extension
    path.write_text("def a_kernel(*a, tl): pass\ndef b_kernel(*a, tl): pass\n")
    with pytest.raises(ValueError, match="several kernels"):
        load(str(path))
    assert load(f"{path}:b_kernel")[0].__name__ == "b_kernel"
    with pytest.raises(ValueError, match="no function 'c'"):
        load(f"{path}:c")
    with pytest.raises(ValueError, match="no such file"):
        load(str(tmp_path / "missing.py"))
    (tmp_path / "broken.py").write_text("def x(:\n")
    with pytest.raises(ValueError, match="syntax error"):
        load(str(tmp_path / "broken.py"))
    assert load("builtin:corrected")[0].__name__ == "gqa_decode_corrected_kernel"


def test_the_corrected_kernel_on_one_pe_matches_the_float64_reference():
    from whole_reference import attention_reference
    rng = np.random.default_rng(5)
    T_q, S, h_q, h_kv, d = 2, 2500, 8, 2, 16
    q, k, v = (rng.standard_normal(s).astype(np.float16)
               for s in ((T_q, h_q * d), (S, h_kv * d), (S, h_kv * d)))
    fn, path = load("builtin:corrected")
    tl = backend(q, k, v, source=path)
    run_kernel(fn, tl, T_q, S, h_q, h_kv, d, 1, 1)
    ref = attention_reference(q[None], k[None], v[None], h_kv=h_kv)[0]
    out = tl.region("O").data.astype(np.float64)
    assert np.abs(out - ref).max() / np.abs(ref).max() < 2e-3
    assert tl.count.scratch_peak < 1 << 20 and tl.region("K").rows_read() == S


class Holding:
    """A link whose message leaves late: it keeps the array it was given, as a
    non-blocking send holds its buffer until the receiver takes it."""

    def __init__(self):
        self.held = []

    def send(self, direction, a, line):
        self.held.append(a)

    def recv(self, direction, nbytes, line, what):
        return self.held.pop(0).tobytes()


def test_a_send_carries_the_values_at_the_call_not_later_writes():
    tl = backend(link=Holding())
    x = tl.full((32768,), 1.0, "f16")                     # 64 KiB
    tl.send(dir="intra_W", src=x)
    tl.copy_to(x, tl.zeros((32768,), "f16"))              # written after the send
    got = tl.recv(dir="intra_E", shape=(32768,), dtype="f16")
    assert np.all(got.a == 1)


def test_where_takes_the_row_broadcast_rule_for_its_values_too():
    tl = backend()
    s = Tensor_of(tl, np.arange(15, dtype=np.float32).reshape(3, 5))
    m = Tensor_of(tl, np.array([2.0, 7.0, 12.0], np.float32))
    got = tl.where(s < m, m, s).a                            # (3, 5) and (3,): no fault
    assert np.array_equal(got, np.where(s.a < m.a[:, None], m.a[:, None], s.a))
    sq = Tensor_of(tl, np.zeros((4, 4), np.float32))
    r = Tensor_of(tl, np.arange(4, dtype=np.float32))
    assert np.array_equal(tl.where(sq < 1, r, sq).a, np.repeat(r.a[:, None], 4, axis=1))


def test_a_scratch_tensor_used_after_its_scope_is_a_fault_naming_both_lines(tmp_path):
    fn, path = kernel_file(tmp_path, """
        def late_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            keep = tl.zeros((4,), "f32")
            with tl.scratch_scope():
                tmp = tl.zeros((4,), "f32") + 1
            tl.copy_to(keep, tmp)
        """)
    tl = backend(source=path)
    with pytest.raises(KernelFault) as e:
        run_kernel(fn, tl, 1, 4, 1, 1, 8, 1, 1)
    assert e.value.line == 6 and e.value.call == "copy_to"
    assert "scratch_scope at line 4, which has ended" in e.value.message


@pytest.mark.parametrize("body,call,line", [
    ("x = tl.load(k, shape=(S_kv / 2, h_kv * d), dtype='f16')", "load", 3),
    ("x = tl.cast(tl.zeros((2,)), 'f64')", "cast", 3),
    ("x = 1 if tl.zeros((2,)) else 0", "bool", 3),
    ("x = [a for a in tl.zeros((2,))]", "iter", 3),
    ("import numpy\n            x = numpy.exp(tl.zeros((2,)))", "array", 4),
    ("tl.helper = 1", "setattr", 3),
    ("x = tl.full((2,), 'hot', 'f32')", "full", 3),
])
def test_every_fault_of_a_kernel_names_its_call_and_its_line(tmp_path, body, call, line):
    fn, path = kernel_file(tmp_path, f"""
        def bad_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            {body}
        """)
    with pytest.raises(KernelFault) as e:
        run_kernel(fn, backend(source=path), 1, 4, 1, 1, 8, 1, 1)
    assert (e.value.call, e.value.line) == (call, line), e.value.message


def test_a_zero_length_load_at_the_end_of_a_tensor_is_no_fault_and_full_is_no_origin():
    tl = backend()
    end = tl.pointer("K") + tl.region("K").size
    assert tl.load(end, (0,), "f16").shape == (0,)
    tl.full((4,), float("-inf"), "f32")                  # a deliberate initialiser
    assert tl.count.nonfinite == []


def test_a_kernel_file_that_uses_calls_tl_lacks_is_refused_listing_them_all(tmp_path):
    """Every tl.NAME the backend lacks, each with its first line, in one line; a name in
    a comment or a string is no call."""
    from gqa_mpi.dsl import kernel_file as kf
    path = str(tmp_path / "miss.py")
    open(path, "w").write(textwrap.dedent("""
        # tl.in_a_comment is not a call
        def miss_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            s = "tl.in_a_string"
            x = tl.make_block_ptr(k)
            y = tl.atomic_add(x, 1)
            z = tl.make_block_ptr(q)
            return tl.exp(tl.load(k, (1,), "f16"))
        """))
    assert kf.missing_calls(path) == [("make_block_ptr", 5), ("atomic_add", 6)]
    with pytest.raises(ValueError) as e:
        kf.load(path)
    assert str(e.value) == (f"kernel {path} uses calls gqa_mpi's tl does not have: "
                            f"tl.make_block_ptr (line 5), tl.atomic_add (line 6)")
    assert kf.missing_calls(kf.resolve("builtin:corrected")[0]) == []


def test_a_call_tl_lacks_reached_another_way_is_a_fault_not_an_attribute_error(tmp_path):
    src = str(tmp_path / "dyn.py")
    open(src, "w").write(textwrap.dedent("""
        def k(tl):
            return getattr(tl, "no" + "such")
        """))
    ns = {}
    exec(compile(open(src).read(), src, "exec"), ns)
    tl = backend(source=src)
    with pytest.raises(KernelFault) as e:
        ns["k"](tl)
    assert e.value.call == "nosuch" and "gqa_mpi's tl has no such call" in e.value.message
    assert e.value.line == 3
    with pytest.raises(AttributeError):      # Python's own protocols still see none
        tl.__deepcopy__


def test_the_debugging_calls_show_values_and_fault_on_their_line(tmp_path, capsys):
    """print(x) and repr(x) show the values; tl.device_print keeps the PE's lines in
    program order; tl.static_print prints once (cube 0's PE 0); a false static_assert
    or device_assert is a fault naming its line; none of them costs anything."""
    src = str(tmp_path / "dbg.py")
    open(src, "w").write(textwrap.dedent("""
        def k(tl):
            x = tl.full((3,), 1.5, "f32")
            tl.device_print("x:", x, 7)
            tl.device_print("again")
            tl.static_print("once")
            tl.static_assert(1 + 1 == 2, "arithmetic")
            tl.device_assert(x > 0.0, "positive")
            return x

        def bad_static(tl):
            tl.static_assert(False, "the grid")

        def bad_device(tl):
            tl.device_assert(tl.full((4,), -1.0, "f32") > 0.0, "positive")
        """))
    ns = {}
    exec(compile(open(src).read(), src, "exec"), ns)
    tl = backend(source=src)
    x = ns["k"](tl)
    assert repr(x) == str(x) == "Tensor(shape=(3,), dtype=f32, values=[1.5, 1.5, 1.5])"
    assert tl.monitor.printed == ["x: [1.5, 1.5, 1.5] 7", "again"]
    assert capsys.readouterr().out == "once\n"
    backend(pe=1, source=src).static_print("not from PE 1")
    assert capsys.readouterr().out == ""
    with pytest.raises(KernelFault) as e:
        ns["bad_static"](backend(source=src))
    assert (e.value.call, e.value.line) == ("static_assert", 12)
    assert e.value.message == "static_assert failed: the grid"
    with pytest.raises(KernelFault) as e:
        ns["bad_device"](backend(source=src))
    assert (e.value.call, e.value.line) == ("device_assert", 15)
    assert "device_assert failed on 4 of 4 element(s): positive" in e.value.message


UNARY = {"exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sqrt": np.sqrt,
         "rsqrt": lambda a: 1 / np.sqrt(a), "abs": np.abs, "floor": np.floor,
         "ceil": np.ceil, "sin": np.sin, "cos": np.cos,
         "sigmoid": lambda a: 1 / (1 + np.exp(-a)),
         "erf": np.vectorize(__import__("math").erf)}


@pytest.mark.parametrize("dtype", ["f16", "f32"])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_each_elementwise_call_is_numpys_in_the_operands_dtype_at_a_vector_cost(name, dtype):
    """Triton's meaning, computed in float64 here and compared at the dtype's rounding;
    the result keeps the dtype; the call is recorded as vector work of its result."""
    np_dt = np.float16 if dtype == "f16" else np.float32
    a = np.linspace(0.25, 3.0, 24).reshape(4, 6).astype(np_dt)
    tl = Backend(0, 0, [("K", np.zeros((4, 8), np.float16), 16, 0)], record=True)
    x = Tensor(a, tl)
    out = getattr(tl, name)(x)
    want = UNARY[name](a.astype(np.float64))
    assert out.dtype == dtype and out.shape == (4, 6)
    tol = 2e-3 if dtype == "f16" else 2e-6
    assert np.allclose(out.a.astype(np.float64), want, rtol=tol, atol=tol)
    assert tl.monitor.calls[-1][:3] == (name, "vec", 24) and tl.monitor.calls[-1][5] == dtype


def test_the_wider_vocabulary_keeps_triton_s_meanings_and_costs():
    tl = Backend(0, 0, [("K", np.zeros((4, 8), np.float16), 16, 0)], record=True)
    object.__setattr__(tl, "_programs", (8, 2))
    assert (tl.num_programs(0), tl.num_programs(axis=1)) == (8, 2)
    assert tl.constexpr(64) == 64 and list(tl.static_range(2, 6, 2)) == [2, 4]
    assert tl.zeros((2,), tl.float16).dtype == "f16" and tl.full((1,), 1, tl.float32).dtype == "f32"
    assert list(tl.range(3)) == [0, 1, 2] and tl.cdiv(10, 4) == 3
    i = tl.arange(0, 6)
    assert i.dtype == "i32" and list(i.a) == list(range(6))
    assert tl.full((2,), 3, tl.int32).dtype == "i32" and (i < 3).dtype == "i1"
    assert (i + tl.full((6,), 0.5, "f16")).dtype == "f16"     # an int with a float: the float's
    assert tl.dot(tl.full((2, 3), 1.0, "f16"), tl.full((3, 2), 1.0, "f16"),
                  out_dtype="f32").dtype == "f32"
    assert tl.argmax(tl.full((2, 3), 1.0, "f32"), keep_dims=True).shape == (2, 1)
    pair = tl.join(tl.full((3,), 1.0, "f32"), tl.full((3,), 2.0, "f32"))
    assert pair.shape == (3, 2) and [p.a.tolist() for p in tl.split(pair)] == [[1.0] * 3,
                                                                               [2.0] * 3]
    # integer // and % truncate toward zero, as Triton's do
    m = tl.arange(-3, 4)
    assert list((m // 2).a) == [-1, -1, 0, 0, 0, 1, 1]
    assert list((m % 2).a) == [-1, 0, -1, 0, 1, 0, 1]
    x = tl.full((2, 3), 2.0, "f16")
    assert (x ** 2).dtype == "f16" and float(np.asarray((x ** 2).a).max()) == 4.0
    assert tl.fma(x, x, 1.0).a.max() == 5.0 and tl.clamp(x, 0.0, 1.5).a.max() == 1.5
    assert tl.zeros_like(x).dtype == "f16" and tl.full_like(x, 7.0).a[1, 2] == 7.0
    assert x.to("f32").dtype == "f32" and x.T.shape == (3, 2)
    assert tl.expand_dims(tl.arange(0, 3), 0).shape == (1, 3) and x[:, None].shape == (2, 1, 3)
    assert tl.view(x, (3, 2)).shape == (3, 2) and tl.ravel(x).shape == (6,)
    assert tl.permute(tl.zeros((2, 3, 4), "f32"), (2, 0, 1)).shape == (4, 2, 3)
    assert tl.broadcast_to(tl.zeros((1, 3), "f32"), (4, 3)).shape == (4, 3)
    s = Tensor(np.array([[1.0, 3.0, 2.0], [0.0, -1.0, 5.0]], np.float32), tl)
    assert list(tl.argmax(s).a) == [1, 2] and list(tl.argmin(s, axis=-1).a) == [0, 1]
    assert tl.sum(s, axis=None).a == 10.0 and tl.max(s, keep_dims=True).shape == (2, 1)
    assert np.allclose(tl.cumsum(s).a, np.cumsum(s.a, axis=-1))
    sm = tl.softmax(s).a
    want = np.exp(s.a - s.a.max(-1, keepdims=True))
    assert np.allclose(sm, want / want.sum(-1, keepdims=True), rtol=1e-6)
    b = tl.arange(0, 4) < 2
    assert list((b & ~b).a) == [False] * 4 and list((b | ~b).a) == [True] * 4
    # costs: views are free, reductions by their operand, the rest by their result
    kinds = {c[0]: c[2] for c in tl.monitor.calls}
    assert "view" not in kinds and "ravel" not in kinds and "expand_dims" not in kinds
    assert kinds["argmax"] == 6 and kinds["softmax"] == 6 and kinds["permute"] == 24


def test_masked_and_gathered_loads_and_stores_touch_only_what_the_mask_lets_through():
    """Where the mask is false nothing is read or written and no bound is checked; a load
    gives ``other`` there; an int tensor of byte addresses gathers or scatters one
    element each; the cost is the bytes of the elements let through."""
    k = np.arange(32, dtype=np.float16).reshape(4, 8)
    tl = Backend(0, 0, [("K", k, 16, 0), ("O", np.zeros((1, 8), np.float16), 0, 0)],
                 record=True)
    K = tl.pointer("K")
    i = tl.arange(0, 40)
    x = tl.load(K, shape=(40,), dtype="f16", mask=i < 32, other=-1.0)   # 8 past the end
    assert list(x.a[:3]) == [0, 1, 2] and list(x.a[30:34]) == [30, 31, -1, -1]
    assert tl.monitor.calls[-1][:3] == ("load", "mem", 64)
    rows = tl.load(K + (i[:4] * 8 + 2) * 2)                 # a gather: K[r, 2] of rows 0..3
    assert list(rows.a) == [2, 10, 18, 26] and rows.shape == (4,)
    assert tl.region("K").rows_read() == 4
    O = tl.pointer("O")
    tl.store(O, tl.full((8,), 5.0, "f32"), mask=tl.arange(0, 8) % 2 == 0)
    assert list(tl.region("O").data[0]) == [5, 0, 5, 0, 5, 0, 5, 0]
    tl.store(O + tl.arange(0, 2) * 2, tl.full((2,), 9.0, "f32"))          # a scatter
    assert list(tl.region("O").data[0][:3]) == [9, 9, 5]
    assert tl.monitor.calls[-1][:3] == ("store", "mem", 4)
    with pytest.raises(KernelFault, match="runs past the end of K"):
        tl.load(K, shape=(40,), dtype="f16", mask=i < 33)
    with pytest.raises(KernelFault, match="not on an element of 2 bytes"):
        tl.load(K + i[:2] * 2 + 1)
    with pytest.raises(KernelFault, match="does not broadcast"):
        tl.load(K, shape=(4, 8), mask=tl.arange(0, 3) < 2)


def test_tritons_keyword_arguments_of_dot_reductions_loads_and_stores():
    """``tl.dot(a, b, acc)``: the product plus ``acc`` in float32, rounded once to acc's
    dtype, at the product's cost; ``sum(dtype=)``; ``max/min(return_indices=True)``;
    the cache hints taken, the block-pointer arguments a fault; ``tl.range``'s hints;
    ``cast``'s ``bitcast`` and its rounding. Against NumPy in float64."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 5)), rng.standard_normal((5, 4))
    c = rng.standard_normal((3, 4))
    k = np.arange(32, dtype=np.float16).reshape(4, 8)
    tl = Backend(0, 0, [("K", k, 16, 0), ("O", np.zeros((1, 8), np.float16), 0, 0)],
                 record=True)
    A, B = (Tensor_of(tl, x.astype(np.float16)) for x in (a, b))
    acc = Tensor_of(tl, c.astype(np.float32))
    got = tl.dot(A, B, acc)
    want = (a.astype(np.float16).astype(np.float64) @ b.astype(np.float16).astype(np.float64)
            + c.astype(np.float32))
    assert got.dtype == "f32" and np.allclose(got.a, want, rtol=1e-6, atol=1e-6)
    assert tl.monitor.calls[-1][:3] == ("dot", "dot", 2 * 3 * 5 * 4)
    assert tl.dot(A, B, acc=acc, input_precision="ieee", out_dtype="f32").dtype == "f32"
    with pytest.raises(KernelFault, match="acc is f32 but out_dtype is f16"):
        tl.dot(A, B, acc, out_dtype="f16")
    with pytest.raises(KernelFault, match=r"acc is \(4, 3\)"):
        tl.dot(A, B, Tensor_of(tl, np.zeros((4, 3), np.float32)))
    x = Tensor_of(tl, np.array([[1.0, 7.0, 7.0], [4.0, -2.0, 0.5]], np.float16))
    assert tl.sum(x, axis=1, dtype="f32").dtype == "f32"
    values, where = tl.max(x, axis=1, return_indices=True)
    assert list(values.a) == [7.0, 4.0] and list(where.a) == [1, 0]     # first on a tie
    values, where = tl.min(x, 1, True)
    assert list(values.a) == [1.0, -2.0] and list(where.a) == [0, 1]
    K, O = tl.pointer("K"), tl.pointer("O")
    got = tl.load(K, shape=(8,), dtype="f16", cache_modifier=".cg",
                  eviction_policy="evict_last", volatile=True)
    assert list(got.a) == list(range(8))
    tl.store(O, got, eviction_policy="evict_first", cache_modifier=".wb")
    assert list(tl.region("O").data[0]) == list(range(8))
    with pytest.raises(KernelFault, match="block pointers"):
        tl.load(K, shape=(8,), boundary_check=(0,), padding_option="zero")
    with pytest.raises(KernelFault, match="block pointers"):
        tl.store(O, got, boundary_check=(0,))
    assert list(tl.range(0, 10, 4, num_stages=3)) == [0, 4, 8]
    assert list(tl.static_range(3, loop_unroll_factor=2)) == [0, 1, 2]
    ones = tl.full((2,), 1.0, "f32")
    assert list(ones.to(tl.int32, bitcast=True).a) == [0x3F800000] * 2
    assert ones.to("f16", fp_downcast_rounding="rtne").dtype == "f16"
    with pytest.raises(KernelFault, match="only 'rtne'"):
        ones.to("f16", fp_downcast_rounding="rtz")
    with pytest.raises(KernelFault, match="the widths differ"):
        tl.cast(ones, "f16", bitcast=True)


@pytest.mark.parametrize("name,dtype", [("bf16", "bfloat16"), ("fp8e4m3", "float8_e4m3fn"),
                                        ("fp8e5m2", "float8_e5m2")])
def test_narrow_memory_loads_as_its_pointer_says_and_computes_in_float32_rounded_once(name,
                                                                                     dtype):
    import ml_dtypes
    dt = np.dtype(getattr(ml_dtypes, dtype))
    rng = np.random.default_rng(3)
    k32 = rng.standard_normal((4, 8)).astype(np.float32)
    k = k32.astype(dt)
    tl = backend(k=k, v=k)
    k_ptr = tl.pointer("K")
    assert k_ptr.dtype.element_ty == name and k_ptr.dtype.element_ty.primitive_bitwidth == \
        8 * dt.itemsize
    assert tl.pointer("Q").dtype.element_ty == "f16"
    row = 8 * dt.itemsize
    x = tl.load(k_ptr + row, shape=(2, 8))              # the memory's dtype, unless told
    assert x.dtype == name and np.array_equal(x.a.astype(np.float32), k[1:3].astype(np.float32))
    y = tl.load(k_ptr, shape=(4, 8), dtype=getattr(tl, {"bf16": "bfloat16", "fp8e4m3":
                                                         "float8e4nv", "fp8e5m2": "float8e5"}[name]))
    a, b = y.a.astype(np.float32), y.a[::-1].astype(np.float32)
    want = {"+": a + b, "*": a * b, "/": a / b, "exp": np.exp(a)}
    flipped = Tensor_of(tl, y.a[::-1].copy())
    for op, out in (("+", y + flipped), ("*", y * flipped), ("/", y / flipped),
                    ("exp", tl.exp(y))):
        assert out.dtype == name
        assert np.array_equal(out.a.astype(np.float32), want[op].astype(dt).astype(np.float32),
                              equal_nan=True), op
    assert (y + tl.zeros((4, 8), "f32")).dtype == "f32"             # NumPy's promotion
    s = tl.sum(tl.cast(y, "f32"), axis=-1)
    assert np.allclose(s.a, a.sum(axis=-1), rtol=1e-6)
    tl.store(tl.pointer("K"), tl.full((8,), 3.3, "f32"))             # rounded to memory's
    assert tl.region("K").data[0, 0] == np.float32(3.3).astype(dt)


def test_the_scratch_high_water_mark_names_its_largest_tensors_and_their_lines(tmp_path):
    fn, path = kernel_file(tmp_path, """
        def scratch_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            for i in range(3):
                with tl.scratch_scope():
                    a = tl.zeros((64, 8), "f32")
                    b = tl.zeros((16,), "f16")
                    c = tl.cast(a, "f16")
            with tl.scratch_scope():
                small = tl.zeros((4,), "f32")
        """)
    tl = backend(source=path)
    run_kernel(fn, tl, 1, 4, 1, 1, 8, 1, 1)
    assert tl.count.scratch_peak == 64 * 8 * 4 + 32 + 64 * 8 * 2
    assert tl.count.scratch_top == [(2048, 5, "(64, 8) f32"), (1024, 7, "(64, 8) f16"),
                                    (32, 6, "(16,) f16")]


def test_the_every_call_kernel_calls_every_name_of_the_vocabulary():
    import os
    import re
    from gqa_mpi.dsl.tl import CALLS
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "every_call.py")
    with open(path) as f:
        used = set(re.findall(r"\btl\.(\w+)", f.read()))
    assert CALLS <= used, sorted(CALLS - used)


def test_a_triton_files_top_runs_as_written_against_stand_ins(tmp_path):
    import sys
    before = {name: sys.modules.get(name) for name in ("triton", "triton.language")}
    fn, path = kernel_file(tmp_path, """
        import triton
        import triton.language as tl

        SCALE: tl.constexpr = 2.0


        @triton.jit(do_not_specialize=["T_q"])
        def _twice(x, *, tl):
            return x * SCALE


        @triton.jit
        def top_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl,
                       BLOCK: tl.constexpr = 4, DT: tl.constexpr = tl.float32):
            x = tl.full((BLOCK,), 1.0, DT)
            tl.store(o, _twice(x, tl=tl))
        """)
    assert {name: sys.modules.get(name) for name in before} == before   # put back
    tl = backend(source=path)
    run_kernel(fn, tl, 1, 4, 1, 1, 8, 1, 1)
    assert list(tl.region("O").data[0, :4]) == [2.0] * 4
