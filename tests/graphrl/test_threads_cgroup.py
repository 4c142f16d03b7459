"""graphrl.threads.cgroup_cpu_limit and available_cores: a cgroup CPU quota (v1 and v2, on the process's
cgroup or an ancestor) caps the thread count, on fake cgroup trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphrl import threads


def tree(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A fake ``/proc/self/cgroup`` holding ``proc`` and a cgroup root holding ``files`` (path -> text)."""
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (tmp_path / "proc").write_text(proc)
    return tmp_path / "proc", root


@pytest.mark.parametrize(
    ("proc", "files", "want"),
    [
        pytest.param("0::/a/b\n", {"a/b/cpu.max": "150000 100000\n"}, 1.5, id="v2 own cgroup"),
        pytest.param("0::/a/b\n", {"a/b/cpu.max": "max 100000\n", "a/cpu.max": "50000 100000\n"}, 0.5,
                     id="v2 ancestor's limit"),
        pytest.param("0::/a/b\n", {"a/b/cpu.max": "300000 100000\n", "a/cpu.max": "400000 100000\n"}, 3.0,
                     id="v2 smallest of the path"),
        pytest.param("0::/host/path\n", {"cpu.max": "200000 100000\n"}, 2.0,
                     id="v2 container sees its cgroup as the root"),
        pytest.param("0::/\n", {"cpu.max": "max 100000\n"}, None, id="v2 unlimited"),
        pytest.param("4:cpu,cpuacct:/docker/x\n1:name=systemd:/\n",
                     {"cpu,cpuacct/docker/x/cpu.cfs_quota_us": "100000\n",
                      "cpu,cpuacct/docker/x/cpu.cfs_period_us": "100000\n"}, 1.0, id="v1 cpu,cpuacct"),
        pytest.param("3:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None,
                     id="v1 unlimited"),
        pytest.param("3:memory:/x\n", {"memory/x/cpu.max": "100000 100000\n"}, None, id="no cpu controller"),
        pytest.param("0::/a\n", {"a/cpu.max": "garbage\n"}, None, id="unreadable limit is no limit"),
    ],
)
def test_cgroup_cpu_limit(tmp_path, proc, files, want) -> None:
    proc_file, root = tree(tmp_path, proc, files)
    assert threads.cgroup_cpu_limit(proc_file, root) == want


def test_no_proc_file_is_no_limit(tmp_path) -> None:
    assert threads.cgroup_cpu_limit(tmp_path / "missing", tmp_path) is None


@pytest.mark.parametrize(("limit", "want"), [(None, 2), (1.5, 1), (0.2, 1), (8.0, 2)])
def test_available_cores_is_the_affinity_capped_by_the_quota(monkeypatch, limit, want) -> None:
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(threads, "cgroup_cpu_limit", lambda: limit)
    assert threads.available_cores() == want
