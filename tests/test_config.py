"""Configuration: checks, dependent defaults, the generated command line (no MPI)."""
import argparse

import pytest

from gqa_mpi.config import loop
from gqa_mpi.app.options import add_arguments
from gqa_mpi.config.config import Config, default_topology


@pytest.mark.parametrize("world,expect", [(1, (1, 1)), (16, (2, 8)), (12, (2, 6)),
                                          (7, (1, 7)), (9, (3, 3)), (11, (11, 1)),
                                          (64, (8, 8))])
def test_default_topology(world, expect):
    assert default_topology(world, None, None) == expect
    placed = Config().placed(world)
    assert (placed.cubes, placed.pes) == expect


def test_one_given():
    assert default_topology(16, 4, None) == (4, 4)
    assert default_topology(15, None, 5) == (3, 5)
    with pytest.raises(ValueError, match="does not divide"):
        default_topology(16, 3, None)


@pytest.mark.parametrize("kw,world,words", [
    (dict(cubes=2, pes=8), 15, "16 ranks, but 15"),
    (dict(pes=9, cubes=1), 9, "does not fit the 2x4"),
    (dict(heads_q=12, heads_kv=8), 1, "not a multiple"),
    (dict(seq_len=0), 1, "--seq-len must be a positive"),
    (dict(tile=-3), 1, "--tile"),
    (dict(grid=(0, 4)), 1, "--grid rows"),
    (dict(softmax_scale=float("inf")), 1, "softmax-scale"),
    (dict(wire="fp8"), 1, "--wire must be one of fp32, kernel, packed"),
    (dict(reduce="ring"), 1, "--reduce must be one of chain, tree, mpi"),
    (dict(reduce="mpi", wire="fp32"), 1, "--reduce mpi carries only --wire packed"),
    (dict(split=(3, 4)), 1, "add up to S_kv"),
    (dict(seq_len=7, split=(3, 4)), 3, "2 token counts for 3 ranks"),
    (dict(check_against="kernel-model"), 1, "give --kernel-source FILE too"),
    (dict(check_against="model"), 1, "--check-against must be one of exact, kernel-model"),
    (dict(trace_tiles=True), 1, "give --trace"),
    (dict(batch=0), 1, "--batch must be a positive"),
])
def test_bad_config(kw, world, words):
    with pytest.raises(ValueError, match=words):
        Config(**kw).placed(world)


def test_dependent_defaults_live_in_the_config():
    assert Config().wire_format.name == "fp32"
    assert Config(kernel_source="k.py").wire_format.name == "kernel"
    assert Config(kernel_source="k.py").kv_dtype == "float16" == Config(
        kernel_source="k.py", kv_dtype="float16").kv_dtype
    assert Config().kv_dtype == "float32"
    assert Config(reduce="mpi").wire_format.name == "packed"
    assert Config(reduce="tree", wire="kernel").wire_format.name == "kernel"
    assert Config(batch=None).B == 1 and not Config().batched
    assert Config(batch=1).batched


def test_chain_depth():
    def depth(**kw):
        c = Config(**kw)
        return c.schedule.depth(c.layout)
    assert depth(cubes=2, pes=8) == 5
    # P = 5: PE 3 (row 0, col 3) is 3 hops from PE 0, PE 4 (row 1, col 0) only 1
    assert depth(cubes=3, pes=5) == 3 + 2
    assert depth(cubes=1, pes=7) == 1 + 2
    assert depth(cubes=1, pes=1) == 0
    assert depth(cubes=1, pes=3, grid=(4, 1)) == 2
    assert depth(cubes=2, pes=8, reduce="tree") == 4
    assert depth(cubes=2, pes=8, reduce="mpi") is None


def parse(argv):
    p = argparse.ArgumentParser()
    add_arguments(p)
    return vars(p.parse_args(argv))


def test_parser_is_generated_from_the_config():
    assert parse([]) == {}                                    # defaults stay the config's
    given = parse(["--seq-len", "100", "--grid", "1x8", "--no-check", "--causal",
                   "--split", "50,50", "--max-memory", "2G", "--reduce", "tree"])
    cfg = Config(**given)
    assert (cfg.seq_len, cfg.grid, cfg.check, cfg.causal, cfg.split) == (
        100, (1, 8), False, True, (50, 50))
    assert cfg.max_memory == 2 << 30 and cfg.reduce == "tree"


def test_help_shows_every_field_with_its_real_default():
    p = argparse.ArgumentParser()
    add_arguments(p)
    text = p.format_help()
    for flag, default in (("--seq-len", "32768"), ("--tile", "1024"), ("--head-dim", "128"),
                          ("--kernel", "auto"), ("--reduce", "chain")):
        entry = text[text.index("\n  " + flag):].split("(default:")[1]
        assert entry.split(")")[0].strip() == default, flag
    assert "binomial tree" in text and "float16" in text        # registry help joins in
    assert "  --world-size" not in text


def test_argv_and_json_round_trip():
    cfg = Config(seq_len=100, grid=(1, 8), check=False, split=(60, 40), reduce="mpi",
                 causal=True, batch=2, tile=7)
    assert Config(**parse(cfg.to_argv())) == cfg
    placed = cfg.placed(2)
    assert Config.from_json(placed.to_json()) == Config(**dict(
        parse(cfg.to_argv()), cubes=placed.cubes, pes=placed.pes, wire="packed"))


def test_tokens_follow_the_split():
    cfg = Config(seq_len=10).placed(4)
    assert [cfg.tokens(r) for r in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    cfg = Config(seq_len=10, split=(0, 10, 0, 0)).placed(4)
    assert [cfg.tokens(r) for r in range(4)] == [(0, 0), (0, 10), (10, 10), (10, 10)]


@pytest.mark.parametrize("kw,words", [
    (dict(steps=0), "--steps must be a positive"),
    (dict(placement="blocks:0"), "blocks:B with B a positive"),
    (dict(placement="striped"), "--placement must be contiguous, round-robin or blocks:B"),
    (dict(steps=2, causal=True, placement="round-robin"), "use --placement contiguous"),
    (dict(steps=2, inputs="dir"), "cannot follow --inputs"),
    (dict(steps=2, kernel_source="k.py", check_against="kernel-model"),
     "the model is of one decode step"),
    (dict(check_every=0), "--check-every must be a positive"),
])
def test_bad_decode_loop(kw, words):
    with pytest.raises(ValueError, match=words):
        Config(**kw)


def test_placements_and_the_growing_cache():
    cfg = Config(seq_len=10, steps=3, queries=2, placement="round-robin").placed(4)
    assert [loop.owner(cfg, t) for t in range(10, 16)] == [2, 3, 0, 1, 2, 3]
    assert [loop.appended(cfg, r) for r in range(4)] == [1, 1, 2, 2]
    assert [loop.appended(cfg, r, 2) for r in range(4)] == [1, 1, 1, 1]    # what is attended
    assert (loop.cache_len(cfg, 0), loop.cache_len(cfg, 2), loop.final_len(cfg)) == (10, 14, 16)
    contiguous = Config(seq_len=10, steps=3, queries=2).placed(4)
    assert [loop.appended(contiguous, r) for r in range(4)] == [0, 0, 0, 6]
    every = Config(steps=5, check_every=2)
    assert [loop.checked(every, s) for s in range(5)] == [False, True, False, True, True]
    assert not loop.checked(Config(steps=5, check=False), 4)


@pytest.mark.parametrize("kw,option", [
    (dict(reduce="tree"), "--reduce tree"), (dict(wire="fp16"), "--wire fp16"),
    (dict(tile=512), "--tile 512"), (dict(kernel="numpy"), "--kernel numpy"),
    (dict(kv_dtype="float32"), "--kv-dtype float32"), (dict(causal=True), "--causal"),
    (dict(batch=2), "--batch"), (dict(trace="t.json", trace_tiles=True), "--trace-tiles")])
def test_a_source_run_refuses_what_it_cannot_honour_by_name(kw, option):
    with pytest.raises(ValueError, match=f"cannot honour {option} .*; drop "
                                         f"{option.split()[0]}$"):
        Config(kernel_source="k.py", **kw)
    Config(kernel_source="k.py", steps=5, tile=1024, reduce="chain")   # the defaults are fine


def test_a_wrong_wire_is_refused_in_its_own_name():
    with pytest.raises(ValueError, match=r"leave --wire out for packed"):
        Config(reduce="mpi", wire="fp32")


def test_the_memory_advice_names_steps_when_the_cache_grows():
    from gqa_mpi.app.sizing import advice
    assert "fewer --steps" in advice(Config(steps=1000))
    assert "fewer --steps" not in advice(Config())


@pytest.mark.parametrize("steps,every", [(1, 1), (5, 1), (5, 2), (6, 2), (10, 3), (4, 4),
                                         (7, 10)])
def test_the_checked_steps_are_counted_as_the_loop_checks_them(steps, every):
    from gqa_mpi.app.sizing import checked_steps
    cfg = Config(steps=steps, check_every=every)
    assert checked_steps(cfg) == len([s for s in range(steps) if loop.checked(cfg, s)])
    assert checked_steps(Config(steps=steps, check=False)) == 0
