"""Issue 32, tried to break as a user would: the ``graphrl`` commands' output checks, saving when a signal
comes while the results are being written, and bad ``GRAPHRL_THREADS`` values.

Cases the issue's own tests (tests/graphrl/test_cli_out_paths.py, test_cli_interrupts.py, test_threads.py)
do not cover: ``graphrl partition`` into a folder it cannot write (it made and partitioned the graph, then
failed with a traceback), a signal during the final save of ``train recommend``, a second signal during the
interrupted run's save, and a thread count above what numba can run.
"""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

from graphrl.cli import main


def _invoke(args: list[str]):
    t0 = time.perf_counter()
    result = CliRunner().invoke(main, args)
    return result, time.perf_counter() - t0


# ------------------------------------------------------------------------------ outputs checked first


@pytest.mark.parametrize("case", ["under a file", "not empty", "a file"])
def test_partition_refuses_an_out_it_cannot_create_before_making_the_graph(tmp_path, case):
    (tmp_path / "a_file").write_text("x\n")
    out = {"under a file": tmp_path / "a_file" / "parts", "not empty": tmp_path,
           "a file": tmp_path / "a_file"}[case]
    # the default size is a 1M-node, 20M-edge graph: refused at once, not after minutes of work
    result, seconds = _invoke(["partition", str(out), "--parts", "2"])
    assert result.exit_code == 2, result.output
    assert "'OUT'" in result.output and str(out) in result.output, result.output
    want = {"under a file": "Not a directory", "not empty": "exists and is not an empty folder",
            "a file": "is a file"}[case]
    assert want in result.output, result.output
    assert seconds < 1.0, f"refused only after {seconds:.1f} s: {result.output}"
    assert (tmp_path / "a_file").read_text() == "x\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".graphrl-write-probe-"))]


def test_partition_into_an_empty_folder_and_a_new_one_under_new_parents(tmp_path):
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "empty", tmp_path / "new" / "deeper" / "parts"):
        result, _ = _invoke(["partition", str(out), "--size", "300,1500", "--parts", "2", "--method", "ldg"])
        assert result.exit_code == 0, result.output
        assert (out / "MANIFEST.json").is_file() or any(out.iterdir())
