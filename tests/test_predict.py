"""The predicted accelerator time (``--predict``): SPEC's cost model on kernels written
so that its answer can be worked out by hand, the profile's checks, and the reference
kernel on one PE against a hand count of its calls. No MPI: the PEs run as threads."""
import os
import textwrap

import pytest

from gqa_mpi.dsl.kernel_file import load
from gqa_mpi.dsl.predict import replay
from gqa_mpi.dsl.profile import SCHEMA, from_dict, load as load_profile

from pes import run_pes

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "reference",
                                          "_gqa_attention_decode_long.py"))
TABLES = dict(name="test", pe=dict(call_s=1e-8, dot_flops_per_s=1e12, vector_elems_per_s=1e11,
                                   mem_bytes_per_s=1e11, mem_latency_s=1e-7,
                                   scratch_bytes=1 << 20),
              noc=dict(latency_s=1e-7, bytes_per_s=1e10),
              inter=dict(latency_s=1e-6, bytes_per_s=1e9))
PROFILE = from_dict(TABLES)
c, lat, bw = 1e-8, 1e-7, 1e10                       # call, noc latency, noc bandwidth


def kernel(tmp_path, body):
    path = tmp_path / "k.py"
    path.write_text(textwrap.dedent(body))
    return load(str(path))


def predicted(tmp_path, body, profile=None, **grid):
    fn, path = kernel(tmp_path, body)
    g, backends = run_pes(fn, path, **grid)
    return replay({r: b.monitor.calls for r, b in backends.items()}, g, profile or PROFILE)


def test_loads_only_cost_the_sum_of_their_loads(tmp_path):
    p = predicted(tmp_path, """
        def loads_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            for i in range(5):
                x = tl.load(k, shape=(4, 16), dtype="f16")
        """)
    assert p.step_s == pytest.approx(5 * (c + 1e-7 + 128 / 1e11), rel=1e-12)
    assert p.pes[0].split["memory_s"] == pytest.approx(p.step_s, rel=1e-12)


CHAIN = """
    def chain_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
        pe = tl.program_id(axis=0)
        x = tl.full((4,), 1.0, "f32") if pe == P - 1 else None
        if pe < P - 1:
            x = tl.recv(dir="intra_E", shape=(4,), dtype="f32")
        if pe > 0:
            tl.send(dir="intra_W", src=x)
"""


def test_a_message_chain_costs_hops_times_call_bytes_over_bandwidth_and_latency(tmp_path):
    p = predicted(tmp_path, CHAIN, P=4)
    # PE 3 also makes its message with tl.full: one call and 4 elements before it sends
    full = c + 4 / 1e11
    hop = c + 16 / bw + lat
    assert p.step_s == pytest.approx(full + 3 * hop, rel=1e-12)
    assert p.last.rank == 0 and len(p.critical_path()) == 3
    first = p.critical_path()[0]
    assert (first["from_rank"], first["to_rank"], first["direction"]) == (3, 2, "intra_W")
    assert first["arrived_s"] == pytest.approx(full + hop, rel=1e-12)


def test_two_sends_on_one_link_arrive_call_and_bytes_apart(tmp_path):
    p = predicted(tmp_path, """
        def two_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            if tl.program_id(axis=0) == 1:
                x = tl.full((256,), 1.0, "f32")
                tl.send(dir="intra_W", src=x)
                tl.send(dir="intra_W", src=x)
            else:
                tl.recv(dir="intra_E", shape=(256,), dtype="f32")
                tl.recv(dir="intra_E", shape=(256,), dtype="f32")
        """, P=2)
    (_, m1, _), (_, m2, _) = p.pes[0].recvs
    assert m2.arrival - m1.arrival == pytest.approx(c + 1024 / bw, rel=1e-9)


def test_a_recv_posted_after_its_message_arrived_waits_nothing(tmp_path):
    p = predicted(tmp_path, """
        def late_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            if tl.program_id(axis=0) == 1:
                tl.send(dir="intra_W", src=tl.full((4,), 1.0, "f32"))
            else:
                for i in range(20):
                    x = tl.load(k, shape=(4, 16), dtype="f16")
                tl.recv(dir="intra_E", shape=(4,), dtype="f32")
        """, P=2)
    pe0 = p.pes[0]
    assert pe0.split["wait_s"] == 0 and pe0.recvs[0][2] == 0
    assert p.step_s == pytest.approx(20 * (c + 1e-7 + 128 / 1e11) + c, rel=1e-12)
    assert p.critical_path() == []


def test_a_tree_and_a_ring_on_a_2x2_cube(tmp_path):
    h = c + 16 / bw + lat                           # one hop of 16 bytes
    make = c + 4 / 1e11                             # the tl.full that makes a message
    tree = predicted(tmp_path, """
        def tree_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            pe = tl.program_id(axis=0)
            x = tl.full((4,), 1.0, "f32")
            if pe % 2 == 1:
                tl.send(dir="intra_W", src=x)
            elif pe == 2:
                y = tl.recv(dir="intra_E", shape=(4,), dtype="f32")
                tl.send(dir="intra_N", src=y)
            else:
                tl.recv(dir="intra_E", shape=(4,), dtype="f32")
                tl.recv(dir="intra_S", shape=(4,), dtype="f32")
        """, P=4, cols=2)
    assert tree.step_s == pytest.approx(make + 2 * h, rel=1e-12)
    ring = predicted(tmp_path, """
        def ring_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            pe = tl.program_id(axis=0)
            into = {0: "intra_S", 1: "intra_W", 3: "intra_N", 2: "intra_E"}[pe]
            out = {0: "intra_E", 1: "intra_S", 3: "intra_W", 2: "intra_N"}[pe]
            if pe == 0:
                tl.send(dir=out, src=tl.full((4,), 1.0, "f32"))
                tl.recv(dir=into, shape=(4,), dtype="f32")
            else:
                tl.send(dir=out, src=tl.recv(dir=into, shape=(4,), dtype="f32"))
        """, P=4, cols=2)
    assert ring.step_s == pytest.approx(make + 4 * h, rel=1e-12)
    assert [hop["from_rank"] for hop in ring.critical_path()] == [0, 1, 3, 2]


def test_messages_between_cubes_take_the_inter_cube_link(tmp_path):
    p = predicted(tmp_path, """
        def across_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            if tl.program_id(axis=1) == 1:
                tl.send(dir="W", src=tl.full((4,), 1.0, "f32"))
            else:
                tl.recv(dir="E", shape=(4,), dtype="f32")
        """, C=2, P=1)
    assert p.step_s == pytest.approx(c + 4 / 1e11 + c + 16 / 1e9 + 1e-6, rel=1e-12)


@pytest.mark.skipif(not os.path.exists(REFERENCE), reason="no ../shared/reference")
def test_the_reference_kernel_on_one_pe_against_a_hand_count_of_its_calls():
    fn, path = load(REFERENCE)
    G, d, S, T = 8, 16, 2048, 1024                  # two tiles of 1024 tokens
    g, backends = run_pes(fn, path, S=S, width=d, h_q=G, d=d)
    p = replay({0: backends[0].monitor.calls}, g, PROFILE)
    mem = lambda b: c + 1e-7 + b / 1e11                              # noqa: E731
    dot = lambda m, k, n: c + 2 * m * k * n / 1e12                   # noqa: E731
    vec = lambda n: c + n / 1e11                                     # noqa: E731
    tile = (2 * mem(d * T * 2) + dot(G, d, T) + vec(G * T)          # loads, scores, max
            + vec(G * T) + vec(G * T) + vec(G * T) + dot(G, T, d))   # -m, exp, sum, P@V
    merge = (vec(G) + 2 * (vec(G) + vec(G))                          # maximum, 2 x (-, exp)
             + 3 * vec(G) + 3 * vec(G * d))                          # l and O: *, *, +
    copies = 2 * vec(G) + vec(G * d)
    want = mem(G * d * 2) + 2 * tile + merge + copies + vec(G * d) + mem(G * d * 2)
    assert p.step_s == pytest.approx(want, rel=1e-12)


def test_a_profile_is_refused_in_one_line_naming_what_is_wrong(tmp_path):
    import copy
    cases = {
        "missing": ("pe", "call_s", None, "missing field pe.call_s"),
        "negative": ("noc", "latency_s", -1.0, "noc.latency_s must be non-negative"),
        "zero rate": ("inter", "bytes_per_s", 0, "inter.bytes_per_s must be positive"),
        "text": ("pe", "mem_latency_s", "fast", "pe.mem_latency_s must be a finite number"),
        "unknown": ("pe", "cache_s", 1.0, "unknown field pe.cache_s"),
    }
    for table, field, value, words in cases.values():
        t = copy.deepcopy(TABLES)
        if value is None:
            del t[table][field]
        else:
            t[table][field] = value
        with pytest.raises(ValueError, match=words):
            from_dict(t)
    with pytest.raises(ValueError, match="unknown field 'gpu'"):
        from_dict(dict(TABLES, gpu={}))
    bad = tmp_path / "p.toml"
    bad.write_text("name = 'x'\n[pe\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_profile(str(bad))
    with pytest.raises(ValueError, match="shipped profiles: .*example-npu"):
        load_profile("no-such-npu")
    deep = tmp_path / "deep.toml"
    deep.write_text("name = " + "[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(ValueError, match="nests arrays or tables too deeply"):
        load_profile(str(deep))
    assert set(SCHEMA) == {"pe", "noc", "inter", "cube"}        # [cube]: an extension
    assert load_profile("example-npu").noc.bytes_per_s == 6.4e10     # SPEC's numbers


def test_a_replay_whose_messages_were_never_sent_says_so():
    from gqa_mpi.step.grid import Grid
    calls = {0: [("recv", "recv", 16, "intra_E", 3)], 1: []}
    with pytest.raises(ValueError, match="rank 0 at call 0 wait for messages that were never"):
        replay(calls, Grid(1, 2, 4), PROFILE)


def test_the_probed_profile_is_the_users_and_its_absence_says_how_to_make_it(tmp_path,
                                                                            monkeypatch):
    """`--predict host` reads the user's probed profile, never one in the package; where
    there is none, one line says how to make it; a user's profile of a shipped name is
    the one read."""
    from gqa_mpi.dsl import profile
    monkeypatch.setenv("GQA_MPI_PROFILES", str(tmp_path / "mine"))
    with pytest.raises(ValueError, match=r"--predict host: this machine has not been probed "
                                         r"yet: run `mpirun -n N python -m gqa_mpi.probe` "
                                         r"\(it writes .*mine/host.toml\), or name another "
                                         r"profile: .*example-npu"):
        load_profile("host")
    assert "host" not in profile._names(profile.PROFILES_DIR)     # the package has none
    assert "xeon-16core-vm" in profile.shipped()                  # a probed example
    (tmp_path / "mine").mkdir()
    shipped = open(profile.resolve("example-npu")).read()
    (tmp_path / "mine" / "example-npu.toml").write_text(shipped.replace(
        'name = "example-npu"', 'name = "my-npu"'))
    assert load_profile("example-npu").name == "my-npu"


@pytest.mark.launch
def test_the_probe_writes_the_users_profile_and_says_where(tmp_path):
    import sys
    from gqa_mpi.dsl import profile
    from gqa_mpi.tools.launcher import mpirun_command, run_bounded
    before = sorted(os.listdir(profile.PROFILES_DIR))
    env = dict(os.environ, GQA_MPI_PROFILES=str(tmp_path / "p"))
    proc = run_bounded(mpirun_command(2, [sys.executable, "-m", "gqa_mpi.probe", "--repeats",
                                          "1"]), timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "probe: 2 ranks; messages" in proc.stdout                    # a line as it goes
    assert f"probe: wrote {tmp_path / 'p' / 'host.toml'}; predict with it: --predict host" \
        in proc.stdout
    written = (tmp_path / "p" / "host.toml").read_text()
    assert written.count('name = "host"') == 1
    assert "probe: rank 0 alone" in proc.stdout
    prof = load_profile(str(tmp_path / "p" / "host.toml"))      # the extensions it uses
    assert set(prof.vector_elems_per_s) == set(prof.dot_flops_per_s) == {"default", "f32",
                                                                          "f16"}
    assert prof.cube_mem_bytes_per_s > 0
    assert sorted(os.listdir(profile.PROFILES_DIR)) == before            # the package untouched


def with_pe(**pe):
    """The test profile with some [pe] fields changed (and the rest as they are)."""
    return from_dict(dict(TABLES, pe=dict(TABLES["pe"], **pe)))


def test_rates_by_dtype_take_the_table_entry_or_its_default(tmp_path):
    """vector f16 at 2e11 (its entry), f32 at the default 1e11; dot of f16 operands at
    the default 1e12, of f32 at its entry 5e11; a max costs its operand's dtype."""
    fn, path = kernel(tmp_path, """
        def dtypes_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            x = tl.zeros((64,), "f16")
            y = tl.zeros((32,), "f32")
            m = tl.max(x)
            a = tl.dot(tl.zeros((2, 16), "f16"), tl.zeros((16, 4), "f16"))
            b = tl.dot(tl.zeros((2, 16), "f32"), tl.zeros((16, 4), "f32"))
        """)
    g, backends = run_pes(fn, path)
    prof = with_pe(vector_elems_per_s={"default": 1e11, "f16": 2e11},
                   dot_flops_per_s={"default": 1e12, "f32": 5e11})
    p = replay({r: b.monitor.calls for r, b in backends.items()}, g, prof)
    f16, f32 = 2e11, 1e11                       # vector rates
    want = (c + 64 / f16) + (c + 32 / f32) + (c + 64 / f16) \
        + (c + 32 / f16) + (c + 64 / f16) + (c + 256 / 1e12) \
        + (c + 32 / f32) + (c + 64 / f32) + (c + 256 / 5e11)
    assert p.step_s == pytest.approx(want, rel=1e-12)
    plain = replay({r: b.monitor.calls for r, b in backends.items()}, g, PROFILE)
    assert plain.step_s == pytest.approx(9 * c + (64 + 32 + 64 + 32 + 64 + 32 + 64) / 1e11
                                         + 512 / 1e12, rel=1e-12)     # no table: as before
    with pytest.raises(ValueError, match="needs a default"):
        with_pe(vector_elems_per_s={"f16": 2e11})
    with pytest.raises(ValueError, match="'f64' is none of them"):
        with_pe(vector_elems_per_s={"default": 1e11, "f64": 2e11})
    with pytest.raises(ValueError, match=r"pe.dot_flops_per_s.f32 must be positive"):
        with_pe(dot_flops_per_s={"default": 1e12, "f32": 0})


def test_a_cubes_memory_is_shared_fairly_by_the_pes_that_load(tmp_path):
    """[cube] mem_bytes_per_s = 1.5e11 and 3 of a cube's 4 PEs load 128 bytes: each of
    them at min(1e11, 1.5e11 / 3) = 5e10; the PE that loads nothing costs nothing. With
    2 cubes of 2 PEs (PE indices 0 and 1: all load), each cube's 2 share its memory."""
    body = """
        def share_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            if tl.program_id(axis=0) != 3:
                x = tl.load(k, shape=(4, 16), dtype="f16")
        """
    fn, path = kernel(tmp_path, body)
    shared = from_dict(dict(TABLES, cube=dict(mem_bytes_per_s=1.5e11)))
    g, backends = run_pes(fn, path, P=4, S=64)
    p = replay({r: b.monitor.calls for r, b in backends.items()}, g, shared)
    assert p.step_s == pytest.approx(c + 1e-7 + 128 / 5e10, rel=1e-12)
    assert p.pes[3].t == 0.0
    g, backends = run_pes(fn, path, C=2, P=2, S=64)
    p = replay({r: b.monitor.calls for r, b in backends.items()}, g, shared)
    assert p.step_s == pytest.approx(c + 1e-7 + 128 / 7.5e10, rel=1e-12)   # 1.5e11 / 2


def test_the_extensions_round_trip_through_the_profiles_text(tmp_path):
    import tomllib
    from gqa_mpi.dsl.profile import to_toml
    prof = from_dict(dict(TABLES, pe=dict(TABLES["pe"], vector_elems_per_s={
        "default": 1e11, "f16": 2e11}), cube=dict(mem_bytes_per_s=3e11)))
    again = from_dict(tomllib.loads(to_toml(prof)))
    assert again.vector_elems_per_s == {"default": 1e11, "f16": 2e11}
    assert again.cube_mem_bytes_per_s == 3e11 and again.rate("vector_elems_per_s", "i1") == 1e11
