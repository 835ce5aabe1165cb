"""Long contexts: the memory estimate against measured peaks, with the streamed check,
whose share does not grow with the cache; progress lines in a batch log."""

import os

from gqa_mpi.app.record import RunRecord
from gqa_mpi.app.sizing import rank_bytes

from util import launch
import pytest

pytestmark = pytest.mark.launch   # every test here starts processes

REFERENCE = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                          "reference", "_gqa_attention_decode_long.py"))

MIB = 2 ** 20
PROBLEM = ["--heads-q", "8", "--heads-kv", "2", "--head-dim", "64"]


def test_the_estimate_holds_the_measured_peaks_and_the_check_does_not_grow(tmp_path):
    """Every rank's measured peak (the check's included) is under its estimate, and
    not far under it; a cache four times longer adds to a rank's peak only its longer
    slice: the check's memory stays where it was."""
    peaks = {}
    for S in (100_000, 400_000):
        path = tmp_path / f"{S}.json"
        proc = launch(4, ["--seq-len", S, *PROBLEM, "--json", path])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rec = RunRecord.load(path)
        assert rec.check.passed and all("check" in r.timings for r in rec.ranks)
        for r in rec.ranks:
            estimate = rank_bytes(rec.config, r.held, r.rank == 0) / MIB
            assert r.peak_rss_mib <= estimate <= 1.3 * r.peak_rss_mib + 64, (
                S, r.rank, r.peak_rss_mib, estimate)
        peaks[S] = max(r.peak_rss_mib for r in rec.ranks)
    longer_slice = (400_000 - 100_000) // 4 * 2 * 64 * 4 * 2 / MIB
    assert peaks[400_000] - peaks[100_000] <= longer_slice + 16, (peaks, longer_slice)


def test_the_estimate_holds_the_peaks_of_float16_and_source_checks(tmp_path):
    runs = [("float16", ["--kv-dtype", "float16"]),
            ("source", ["--kernel-source", "builtin:corrected"])]
    if os.path.exists(REFERENCE):
        runs.append(("kernel-model", ["--kernel-source", REFERENCE, "--softmax-scale", "1",
                                      "--check-against", "kernel-model"]))
    for name, extra in runs:
        path = tmp_path / f"{name}.json"
        proc = launch(4, ["--seq-len", 200_000, *PROBLEM, *extra, "--json", path])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rec = RunRecord.load(path)
        assert rec.check.passed
        for r in rec.ranks:
            estimate = rank_bytes(rec.config, r.held, r.rank == 0) / MIB
            assert r.peak_rss_mib <= estimate <= 1.3 * r.peak_rss_mib + 64, (
                name, r.rank, r.peak_rss_mib, estimate)
