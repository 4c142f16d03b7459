"""examples/full_graph_gcn.py: its default thread count comes from the thread policy's rule for small work
(one on Cora), ``--threads`` overrides it, and the process's counts are restored after training."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numba
import pytest
import torch
from click.testing import CliRunner

from graphrl.threads import threads_for

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "full_graph_gcn.py"


def load_example():
    spec = importlib.util.spec_from_file_location("full_graph_gcn_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_example_defaults_to_the_policy_for_small_work_and_restores_the_counts(data_root):
    main = load_example().main
    before = torch.get_num_threads(), numba.get_num_threads()
    args = ["--dataset", "cora", "--seeds", "1", "--epochs", "5", "--data-root", str(data_root)]
    default = CliRunner().invoke(main, args, catch_exceptions=False)
    assert default.exit_code == 0, default.output
    assert (torch.get_num_threads(), numba.get_num_threads()) == before
    assert threads_for(2708 * 16) == 1  # Cora's nodes x the default hidden width: below SERIAL_WORK
    line = r"^threads: 1 \(torch, numba and graphrl's kernels; --threads to choose\)$"
    assert re.search(line, default.output, re.M), default.output
    one = CliRunner().invoke(main, [*args, "--threads", "1"], catch_exceptions=False)
    acc = r"^seed 0: test accuracy [\d.]+ %  \(val [\d.]+ %, 5 epochs"
    assert re.search(acc, default.output, re.M).group(0) == re.search(acc, one.output, re.M).group(0)
    too_many = CliRunner().invoke(main, [*args, "--threads", str(numba.config.NUMBA_NUM_THREADS + 1)])
    assert too_many.exit_code != 0 and "NUMBA_NUM_THREADS" in str(too_many.exception)
