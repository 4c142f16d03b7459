"""Every ``graphrl`` command that writes refuses, before any work, a folder it cannot write (issue 32).

A read-only folder is ``chmod 0o500`` for a normal user; root writes through that, so as root the tests
use ``/sys`` (read-only for root too in a container) where it refuses a probe file, and skip otherwise.
A path under a file (``a_file/sub``) fails for everyone.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphrl.cli import main


def _root_cannot_write(folder: str) -> bool:
    try:
        fd, probe = tempfile.mkstemp(dir=folder)
    except OSError:
        return True
    os.close(fd)
    os.unlink(probe)
    return False


@pytest.fixture(params=["read-only folder", "under a file"])
def unwritable(request, tmp_path) -> Path:
    """A folder path the process cannot write into."""
    if request.param == "under a file":
        (tmp_path / "a_file").write_text("not a folder\n")
        return tmp_path / "a_file" / "sub"
    if os.geteuid() == 0:  # chmod does not bite for root
        if not _root_cannot_write("/sys"):
            pytest.skip("running as root and /sys is writable: no folder root cannot write")
        return Path("/sys")
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o500)
    request.addfinalizer(lambda: folder.chmod(0o700))
    return folder


def _refused(args: list[str], option: str, path: Path) -> None:
    t0 = time.perf_counter()
    result = CliRunner().invoke(main, args)
    seconds = time.perf_counter() - t0
    assert result.exit_code == 2, result.output
    assert option in result.output and str(path) in result.output, result.output
    assert "cannot write" in result.output, result.output
    assert seconds < 1.0, f"refused only after {seconds:.1f} s: {result.output}"


def test_train_recommend_refuses_an_unwritable_out_before_training(tmp_path, tiny_gowalla, unwritable):
    root = tiny_gowalla
    args = ["train", "recommend", "--data-root", str(root), "--epochs", "2", "--dim", "8", "--no-progress",
            "--out", str(unwritable)]
    _refused(args, "--out", unwritable)
    result = CliRunner().invoke(main, args)
    assert "data:" not in result.output and "epoch" not in result.output  # nothing loaded, nothing trained


@pytest.mark.parametrize("option", ["--plot", "--logdir"])
def test_demo_refuses_an_unwritable_folder_before_any_task(unwritable, option):
    args = ["demo", "--task", "recommend", "--dataset", "synthetic", "--synthetic-size", "300,400,6000",
            "--epochs", "1", "--dim", "16", option, str(unwritable)]
    _refused(args, option, unwritable)


@pytest.mark.parametrize("option", ["--out", "--plot"])
def test_bench_refuses_an_unwritable_folder_before_any_benchmark(tmp_path, unwritable, option):
    scripts = tmp_path / "benchmarks"
    scripts.mkdir()
    (scripts / "sampler.py").write_text("import time\ntime.sleep(30)\n")  # would take 30 s if it ran
    other = tmp_path / "other"
    args = ["bench", "--only", "sampler", "--benchmarks", str(scripts),
            "--out", str(unwritable if option == "--out" else other)]
    if option == "--plot":
        pytest.importorskip("matplotlib")
        args += ["--plot", str(unwritable)]
    _refused(args, option, unwritable)


def test_bench_from_json_does_not_need_a_writable_out(tmp_path):
    """``--from-json`` only plots: its (default) ``--out`` is neither checked nor created."""
    pytest.importorskip("matplotlib")
    results = tmp_path / "results"
    results.mkdir()
    (results / "replay.json").write_text('{"benchmark": "replay", "rows": []}\n')
    out = tmp_path / "never"
    result = CliRunner().invoke(main, ["bench", "--from-json", str(results), "--plot", str(tmp_path / "fig"),
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert not out.exists()
