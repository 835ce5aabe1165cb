"""Tests that run inside ``mpirun -n 16 python -m pytest --with-mpi -m mpi``.

``test_mpi_suite.py`` launches them from a plain ``python -m pytest``. Each test cuts
sub-communicators of the sizes it needs out of the 16 ranks, so many topologies are
checked in one launch; ranks outside a sub-communicator sit the case out.
"""
import json
import os

import numpy as np
import pytest

mpi4py = pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

from gqa_mpi.config import loop
from gqa_mpi import decode  # noqa: E402
from gqa_mpi.app.cli import build_parser  # noqa: E402
from gqa_mpi.config.config import Config  # noqa: E402
from gqa_mpi.config import inputs  # noqa: E402
from gqa_mpi.step import sweeps  # noqa: E402
from gqa_mpi.step.grid import DIRECTIONS, Grid  # noqa: E402
from gqa_mpi.step.partition import token_range  # noqa: E402
from whole_reference import attention_reference  # noqa: E402
from gqa_mpi.step.attention import empty_partial, finalize  # noqa: E402
from gqa_mpi.step.attention import merge  # noqa: E402
from gqa_mpi.step.schedules import SCHEDULES, Collective, Schedule, Step, Traffic  # noqa: E402
from gqa_mpi.step.wires import WIRES  # noqa: E402
from gqa_mpi.mpi.exchange import collective, execute  # noqa: E402
from gqa_mpi.mpi.topology import Topology  # noqa: E402

from util import spec_depth, spec_kernel_model, spec_schedule, unregister  # noqa: E402

pytestmark = pytest.mark.mpi(min_size=16)

TOPOLOGIES = [(1, 1), (1, 3), (1, 6), (2, 8), (3, 5), (4, 4), (2, 7), (1, 5), (16, 1)]


def rank0_path(comm, tmp_path, name="t.json"):
    """A file in rank 0's temporary folder, the same path on every rank."""
    return comm.bcast(str(tmp_path / name) if comm.rank == 0 else None)


def sub_world(n):
    """The first ``n`` world ranks as a communicator (MPI.COMM_NULL elsewhere)."""
    world = MPI.COMM_WORLD
    return world.Split(0 if world.rank < n else MPI.UNDEFINED, world.rank)


@pytest.mark.parametrize("C,rows,cols", [(1, 1, 1), (2, 2, 4), (4, 1, 4), (1, 4, 4),
                                         (3, 1, 5), (2, 4, 2), (16, 1, 1), (1, 2, 3)])
def test_neighbours_match_full_cartesian_grid(C, rows, cols):
    """A full PE grid is a (C, rows, cols) Cartesian topology: compare with Shift."""
    comm = sub_world(C * rows * cols)
    if comm == MPI.COMM_NULL:
        return
    topo = Topology(comm, Grid(C, rows * cols, cols))
    cart = comm.Create_cart([C, rows, cols], reorder=False)
    want = {}
    for dim, (minus, plus) in zip(range(3), [("W", "E"), ("intra_N", "intra_S"),
                                             ("intra_W", "intra_E")]):
        want[minus], want[plus] = cart.Shift(dim, 1)
    assert topo.neighbours == want
    geometric = {d: MPI.PROC_NULL if r is None else r
                 for d, r in topo.grid.neighbours(comm.rank).items()}
    assert geometric == want
    cube, row, col = cart.Get_coords(cart.rank)
    assert (topo.place.cube, topo.place.row, topo.place.col) == (cube, row, col)
    assert cart.Get_cart_rank([cube, row, col]) == comm.rank == cube * rows * cols + topo.place.pe
    topo.free()
    cart.Free()
    comm.Free()


@pytest.mark.parametrize("C,P", TOPOLOGIES)
def test_neighbours_short_rows(C, P):
    """Any P on a 2x4 grid, short last row included: neighbours from the SPEC's rules."""
    comm = sub_world(C * P)
    if comm == MPI.COMM_NULL:
        return
    topo = Topology(comm, Grid(C, P, 4))
    cube, pe = divmod(comm.rank, P)
    row, col = divmod(pe, 4)
    cart = topo.comm

    def rank_of(c, p, ok):
        return cart.Get_cart_rank([c, p]) if ok else MPI.PROC_NULL

    want = dict(intra_E=rank_of(cube, pe + 1, col < 3 and pe + 1 < P),
                intra_W=rank_of(cube, pe - 1, col > 0),
                intra_S=rank_of(cube, pe + 4, pe + 4 < P),
                intra_N=rank_of(cube, pe - 4, row > 0),
                E=rank_of(cube + 1, pe, cube + 1 < C), W=rank_of(cube - 1, pe, cube > 0))
    assert topo.neighbours == want
    assert set(topo.neighbours) == set(DIRECTIONS)
    # every send has a matching recv: the chain is a tree rooted at rank 0
    steps = SCHEDULES.get("chain").steps(topo.grid, comm.rank)
    sends = [(comm.rank, s.peer) for s in steps if s.op == "send"]
    recvs = [(s.peer, comm.rank) for s in steps if s.op == "recv"]
    all_sends = sorted(sum(comm.allgather(sends), []))
    all_recvs = sorted(sum(comm.allgather(recvs), []))
    assert all_sends == all_recvs
    assert len(all_sends) == C * P - 1
    assert (len(sends) == 0) == (comm.rank == 0)
    topo.free()
    comm.Free()


def check_step(C, P, tolerance, S=None, **config):
    """Run the whole step through ``gqa_mpi.decode`` on C*P ranks (by default S_kv not
    a multiple of the rank count) and compare the root's output with the float64
    reference; return the record."""
    comm = sub_world(C * P)
    if comm == MPI.COMM_NULL:
        return None
    S = 37 * C * P + 5 if S is None else S
    seed = C * 100 + P
    q, k, v = (inputs.generate(seed, n, 1, size, width)[0] for n, size, width in
               (("q", 2, 128), ("k", S, 32), ("v", S, 32)))
    cfg = Config(cubes=C, pes=P, seq_len=S, heads_q=8, heads_kv=2, head_dim=16, queries=2,
                 tile=16, **config)
    start, stop = cfg.placed(C * P).tokens(comm.rank)
    result = decode(q, k[start:stop], v[start:stop], cfg, comm=comm)
    if comm.rank == 0:
        if cfg.kv_dtype == "float16":  # what the ranks hold
            k, v = k.astype(np.float16), v.astype(np.float16)
        ref = attention_reference(q, k, v, h_kv=2, causal=cfg.causal)
        np.testing.assert_allclose(result.output, ref, atol=tolerance * np.abs(ref).max())
    else:
        assert result.output is None
    assert result.record.config.n_ranks == C * P
    comm.Free()
    return result.record


SCHEDULE_WIRES = [(s.name, w.name) for s in SCHEDULES for w in WIRES if s.accepts(w)]
GRIDS = [(1, 1), (1, 3), (1, 6), (2, 8), (3, 5), (4, 4)]
TOLERANCE = {"fp32": 2e-6, "packed": 2e-6, "kernel": 2e-3, "fp16": 2e-3, "bf16": 1e-2}
# every schedule (with its own wire) and the wires this issue added (on the chain) on
# every grid; the other pairs on two grids
NEW = {"allgather", "alltoall", "pipelined-chain", "bf16", "fp16"}
ON_EVERY_GRID = sorted({(s.name, s.default_wire) for s in SCHEDULES}
                       | {("chain", w.name) for w in WIRES if w.name in NEW | {"fp32"}})
FULL_RESULT_CASES = ([(r, w, C, P) for r, w in ON_EVERY_GRID for C, P in GRIDS]
                     + [(r, w, C, P) for r, w in SCHEDULE_WIRES if (r, w) not in ON_EVERY_GRID
                        for C, P in [(2, 8), (3, 5)]])


@pytest.mark.parametrize("reduce,wire,C,P", FULL_RESULT_CASES)
def test_every_schedule_and_wire_against_reference(C, P, reduce, wire):
    """S_kv not a multiple of the rank count, and rank 1 empty where there is one."""
    n = C * P
    split = None if n == 1 else (40 + n, 0) + (37,) * (n - 2)
    record = check_step(C, P, TOLERANCE[wire], S=sum(split or (43,)), split=split,
                        reduce=reduce, wire=wire, causal=True)
    if record is not None and reduce in ("chain", "tree", "pipelined-chain"):
        per_hop = 1 if wire == "packed" else 2 + 4 if reduce == "pipelined-chain" else 3
        assert record.messages == per_hop * (n - 1)


@pytest.mark.parametrize("C,P", [(1, 1), (3, 5)])
def test_every_schedule_is_safe_when_every_rank_is_empty(C, P):
    comm = sub_world(C * P)
    if comm == MPI.COMM_NULL:
        return
    topo = Topology(comm, Grid(C, P, 4))
    for reduce, wire in SCHEDULE_WIRES:
        total, traffic = execute(topo, empty_partial(2, 3, 4, 8), SCHEDULES.get(reduce),
                                 WIRES.get(wire))
        if comm.rank == 0:
            assert np.isneginf(total.m).all() and not total.l.any() and not total.O.any()
            assert not np.isnan(finalize(total)).any() and not finalize(total).any()
        assert traffic.loss.overflow == 0, (reduce, wire)
    topo.free()
    comm.Free()


# the suite launcher fails on any skip: where the fused kernel was not built (no C
# compiler at install), only the NumPy sweep is run here
KERNEL_CASES = [(k, t) for k in ("numpy", "fused") for t in ("float32", "float16")
                if k == "numpy" or sweeps.FUSED_ERROR is None]


@pytest.mark.parametrize("C,P", [(2, 8), (3, 5), (1, 6)])
@pytest.mark.parametrize("kernel,kv_dtype", KERNEL_CASES)
def test_local_kernels_and_resident_dtypes(C, P, kernel, kv_dtype):
    check_step(C, P, 2e-6, kernel=kernel, kv_dtype=kv_dtype, causal=True)


def test_fewer_tokens_than_ranks():
    record = check_step(2, 8, 2e-6, S=5)
    assert sum(r.tokens for r in record.ranks) == 5 and record.tokens["min"] == 0


def critical_path(events_by_rank):
    """Hops from the farthest leaf to rank 0, following the traced receives."""
    memo = {}

    def depth(rank):
        if rank not in memo:
            peers = {e["args"]["peer"] for e in events_by_rank[rank]
                     if e["cat"] == "message" and e["args"]["op"] == "recv"}
            memo[rank] = max((depth(p) + 1 for p in peers), default=0)
        return memo[rank]
    return depth(0)


@pytest.mark.parametrize("C,P", TOPOLOGIES)
def test_trace_follows_spec_schedule(C, P, tmp_path):
    comm = sub_world(C * P)
    if comm == MPI.COMM_NULL:
        return
    cfg = Config(cubes=C, pes=P, seq_len=50 * C * P, heads_q=4, heads_kv=2, head_dim=8,
                 tile=16, trace=rank0_path(comm, tmp_path), trace_tiles=True).placed(C * P)
    q, k, v = (inputs.generate(1, n, 1, size, width)[0] for n, size, width in
               (("q", 1, 32), ("k", cfg.seq_len, 16), ("v", cfg.seq_len, 16)))
    start, stop = cfg.tokens(comm.rank)
    result = decode(q, k[start:stop], v[start:stop], cfg, comm=comm)
    if comm.rank == 0:
        doc = result.trace["traceEvents"]
        events = [[e for e in doc if e["pid"] == r and e["ph"] == "X"] for r in range(C * P)]
        for rank, evs in enumerate(events):
            msgs = sorted((e for e in evs if e["cat"] == "message"), key=lambda e: e["args"]["seq"])
            got = [(e["args"]["op"], e["args"]["dir"], e["args"]["tensor"]) for e in msgs]
            assert got == spec_schedule(rank, C, P), rank
            assert all(e["args"]["bytes"] > 0 and e["pid"] == rank for e in msgs)
            assert [e["ts"] for e in msgs] == sorted(e["ts"] for e in msgs)
            names = {e["name"] for e in evs}
            assert {"inputs", "local_attention", "reduce"} <= names
            assert any(e["cat"] == "tile" for e in evs)
        # one flow arrow per message, from the sender's row to the receiver's
        starts = [e for e in doc if e.get("ph") == "s"]
        ends = {e["id"]: e for e in doc if e.get("ph") == "f"}
        assert len(starts) == len(ends) == 3 * (C * P - 1)
        for s in starts:
            src, dst = map(int, s["name"].split()[1].split("->"))
            assert (s["pid"], ends[s["id"]]["pid"]) == (src, dst)
        depth = cfg.schedule.depth(cfg.layout)
        assert critical_path(events) == spec_depth(C, P) == depth
    comm.Free()


class Star(Schedule):
    """A schedule written in this test file alone: every rank sends straight to rank 0."""

    name = "star"
    help = "every rank sends its partial straight to rank 0"

    def steps(self, grid, rank):
        if rank:
            return [Step("send", "star", 0)]
        return [Step("recv", "star", peer) for peer in range(1, grid.size)]

    def depth(self, grid):
        return 1 if grid.size > 1 else 0


@pytest.mark.parametrize("C,P", [(1, 1), (2, 8), (3, 5)])
def test_a_schedule_added_in_one_file(C, P):
    """One class and one registry line: the command line, the config and the run take it."""
    SCHEDULES.register(Star)
    try:
        assert "star" in build_parser().format_help()
        record = check_step(C, P, 2e-6, reduce="star", causal=True)
        if record is not None:
            assert record.messages == 3 * (C * P - 1)
            assert "star (every rank sends" in record.config.schedule.describe(record.config.layout)
    finally:
        unregister(SCHEDULES, "star")


class GatherAll(Collective):
    """A collective written in this test file alone: every packed partial gathered to the
    root, which merges them in rank order."""

    name = "gather-all"
    help = "every partial gathered to rank 0, merged there"
    op = "gather-all"
    default_wire = "packed"

    def accepts(self, wire):
        return wire.packed


@collective("gather-all")
def gather_all(comm, partial, wire, root):
    (_, mine), = wire.encode(partial)[0]
    every = np.empty((comm.size, mine.size), np.float32) if comm.rank == root else None
    comm.Gather(mine, every, root=root)
    if comm.rank != root:
        return partial, Traffic(1, mine.nbytes)
    total = wire.decode([("mlO", every[0])], partial)
    for row in every[1:]:
        total = merge(total, wire.decode([("mlO", row)], partial))
    return total, Traffic(1, mine.nbytes)


@pytest.mark.parametrize("C,P", [(2, 8), (3, 5)])
def test_a_collective_added_in_one_file(C, P):
    """One class and its executor, both registered here: the run takes it."""
    SCHEDULES.register(GatherAll)
    try:
        record = check_step(C, P, 2e-6, reduce="gather-all", causal=True)
        if record is not None:
            assert record.messages == C * P
            assert "MPI picks the pattern" in record.config.schedule.describe(record.config.layout)
    finally:
        unregister(SCHEDULES, "gather-all")


@pytest.mark.parametrize("reduce,wire", [(s.name, s.default_wire) for s in SCHEDULES]
                         + [("pipelined-chain", "bf16"), ("alltoall", "kernel")])
def test_trace_covers_every_schedule(reduce, wire, tmp_path):
    """Every message in the timeline has its arrow; a collective shows as one span."""
    comm = sub_world(15)
    if comm == MPI.COMM_NULL:
        return
    cfg = Config(cubes=3, pes=5, seq_len=300, heads_q=4, heads_kv=2, head_dim=8, tile=16,
                 reduce=reduce, wire=wire, trace=rank0_path(comm, tmp_path)).placed(15)
    q, k, v = (inputs.generate(2, n, 1, size, width)[0] for n, size, width in
               (("q", 1, 32), ("k", 300, 16), ("v", 300, 16)))
    start, stop = cfg.tokens(comm.rank)
    result = decode(q, k[start:stop], v[start:stop], cfg, comm=comm)
    if comm.rank == 0:
        doc = result.trace["traceEvents"]
        sends = [e for e in doc if e.get("cat") == "message" and e["args"]["op"] == "send"]
        recvs = [e for e in doc if e.get("cat") == "message" and e["args"]["op"] == "recv"]
        arrows = [e for e in doc if e.get("ph") == "s"]
        assert len(sends) == len(recvs) == len(arrows)
        spans = {e["name"] for e in doc if e.get("cat") == "chain"}
        if cfg.schedule.depth(cfg.layout) is None:          # a collective
            assert not sends and spans == {next(iter(cfg.schedule.steps(cfg.layout, 1))).op}
        else:
            assert sends and spans and len(sends) == result.record.messages
            if cfg.schedule.chunks:                          # statistics, then the pieces
                assert {"statistics", "piece 0", "piece 3"} <= spans
    comm.Free()


@pytest.mark.parametrize("C,P,causal", [(2, 8, False), (3, 5, True), (1, 1, True)])
def test_the_library_loop_steps_and_appends_against_the_reference(C, P, causal):
    """gqa_mpi.Decoder: a slice loaded once, then steps and appends; each step equals the
    float64 reference over the cache as it stands (new tokens to several ranks, or to
    the last one with the causal mask), growing past the room the first load made."""
    from gqa_mpi import Decoder
    comm = sub_world(C * P)
    if comm == MPI.COMM_NULL:
        return
    n, S, T_q = C * P, 23 * C * P + 3, 2
    rng = np.random.default_rng(11)                         # the same draws on every rank
    q = rng.standard_normal((T_q, 8 * 16)).astype(np.float32)
    k, v = (rng.standard_normal((S + 200, 2 * 16)).astype(np.float32) for _ in "kv")
    bounds = [token_range(S, n, r) for r in range(n)]
    held = [list(range(a, b)) for a, b in bounds]           # global rows each rank holds
    nxt = S
    a, b = bounds[comm.rank]
    with Decoder(q, k[a:b], v[a:b], heads_kv=2, comm=comm, tile=8, causal=causal) as dec:
        for step in range(4):
            q_step = rng.standard_normal((T_q, 8 * 16)).astype(np.float32)
            out = dec.step(q_step)
            order = [t for rows in held for t in rows]      # the cache in rank order
            if comm.rank == 0:
                ref = attention_reference(q_step, k[order], v[order], h_kv=2, causal=causal)
                np.testing.assert_allclose(out, ref, atol=2e-6 * np.abs(ref).max())
            counts = [3 * step + 1 if r == n - 1 else (0 if causal else r % 3) for r in range(n)]
            mine = []
            for r, c in enumerate(counts):
                rows = list(range(nxt, nxt + c))
                held[r] += rows
                nxt += c
                if r == comm.rank:
                    mine = rows
            dec.append(k[mine], v[mine])
        record, _ = dec.record()
    assert record.ranks[comm.rank].held == len(held[comm.rank])
    comm.Free()


DISAGREEMENTS = {  # what rank 1 passes differently: the words every rank's error has
    "reduce": (dict(reduce="tree"), "rank 1 passed reduce='tree' where rank 0 has 'chain'"),
    "wire": (dict(wire="fp16"), "rank 1 passed wire='fp16' where rank 0 has 'fp32'"),
    "heads_kv": (dict(heads_kv=4), "rank 1 passed head_dim=8"),
    "q": (dict(q_scale=2.0), "rank 1 passed a different q"),
    "T_q": (dict(T_q=3), "rank 1 passed queries=3 where rank 0 has 2"),
    "K width": (dict(width=64), "rank 1 passed head_dim=32"),
}


@pytest.mark.parametrize("case", sorted(DISAGREEMENTS))
def test_the_library_refuses_ranks_that_disagree_on_every_rank(case):
    """Every rank raises the same ValueError, naming the rank and what differs; none
    hangs and none returns a wrong number."""
    comm = sub_world(4)
    if comm == MPI.COMM_NULL:
        return
    change, words = DISAGREEMENTS[case]
    mine = change if comm.rank == 1 else {}
    rng = np.random.default_rng(0)
    T_q, width = mine.get("T_q", 2), mine.get("width", 32)
    q = rng.standard_normal((T_q, 64)).astype(np.float32) * mine.get("q_scale", 1.0)
    k = np.ones((10, width), np.float32)
    options = dict(heads_kv=mine.get("heads_kv", 2), timeout=60)
    options.update({key: mine[key] for key in ("reduce", "wire") if key in mine})
    with pytest.raises(ValueError) as e:
        decode(q, k, k, comm=comm, **options)
    messages = comm.allgather(str(e.value))
    assert len(set(messages)) == 1 and words in messages[0], messages[0]
    comm.Free()


REFERENCE = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                          "reference", "_gqa_attention_decode_long.py"))


def run_source(C, P, tmp_path, **kw):
    """``--kernel-source`` in this process on C*P ranks: (exit code, record on rank 0)."""
    from gqa_mpi.app.run import run
    comm = sub_world(C * P)
    if comm == MPI.COMM_NULL:
        return None, None
    path = rank0_path(comm, tmp_path, "r.json")
    cfg = Config(cubes=C, pes=P, quiet=True, json=path, **kw).placed(C * P)
    code = run(comm, cfg)
    record = None
    if comm.rank == 0:
        with open(path) as f:
            record = json.load(f)
    comm.Free()
    return code, record


@pytest.mark.skipif(not os.path.exists(REFERENCE), reason="no ../shared/reference")
def test_reference_kernel_passes_on_equal_keys_and_overflows_at_128k(tmp_path):
    """The kernel as written: right where its defects do not bite (equal keys, one KV
    head, no scale), and its float16 l overflows at 128K tokens of equal scores."""
    if MPI.COMM_WORLD.rank == 0:
        rng = np.random.default_rng(0)
        for name, k, v in (("eq", np.full((4096, 16), 0.25), rng.standard_normal((4096, 16))),
                           ("ov", np.zeros((1 << 17, 8)), np.ones((1 << 17, 8)))):
            d = tmp_path / name
            d.mkdir()
            for t, a in (("q", rng.standard_normal((1, 4 * k.shape[1]))), ("k", k), ("v", v)):
                np.save(d / f"{t}.npy", a.astype(np.float16))
    where = MPI.COMM_WORLD.bcast(str(tmp_path) if MPI.COMM_WORLD.rank == 0 else None)
    code, record = run_source(2, 8, tmp_path, kernel_source=REFERENCE, softmax_scale=1.0,
                              inputs=os.path.join(where, "eq"), seq_len=4096, heads_q=4,
                              heads_kv=1, head_dim=16, kv_dtype="float16")
    if record is not None:
        assert code == 0 and record["checks"][0]["passed"], record["checks"]
    code, record = run_source(2, 8, tmp_path, kernel_source=REFERENCE, softmax_scale=1.0,
                              inputs=os.path.join(where, "ov"), seq_len=1 << 17, heads_q=4,
                              heads_kv=1, head_dim=8, kv_dtype="float16")
    if record is not None:
        assert code == 1 and not record["checks"][0]["passed"]
        assert any(c == "+" for r in record["ranks"] for c, _, _ in r["source"]["nonfinite"])


@pytest.mark.parametrize("n,chunk_bytes", [(16, 1 << 15), (16, 1 << 20), (5, 1 << 16), (1, 1 << 16)])
@pytest.mark.parametrize("modelled", [False, True])
def test_the_spread_check_matches_the_in_memory_references(n, chunk_bytes, modelled):
    """Chunks dealt round robin to n ranks (some with none), partials folded at rank 0
    one buffer at a time: the plain in-memory references to float64's rounding."""
    from gqa_mpi.app.check import references
    from gqa_mpi.check import streamed
    comm = sub_world(n)
    if comm == MPI.COMM_NULL:
        return
    if modelled:
        if n % 4 and n != 1:
            comm.Free()
            return
        cfg = Config(seq_len=5003, heads_q=8, heads_kv=1, head_dim=32, kernel_source="k.py",
                     check_against="kernel-model").placed(n)
    else:
        cfg = Config(seq_len=3001, heads_q=4, heads_kv=2, head_dim=16, queries=3, causal=True,
                     batch=2).placed(n)
    q, k, v = inputs.load_rows(None, cfg.seed, cfg.B, cfg.queries, loop.final_len(cfg),
                               cfg.heads_q * cfg.head_dim, cfg.heads_kv * cfg.head_dim)
    saved = streamed.CHUNK_BYTES
    streamed.CHUNK_BYTES = chunk_bytes
    try:
        got = references(comm, cfg, q, cfg.seq_len, n_tokens=loop.final_len(cfg))
    finally:
        streamed.CHUNK_BYTES = saved
    if comm.rank == 0:
        k, v = (np.asarray(x)[:, :cfg.seq_len] for x in (k, v))
        if modelled:
            want = spec_kernel_model(q, k[0], v[0], h_kv=1, n=n, tile=cfg.tile)
            np.testing.assert_allclose(got["model"], want, rtol=0, atol=1e-12)
            k16, v16 = (x.astype(np.float16) for x in (k, v))   # the kernel's memory
            np.testing.assert_allclose(got["exact"], attention_reference(q, k16, v16, h_kv=1),
                                       rtol=0, atol=1e-12)
        else:
            kw = dict(h_kv=2, causal=True)
            np.testing.assert_allclose(got["ref"], attention_reference(q, k, v, **kw),
                                       rtol=0, atol=1e-12)
            np.testing.assert_allclose(got["control"], attention_reference(
                q, k, v, dtype=np.float32, **kw), rtol=0, atol=2e-6)
    else:
        assert got is None
    comm.Free()


@pytest.mark.parametrize("fault", ["none", "dropped", "twice"])
def test_the_check_sees_a_token_the_run_dropped_or_counted_twice(fault):
    """The check reads the inputs by its own chunks, not the run's slices: a rank that
    holds its neighbour's last token instead of its own first one fails it."""
    from gqa_mpi.app.check import references
    from gqa_mpi.check.judge import judge
    from gqa_mpi import Decoder
    comm = sub_world(16)
    if comm == MPI.COMM_NULL:
        return
    cfg = Config(seq_len=4000, heads_q=4, heads_kv=2, head_dim=16).placed(16)
    a, b = cfg.tokens(comm.rank)
    q, k, v = inputs.load_rows(None, cfg.seed, 1, 1, loop.final_len(cfg), 64, 32)
    k, v = np.asarray(k)[0], np.asarray(v)[0]
    rows = list(range(a, b))
    if fault != "none" and comm.rank == 7:
        rows = [a - 1] + rows[1:] if fault == "twice" else rows[:-1] + [0]
    with Decoder(q[0], k[rows], v[rows], heads_kv=2, comm=comm) as dec:
        out = dec.step()
    refs = references(comm, cfg, q, cfg.seq_len, n_tokens=loop.final_len(cfg))
    if comm.rank == 0:
        check, _ = judge(cfg, out, 0.0, refs)
        assert check.passed == (fault == "none"), check
    comm.Free()


def test_a_source_run_of_five_steps_checks_each_and_records_like_an_emulated_run(tmp_path):
    """--kernel-source with --steps: every step calls the kernel on the cache as it
    then stands; the record has an emulated run's format and top-level fields."""
    code, source = run_source(2, 8, tmp_path, kernel_source="builtin:corrected", seq_len=3001,
                              heads_q=8, heads_kv=2, head_dim=16, steps=5,
                              placement="round-robin")
    code2, emulated = run_source(2, 8, tmp_path, seq_len=3001, heads_q=8, heads_kv=2,
                                 head_dim=16, steps=5)
    if source is not None:
        assert code == code2 == 0, (source["checks"], emulated["checks"])
        assert set(source) == set(emulated) and source["format"] == emulated["format"]
        assert source["checked_steps"] == [0, 1, 2, 3, 4]
        assert all(c["passed"] for c in source["checks"])
        assert all(len(r["steps"]) == 5 for r in source["ranks"])
        assert sum(r["source"]["k_rows"] for r in source["ranks"]) == 3001 + 4
        assert source["kernel_source"]["function"] == "gqa_decode_corrected_kernel"
        assert emulated["kernel_source"] is None


def test_the_library_loop_runs_the_kernels_source():
    """Decoder(..., kernel_source=FILE): steps and appends of the caller's arrays, each
    step the kernel's own function; O against float64 attention on float16 values."""
    from gqa_mpi import Decoder
    comm = sub_world(8)
    if comm == MPI.COMM_NULL:
        return
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 8 * 16)).astype(np.float32)
    k, v = (rng.standard_normal((8 * 100 + 8 * 3, 2 * 16)).astype(np.float16) for _ in "kv")
    mine = slice(comm.rank * 100, comm.rank * 100 + 100)
    with Decoder(q, k[mine], v[mine], heads_kv=2, kernel_source="builtin:corrected",
                 comm=comm) as dec:
        outs = []
        for step in range(3):
            outs.append(dec.step(q))
            new = slice(800 + 8 * step + comm.rank, 800 + 8 * step + comm.rank + 1)
            dec.append(k[new], v[new])
        record, _ = dec.record()
    assert record.kernel_source["function"] == "gqa_decode_corrected_kernel"
    if comm.rank == 0:
        q16 = q.astype(np.float16)
        for step, out in enumerate(outs):
            seen = np.r_[0:800, 800:800 + 8 * step]
            ref = attention_reference(q16, k[seen], v[seen], h_kv=2)
            assert np.abs(out - ref).max() / np.abs(ref).max() < 2e-3, step
    comm.Free()


@pytest.mark.parametrize("case", ["shape", "width", "differs", "closed"])
def test_the_library_loop_refuses_a_wrong_query_on_every_rank(case):
    from gqa_mpi import Decoder
    comm = sub_world(4)
    if comm == MPI.COMM_NULL:
        return
    q = np.ones((1, 4 * 8), np.float32)
    k = np.ones((10, 2 * 8), np.float32)
    dec = Decoder(q, k, k, heads_kv=2, comm=comm)
    bad = {"shape": np.ones((2, 4 * 8), np.float32), "width": np.ones((1, 4 * 4), np.float32),
           "differs": q * (1 + comm.rank), "closed": q}[case]
    if case == "closed":
        dec.close()
    with pytest.raises(ValueError) as e:
        dec.step(bad)
    dec.close()
    words = {"shape": "shaped like the first ones", "width": "shaped like the first ones",
             "differs": "rank 1 passed a different q", "closed": "after the decoder was closed"}
    messages = comm.allgather(str(e.value))
    assert all(words[case] in m for m in messages), messages
    comm.Free()


def test_the_corrected_kernel_reads_its_slice_under_any_split(tmp_path):
    """--split gives the kernel slices that are not the balanced split of S_kv; the
    corrected kernel learns its own from tl.local_tokens()."""
    code, record = run_source(2, 4, tmp_path, kernel_source="builtin:corrected", seq_len=1000,
                              split=(300, 0, 0, 200, 100, 0, 250, 150), heads_q=8, heads_kv=2,
                              head_dim=16)
    if record is not None:
        assert code == 0 and record["checks"][0]["passed"], record["checks"]
        assert [r["source"]["k_rows"] for r in record["ranks"]] == [300, 0, 0, 200, 100, 0,
                                                                   250, 150]


def test_a_predicted_source_run_records_specs_object_and_a_predicted_trace(tmp_path):
    trace = rank0_path(MPI.COMM_WORLD, tmp_path, "p.json")
    code, record = run_source(2, 8, tmp_path, kernel_source="builtin:corrected", seq_len=3001,
                              heads_q=8, heads_kv=2, head_dim=16, steps=2,
                              placement="round-robin", predict="example-npu", trace=trace)
    if record is not None:
        p = record["predicted"]
        assert code == 0 and p["profile"] == "example-npu" and p["fits_scratch"]
        assert {"step_s", "last_pe", "pes", "critical_path", "steps_s"} <= set(p)
        assert len(p["steps_s"]) == 2 and p["step_s"] == p["steps_s"][-1] > 0
        assert len(p["pes"]) == 16 and max(pe["finish_s"] for pe in p["pes"]) == p["step_s"]
        for pe in p["pes"]:
            parts = sum(pe[k] for k in ("memory_s", "dot_s", "vector_s", "send_s", "wait_s"))
            assert parts == pytest.approx(pe["finish_s"], rel=1e-9)
        assert len(p["critical_path"]) == 5 and p["critical_path"][-1]["to_rank"] == 0
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
        predicted = [e for e in events if e.get("cat") == "predicted"]
        assert any(e["ph"] == "X" and e["name"] == "tl.dot" for e in predicted)
        assert sum(e["ph"] == "s" for e in predicted) == sum(
            sum(n for n, _ in pe["source"]["received"].values()) for pe in record["ranks"]) // 2


def test_the_library_loop_predicts_and_refuses_a_bad_profile_on_every_rank():
    from gqa_mpi import Decoder
    comm = sub_world(4)
    if comm == MPI.COMM_NULL:
        return
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4 * 16)).astype(np.float32)
    k = rng.standard_normal((50, 16)).astype(np.float16)
    with pytest.raises(ValueError) as e:
        Decoder(q, k, k, heads_kv=1, kernel_source="builtin:corrected", predict="tpu-v9",
                comm=comm)
    assert all("shipped profiles" in m for m in comm.allgather(str(e.value)))
    with Decoder(q, k, k, heads_kv=1, kernel_source="builtin:corrected",
                 predict="example-npu", comm=comm) as dec:
        dec.step()
        record, _ = dec.record()
    assert record.predicted["profile"] == "example-npu" and record.predicted["step_s"] > 0
    comm.Free()
