"""``pytest -m gpu`` collects on a machine without the optional packages, as the lent GPU machine is.

The GPU machine that ``benchmarks/gpu_check.py`` runs on has torch, numba and pytest but not ray, dgl,
torchrl, cpprb and the other extras (see docs/performance.md, "Running the GPU check on a bare GPU
machine"). A test module that imports one of them at module level without ``pytest.importorskip`` stops
the whole collection there ("Interrupted: 1 error during collection") and wastes the one GPU run. This
test collects ``-m gpu`` in a fresh interpreter whose ``sitecustomize`` makes those packages unimportable
and asserts that the collection has no error and still finds GPU tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

HIDDEN = ("ray", "dgl", "torch_geometric", "torch_sparse", "pyg_lib", "torchrl", "tensordict", "cpprb",
          "hoptorch", "torchdata", "pymetis", "popgym")
"""Top-level packages the collection must survive without: the optional extras (the GPU image has none
of them but torch_geometric; hiding it too checks a CPU machine without PyG)."""

BLOCKER = f'''import importlib.abc, sys
HIDDEN = {set(HIDDEN)!r}
class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}} (hidden by tests/test_gpu_collection.py)",
                                      name=name)
        return None
sys.meta_path.insert(0, _Hide())
'''


def _env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    return {**os.environ, "PYTHONPATH": os.pathsep.join((str(tmp_path), str(REPO))), "GRAPHRL_TEST_WARM": "0",
            "PYTHONDONTWRITEBYTECODE": "1"}


@pytest.mark.slow
def test_gpu_tests_collect_without_the_optional_packages(tmp_path):
    env = _env(tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import ray"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert probe.returncode != 0 and "hidden by tests/test_gpu_collection.py" in probe.stderr, probe.stderr
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "tests"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout + proc.stderr
    errors = [ln for ln in out.splitlines() if ln.startswith("ERROR ")]
    assert proc.returncode == 0 and not errors, "\n".join(errors) or out[-4000:]
    found = re.search(r"(\d+)/\d+ tests collected", out)
    assert found and int(found.group(1)) > 0, out[-2000:]
