"""benchmarks/threads_under_load.py names the load's placement and the fair-share bound it implies."""

from __future__ import annotations

from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "threads_under_load.py"


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script(PATH)


def test_competitors_in_our_session_share_per_thread_with_the_bound(bench) -> None:
    text = bench.placement(4, "processes", False, "1", 2)
    assert text.startswith("4 busy single-threaded processes, in this benchmark's session")
    assert "CFS shares the cores per thread" in text
    assert "1 thread of ours 2/5 core each -> at least 2.50x" in text
    assert "2 threads of ours 2/6 core each -> at least 3.00x" in text


def test_own_sessions_name_the_per_session_share_and_no_per_thread_bound(bench) -> None:
    text = bench.placement(4, "processes", True, "1", 2)
    assert "each in its own session" in text and "between sessions first" in text
    assert "at least" not in text
    one = bench.placement(4, "threads", True, "1", 2)
    assert one.startswith("1 process with 4 busy threads, in its own session")


def test_without_autogroup_sessions_do_not_matter(bench) -> None:
    text = bench.placement(1, "processes", True, "0", 4)
    assert "autogroup off: CFS shares the cores per thread" in text
    assert "1 thread of ours a core each -> at least 1.00x" in text
