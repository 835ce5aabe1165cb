"""The library API, ``gqa_mpi.decode``, and the docs' examples of it."""
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from gqa_mpi.step.grid import Grid
from gqa_mpi.step.schedules import SCHEDULES
from whole_reference import attention_reference
from gqa_mpi.tools.launcher import mpirun_command
from util import run_bounded, unregister

DOCS = pathlib.Path(__file__).parent.parent / "docs"


def docs_block(page: str, after: str) -> str:
    """The first ```python block of ``docs/page`` after the heading ``after``."""
    text = (DOCS / page).read_text()
    return re.search(r"```python\n(.*?)```", text[text.index(after):], re.S).group(1)


@pytest.mark.launch
@pytest.mark.parametrize("heading,prints", [
    ("### A serving loop", re.escape("(1, 2048) {'min': 1000, 'max': 1005}\n")),
])
def test_docs_library_examples_run_as_written(tmp_path, heading, prints):
    script = tmp_path / "example.py"
    script.write_text(docs_block("library.md", heading))
    proc = subprocess.run(mpirun_command(4, [sys.executable, str(script)]),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(prints, proc.stdout), proc.stdout


def test_the_loop_on_one_rank_grows_past_its_room_and_matches_the_reference():
    from gqa_mpi import Decoder
    rng = np.random.default_rng(8)
    q = rng.standard_normal((2, 4 * 16), dtype=np.float32)
    k, v = (rng.standard_normal((300, 2 * 16), dtype=np.float32) for _ in "kv")
    with Decoder(q, k[:10], v[:10], heads_kv=2, comm=one_rank(), tile=4, causal=True) as dec:
        held = 10
        for n in (1, 0, 7, 50, 100):
            out = dec.step(q)
            ref = attention_reference(q, k[:held], v[:held], h_kv=2, causal=True)
            np.testing.assert_allclose(out, ref, atol=2e-6 * np.abs(ref).max())
            dec.append(k[held:held + n], v[held:held + n])
            held += n
        with pytest.raises(ValueError, match="must both be"):
            dec.append(k[:3], v[:2])
        assert dec.record()[0].ranks[0].held == held


def test_docs_schedule_example_registers_a_schedule():
    exec(docs_block("architecture.md", "### Adding a schedule or a wire"), {})
    try:
        star = SCHEDULES.get("star")
        assert star.depth(Grid(2, 8, 4)) == 1 and star.depth(Grid(1, 1, 4)) == 0
        assert [s.op for s in star.steps(Grid(2, 8, 4), 0)] == ["recv"] * 15
    finally:
        unregister(SCHEDULES, "star")
    assert "star" not in SCHEDULES


def one_rank():
    from mpi4py import MPI
    return MPI.COMM_SELF


def test_decode_on_one_rank_matches_the_reference():
    from gqa_mpi import decode
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 3, 4 * 16), dtype=np.float32)
    k, v = (rng.standard_normal((2, 100, 2 * 16), dtype=np.float32) for _ in "kv")
    result = decode(q, k, v, heads_kv=2, comm=one_rank(), tile=32, causal=True)
    ref = attention_reference(q, k, v, h_kv=2, causal=True)
    np.testing.assert_allclose(result.output, ref, atol=2e-6 * np.abs(ref).max())
    rec = result.record
    assert rec.config.batch == 2 and rec.config.head_dim == 16 and rec.check is None
    assert rec.tokens == dict(min=100, max=100) and rec.ranks[0].kernel in ("fused", "numpy")


@pytest.mark.parametrize("kw,words", [
    (dict(), "give heads_kv= (or head_dim=)"),
    (dict(heads_kv=3), "heads_kv=3 does not divide the width of K, 32"),
    (dict(heads_kv=2, reduce="ring"), "--reduce must be one of"),
    (dict(heads_kv=2, cubes=2), "--cubes 2 does not divide the 1 running ranks"),
])
def test_decode_refuses_bad_arguments_with_a_value_error(kw, words):
    from gqa_mpi import decode
    q = np.zeros((1, 64), np.float32)
    k = np.zeros((10, 32), np.float32)
    with pytest.raises(ValueError, match=re.escape(words)):
        decode(q, k, k, comm=one_rank(), **kw)


def test_decode_refuses_mismatched_k_and_v_and_a_config_that_splits_otherwise():
    from gqa_mpi import Config, decode
    q = np.zeros((1, 64), np.float32)
    with pytest.raises(ValueError, match="differ in shape"):
        decode(q, np.zeros((10, 32)), np.zeros((11, 32)), heads_kv=2, comm=one_rank())
    cfg = Config(seq_len=12, heads_q=4, heads_kv=2, head_dim=16)
    with pytest.raises(ValueError, match=r"hold \[10\] tokens, but the config splits them as \[12\]"):
        decode(q, np.zeros((10, 32)), np.zeros((10, 32)), cfg, comm=one_rank())


@pytest.mark.parametrize("kw,words", [
    (dict(heads_kv=2, bogus=1), "unknown option(s) bogus"),
    (dict(heads_kv=2, bogus=1), "the library's options are: cubes, pes, grid, heads_kv,"),
    (dict(heads_kv=2, seq_len=10, batch=1), "batch, seq_len: read off the arrays"),
    (dict(heads_kv=2, output="o.npy"), "output: the command line's"),
    (dict(heads_kv=2, json="r.json", check=True), "check, json: the command line's"),
    (dict(heads_kv=np.int64(3)), "heads_kv=3 does not divide the width of K, 32"),
])
def test_decode_refuses_what_the_library_cannot_take(kw, words):
    from gqa_mpi import decode
    q = np.zeros((1, 64), np.float32)
    k = np.zeros((10, 32), np.float32)
    with pytest.raises(ValueError, match=re.escape(words)):
        decode(q, k, k, comm=one_rank(), **kw)


def test_decode_takes_numpy_integers_and_refuses_complex_and_empty_caches(tmp_path):
    from gqa_mpi import decode
    q = np.ones((1, 64), np.float32)
    k = np.ones((10, 32), np.float32)
    trace = tmp_path / "t.json"
    out = decode(q, k, k, comm=one_rank(), heads_kv=np.int64(2), trace=str(trace))
    assert out.output.shape == (1, 64) and trace.exists()
    with pytest.raises(ValueError, match="k must hold real numbers"):
        decode(q, k.astype(np.complex64), k, comm=one_rank(), heads_kv=2)
    for dtype in (np.int32, np.uint8, np.bool_):        # the docs' floats only
        with pytest.raises(ValueError, match=f"v must hold real numbers in float16 or "
                                             f"float32 .*, got {np.dtype(dtype)}"):
            decode(q, k, k.astype(dtype), comm=one_rank(), heads_kv=2)
    with pytest.raises(ValueError, match="every rank passed 0 tokens"):
        decode(q, k[:0], k[:0], comm=one_rank(), heads_kv=2)


@pytest.mark.launch
def test_timeout_works_in_the_library(tmp_path):
    """A rank that never comes: the library's timeout= ends the job (exit 3), rank 0
    naming the rank that never made the call, instead of hanging."""
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent("""
        import time
        import numpy as np
        from mpi4py import MPI
        from gqa_mpi import decode
        if MPI.COMM_WORLD.rank == 1:
            time.sleep(600)
        q, k = np.ones((1, 64), np.float32), np.ones((10, 32), np.float32)
        decode(q, k, k, heads_kv=2, timeout=2)
        """))
    proc = run_bounded(mpirun_command(2, [sys.executable, str(script)]), timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "rank 0 has waited 2 s for rank(s) 1 to reach the library call" in proc.stderr
