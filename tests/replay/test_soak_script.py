"""benchmarks/soak.py (issue 32) runs end to end: an 18-s soak with one actor SIGKILLed and checkpoints
accounts for every committed step, leaves every episode intact and leaves no segment in /dev/shm."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_short_soak_accounts_for_every_step(tmp_path):
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--minutes", "0.3", "--kill-every", "10",
           "--checkpoint-every", "5", "--sample-every", "3", "--output", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["benchmark"] == "soak" and result["machine"]["cpus"] and result["rows"]
    checks = result["checks"]
    assert checks["ok"]
    # committed == stored: each actor's stored steps are what it reported (plus, for a killed actor, at most
    # the episode whose commit was in flight), and the store's counters agree with the scan
    assert checks["committed_steps"] > 0
    assert checks["committed_steps"] + checks["in_flight_steps_found_stored"] == checks["stored_steps"]
    assert checks["committed_accounted"] and all(a["ok"] for a in checks["per_actor"])
    assert sum(a["stored"] for a in checks["per_actor"]) == checks["stored_steps"]
    # intact: every episode scanned matches the generator; learners saw no bad window
    assert checks["episodes_intact"] and checks["broken"] == [] and checks["episodes_scanned"] > 0
    assert checks["bad_windows"] == 0 and checks["batches"] > 0
    # the faults happened: an actor killed (and replaced), checkpoints taken
    assert len(result["kills"]) == 1 and any(a["killed"] for a in checks["per_actor"])
    assert len(checks["per_actor"]) == 5  # 4 actors and the one that replaced the killed one
    assert len(result["checkpoints"]) >= 2
    # nothing left behind
    assert checks["shm_segments_left"] == 0 and checks["shm_segments_left_before_gc"] == 0
    assert checks["clean_exit"]
    series = result["series"]
    assert len(series) >= 5 and all(p["stored"] <= p["inserts"] for p in series)
    assert set(result["slopes"]) >= {"owner", "learner0", "learner1", "actor1"}
