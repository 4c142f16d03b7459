"""`graphrl.atomic_write.write_whole`: the target is replaced whole, or left as it was."""

from __future__ import annotations

import pytest

from graphrl.atomic_write import write_whole


def test_write_whole_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    assert write_whole(target, lambda p: p.write_text("new")) == target
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_write_whole_failing_part_way_leaves_the_old_file(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")

    def half_then_fail(p):
        p.write_text("ne")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_whole(target, half_then_fail)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
