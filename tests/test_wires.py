"""Wires (what a hop carries and loses) and the check's pass rule (no MPI)."""
import numpy as np
import pytest

from gqa_mpi.check.judge import CONTROL_FACTOR, compare, tolerance
from gqa_mpi.config.config import Config
from gqa_mpi.config.modes import SOURCE_TOLERANCE, Emulated
from gqa_mpi.step.attention import Partial, empty_partial
from gqa_mpi.step.wires import WIRES, pack, unpack


def partial(m, l, O):
    return Partial(*(np.asarray(x, dtype=np.float32) for x in (m, l, O)))


@pytest.mark.parametrize("name", ["fp32", "packed", "kernel"])
def test_every_wire_round_trips_a_representable_partial(name):
    wire = WIRES.get(name)
    p = partial([[[0.5, -np.inf]]], [[[3.0, 0.0]]], [[[[1.0, -2.0], [0.0, 0.0]]]])
    bufs, loss = wire.encode(p)
    assert loss.overflow == 0 and loss.m_rounding == 0.0
    back = wire.decode([(n, b.copy()) for n, b in bufs], p)
    for a, b in zip(back, p):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == np.float32
    assert [n for n, _ in wire.buffers(p)] == [n for n, _ in bufs]
    assert [b.shape for _, b in wire.buffers(p)] == [b.shape for _, b in bufs]


def test_kernel_wire_counts_overflow_and_m_rounding():
    wire = WIRES.get("kernel")
    p = partial([[[1.0001, 2.0]]], [[[70000.0, 1.0]]], [[[[1e5, 1.0], [-1e6, 2.0]]]])
    _, loss = wire.encode(p)
    assert loss.overflow == 3                      # l = 70000, O = 1e5 and -1e6
    assert loss.m_rounding == pytest.approx(1e-4, abs=5e-4)
    assert (loss + loss).overflow == 6 and (loss + loss).m_rounding == loss.m_rounding
    _, none = wire.encode(partial([[[np.inf]]], [[[np.inf]]], [[[[1.0]]]]))
    assert none.overflow == 0                      # already inf: not the wire's doing
    assert wire.lossy and not WIRES.get("fp32").lossy and not WIRES.get("packed").lossy


def test_packed_is_one_buffer_and_unpack_is_a_view():
    p = empty_partial(2, 3, 4, 5)
    flat = pack(p)
    assert flat.shape == (2 * 3 * 4 * (5 + 2),) and flat.dtype == np.float32
    back = unpack(flat, p)
    assert np.shares_memory(back.O, flat) and back.O.shape == p.O.shape


def test_tolerance_adds_twice_the_m_rounding_to_the_wires_floor():
    assert Emulated.tolerance(WIRES.get("fp32"), 0.0) == 1e-4
    assert Emulated.tolerance(WIRES.get("kernel"), 0.01) == pytest.approx(1e-2 + 0.02)
    assert tolerance(Config(), 0.0) == 1e-4
    assert tolerance(Config(kernel_source="k.py"), 0.5) == SOURCE_TOLERANCE   # its own rule


def test_compare_normwise_with_the_float32_control():
    ref = np.array([[1.0, -2.0, 0.0]])
    out = ref + np.array([[0.0, 2e-4, 0.0]])
    c = compare(out, ref, 1e-4)
    assert c.max_abs_err == pytest.approx(2e-4) and c.max_rel_err == pytest.approx(1e-4)
    assert c.passed and c.control_rel_err is None and c.tolerance == 1e-4
    control = ref + np.array([[0.0, 0.0, 1e-4]])       # float32 itself is off by 5e-5
    c = compare(out + np.array([[3e-4, 0, 0]]), ref, 1e-4, control)
    assert c.control_rel_err == pytest.approx(5e-5)
    assert c.tolerance == pytest.approx(1e-4 + CONTROL_FACTOR * 5e-5)
    assert c.passed                                   # 2.5e-4 is within 3e-4
    assert not compare(out * 2, ref, 1e-4, control).passed


def test_compare_never_passes_nan_or_inf():
    ref = np.ones((2, 2))
    for bad in (np.nan, np.inf):
        out = ref.copy()
        out[0, 1] = bad
        c = compare(out, ref, 1.0)
        assert not c.passed and not c.finite and c.nonfinite == 1
    assert not compare(ref, ref * np.nan, 1.0).passed


def test_bf16_rounds_to_nearest_even_and_keeps_the_range():
    from gqa_mpi.step.wires import from_bf16, to_bf16
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5, 3e38, 1e-40, 0.0],
                 dtype=np.float32)
    back = from_bf16(to_bf16(x))
    assert back.tolist()[:4] == [1.0, 1.0, 1 + 2 ** -6, -2.5]       # ties go to even
    assert np.isinf(from_bf16(to_bf16(np.array([3.4e38], np.float32))))[0]
    assert back[4] == pytest.approx(3e38, rel=2 ** -8) and back[6] == 0.0
    assert np.isnan(from_bf16(to_bf16(np.array([np.nan], np.float32))))[0]
    rng = np.random.default_rng(0)
    y = (rng.uniform(0.5, 2, 10000) * 10.0 ** rng.integers(-30, 30, 10000)).astype(np.float32)
    rel = np.abs(from_bf16(to_bf16(y)).astype(np.float64) / y - 1)
    assert rel.max() <= 2 ** -8                         # 8 significant bits


@pytest.mark.parametrize("name,formats", [("bf16", ("float32", "float32", "bfloat16")),
                                          ("fp16", ("float32", "float32", "float16")),
                                          ("fp16-stats", ("float16",) * 3)])
def test_narrow_wires_round_only_what_they_say(name, formats):
    wire = WIRES.get(name)
    assert wire.formats == formats and wire.lossy
    p = partial([[[1.2345678]]], [[[70000.123]]], [[[[1.2345678, 1e5]]]])
    bufs, loss = wire.encode(p)
    back = wire.decode([(n, b.copy()) for n, b in bufs], p)
    for got, sent, fmt in zip(back, p, formats):
        if fmt == "float32":
            np.testing.assert_array_equal(got, sent)
        else:
            assert not np.array_equal(got, sent)
    assert loss.overflow == (2 if name == "fp16-stats" else 1 if name == "fp16" else 0)
    assert (loss.m_rounding > 0) == (name == "fp16-stats")
    assert WIRES.get("fp16-stats").name == "kernel" and "fp16-stats" in WIRES
    assert "fp16-stats" not in WIRES.names() and "fp16-stats" in WIRES.names(aliases=True)
