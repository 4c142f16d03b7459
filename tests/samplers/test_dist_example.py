"""examples/dist_graphsage.py in one process: the distributed run (Ray owners, `sample_many`) prints the
losses and the test accuracy of the single-machine run (`NeighborSampler`) for the same seed."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the example's owners need ray: pip install 'graphrl[ray]'")
pytestmark = pytest.mark.slow  # a Ray session and two owner processes: ~20 s on 2 cores

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dist_graphsage.py"
SMALL = ["--size", "4000,40000", "--parts", "2", "--steps", "6", "--batch-size", "256", "--eval-nodes", "512",
         "--fanouts", "5,3"]


def _local(tmp_path: Path) -> str:
    """The single-machine run, in this process (no Ray)."""
    from click.testing import CliRunner

    spec = importlib.util.spec_from_file_location("dist_graphsage_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = CliRunner().invoke(module.main, [*SMALL, "--sampler", "local", "--folder", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    return result.output


def test_dist_run_prints_the_local_runs_losses_and_accuracy(tmp_path, ray_cluster):
    # the example joins the session's cluster (as with `--ray-address auto` on a cluster of its own)
    address = ray_cluster.get_runtime_context().gcs_address
    out = subprocess.run([sys.executable, str(EXAMPLE), *SMALL, "--sampler", "dist", "--folder",
                          str(tmp_path / "parts"), "--ray-address", address], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "RAY_DISABLE_USAGE_STATS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    dist, local = out.stdout, _local(tmp_path)
    loss = re.compile(r"loss (\d+\.\d+) -> (\d+\.\d+)")
    acc = re.compile(r"test accuracy (\d+\.\d+) on (\d+) nodes")
    assert loss.search(dist).groups() == loss.search(local).groups()
    assert acc.search(dist).groups() == acc.search(local).groups()
    assert float(loss.search(dist).group(1)) > float(loss.search(dist).group(2))  # it learned
    assert re.search(r"rank 0: \d+ owner requests", dist)
