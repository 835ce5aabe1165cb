"""Outputs never destroy anything: refusals up front, modes kept, no temp files left.

Refusals run in-process through ``cli.main(argv)`` (one rank); the interrupted
writes run ``python -m gqa_mpi`` in a subprocess so a real signal can hit them.
"""
import errno
import glob
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from gqa_mpi.app import outputs

import util
from util import random_inputs, write_inputs

SMALL = ["--seq-len", "64", "--heads-q", "4", "--heads-kv", "2", "--head-dim", "8"]


def run_small(capsys, *argv):
    return util.run_cli(capsys, *SMALL, *argv)


def refused(capsys, *argv, words):
    return util.refused(capsys, *SMALL, *argv, words=words)


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.parametrize("flag", ["--output", "--json", "--trace"])
@pytest.mark.parametrize("target", ["/dev/null", "/dev/full", "/dev/zero"])
def test_device_nodes_are_refused(capsys, flag, target):
    if not os.path.exists(target):
        pytest.skip(f"no {target} here")
    refused(capsys, flag, target, words="is a character device")
    assert stat.S_ISCHR(os.stat(target).st_mode)


def test_fifo_directory_socket_and_dangling_link_are_refused(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused(capsys, "--json", fifo, words="is a FIFO")
    refused(capsys, "--output", tmp_path, words="is a directory")
    link = tmp_path / "dangling"
    os.symlink(tmp_path / "nowhere" / "x", link)
    refused(capsys, "--output", link, words="does not exist")


@pytest.mark.parametrize("tensor", ["q", "k", "v"])
def test_an_output_that_is_an_input_is_refused(tmp_path, capsys, tensor):
    rng = np.random.default_rng(0)
    d = write_inputs(tmp_path / "in", *random_inputs(rng, S=64, h_q=4, h_kv=2, d=8))
    path = os.path.join(d, f"{tensor}.npy")
    before = digest(path)
    link = tmp_path / "alias.npy"
    os.symlink(path, link)
    for target in (path, os.path.join(d, ".", f"{tensor}.npy"), link):
        refused(capsys, "--inputs", d, "--head-dim", 8, "--output", target,
                words="is the input file")
    assert digest(path) == before


def test_two_outputs_with_one_path_are_refused(tmp_path, capsys):
    a = tmp_path / "a.json"
    refused(capsys, "--json", a, "--trace", tmp_path / "." / "a.json", words="also the --json")
    refused(capsys, "--output", a, "--json", a, words="also the --output")
    assert not a.exists()


def test_missing_directory_and_long_names_are_refused_before_compute(tmp_path, capsys):
    refused(capsys, "--output", tmp_path / "no" / "o.npy", words="does not exist")
    refused(capsys, "--json", tmp_path / ("x" * 300), words="longer than")
    # a name that fits, with no room to spare for a temp suffix, is fine
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    code, _, err = run_small(capsys, "--quiet", "--json", tmp_path / ("y" * limit))
    assert code == 0, err


def test_no_room_is_refused_with_both_numbers(tmp_path):
    why = outputs.check_paths({"--output": str(tmp_path / "o.npy")}, [],
                              {"--output": 1 << 62})
    assert "needs about" in why and "free" in why


def test_replaced_file_keeps_its_mode_and_a_new_one_follows_the_umask(tmp_path, capsys):
    old = tmp_path / "o.npy"
    old.write_bytes(b"old")
    os.chmod(old, 0o640)
    assert run_small(capsys, "--quiet", "--output", old)[0] == 0
    assert stat.S_IMODE(os.stat(old).st_mode) == 0o640
    mask = os.umask(0o027)
    try:
        new = tmp_path / "n.json"
        assert run_small(capsys, "--quiet", "--json", new)[0] == 0
    finally:
        os.umask(mask)
    assert stat.S_IMODE(os.stat(new).st_mode) == 0o640
    assert np.load(old).shape == (1, 32)


def test_a_link_is_followed_and_stays(tmp_path, capsys):
    target = tmp_path / "real.npy"
    target.write_bytes(b"old")
    link = tmp_path / "link.npy"
    os.symlink(target, link)
    assert run_small(capsys, "--quiet", "--output", link)[0] == 0
    assert os.path.islink(link) and np.load(target).shape == (1, 32)


def test_a_write_that_fails_late_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    def full(path, array):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(outputs, "write_npy", full)
    code, out, err = run_small(capsys, "--output", tmp_path / "o.npy")
    assert code == 2 and "No space left on device" in err and "Traceback" not in err
    assert "PASSED" in out          # the run itself is reported
    assert not glob.glob(str(tmp_path / ".gqa_mpi-*"))


def test_strict_json_has_no_infinity(tmp_path):
    path = tmp_path / "r.json"
    outputs.write_json(str(path), {"a": float("inf"), "b": [float("nan"), 1.0]})
    text = path.read_text()
    assert "Infinity" not in text and "NaN" not in text


@pytest.mark.launch
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_write_leaves_no_temp_file(tmp_path, sig):
    out = tmp_path / "o.npy"
    out.write_bytes(b"precious")
    env = dict(os.environ, GQA_MPI_FAULT="hang:0:write", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "gqa_mpi", *SMALL, "--quiet",
                             "--output", str(out)], env=env, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 60
    while not glob.glob(str(tmp_path / ".gqa_mpi-*")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.02)
    assert glob.glob(str(tmp_path / ".gqa_mpi-*")), "the write never started"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert "interrupted by" in err and "Traceback" not in err
    assert out.read_bytes() == b"precious"
    assert not glob.glob(str(tmp_path / ".gqa_mpi-*"))


@pytest.mark.launch
@pytest.mark.parametrize("stream", ["/dev/stdout", "/dev/stderr"])
def test_the_record_to_the_output_stream_keeps_the_report(tmp_path, stream):
    """``--json /dev/stdout > F``: F holds the record and then the report; the file the
    shell opened is written in place, never renamed over."""
    log = tmp_path / "F"
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, "-m", "gqa_mpi", "--seq-len", "256", "--json",
                               stream], stdout=f, stderr=f, timeout=120)
    assert proc.returncode == 0
    text = log.read_text()
    record, _, report = text.partition("\n}\n")
    assert json.loads(record + "\n}")["format"].startswith("gqa_mpi.run")
    assert "check     " in report and "PASSED" in report and f"json      {stream}" in report


def test_a_path_that_is_this_processs_stdout_is_that_stream(capfd):
    assert outputs.stream("/dev/stdout") == 1 and outputs.stream("/dev/stderr") == 2
    assert outputs.check_paths({"--json": "/dev/stdout"}) is None
    assert "--output /dev/stdout: is also the --json output" in outputs.check_paths(
        {"--json": "/dev/stdout", "--output": "/dev/stdout"})
    print("before", flush=True)
    outputs.write_json("/dev/stdout", {"a": 1})
    assert capfd.readouterr().out == 'before\n{\n  "a": 1\n}\n'
