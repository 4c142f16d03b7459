"""graphrl.sealed_folder: the one sealing rule of replay checkpoints and partition folders. Each fault is
made by hand and the exact line naming it is asserted; both thin wrappers keep their own error and words."""

from __future__ import annotations

import hashlib
import json
import os
import re

import pytest

from graphrl.partition.files import PartitionError
from graphrl.partition.files import check_files as partition_check
from graphrl.partition.files import unseal as partition_unseal
from graphrl.sealed_folder import SealError, check_files, file_sha256, file_table, seal, unseal
from replay._files import CheckpointError
from replay._files import check_files as checkpoint_check
from replay._files import unseal as checkpoint_unseal


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "a.bin").write_bytes(b"abcd")
    (tmp_path / "b.bin").write_bytes(b"wxyz")
    (tmp_path / "d" / "c.bin").write_bytes(b"12345678")
    return tmp_path


def test_file_table_is_size_and_sha256_of_every_file_but_skip(folder):
    table = file_table(folder, skip=("b.bin",))
    assert table == {"a.bin": [4, hashlib.sha256(b"abcd").hexdigest()],
                     "d/c.bin": [8, hashlib.sha256(b"12345678").hexdigest()]}
    assert file_sha256(folder / "b.bin") == hashlib.sha256(b"wxyz").hexdigest()


def test_check_files_names_each_fault_in_the_given_words(folder):
    table = file_table(folder)
    assert check_files(folder, table) == []
    (folder / "a.bin").write_bytes(b"ab")
    (folder / "d" / "c.bin").write_bytes(b"123456789")
    os.replace(folder / "b.bin", folder / "e.bin")
    assert check_files(folder, table, written_by="checkpoint", recorded_at="save") == [
        "b.bin: missing", "a.bin: truncated to 2 bytes, written with 4",
        "d/c.bin: grown to 9 bytes, written with 8", "e.bin: unexpected file (not written by the checkpoint)"]
    assert check_files(folder, table, only=("a.bin", "b.bin")) == [
        "b.bin: missing", "a.bin: truncated to 2 bytes, written with 4"]  # no stray check under only=


def test_check_files_tells_a_swap_from_an_alteration(folder):
    table = file_table(folder)
    (folder / "a.bin").write_bytes(b"wxyz")
    (folder / "b.bin").write_bytes(b"wxyq")
    assert partition_check(folder, table) == [
        "a.bin: holds the bytes of b.bin (swapped) (sha256 differs from the one recorded at write)",
        "b.bin: altered (sha256 differs from the one recorded at write)"]
    assert checkpoint_check(folder, table)[1] == (
        "b.bin: altered (sha256 differs from the one recorded at save)")


def test_seal_round_trips_and_every_damage_raises_the_callers_error(folder):
    path = folder / "MANIFEST.json"
    digest = seal(path, {"files": {"x": [1, "y"]}, "n": 3})
    assert unseal(path, str(folder)) == ({"files": {"x": [1, "y"]}, "n": 3}, digest)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "n": 4}))
    where = re.escape(f"{folder}: MANIFEST.json")
    with pytest.raises(PartitionError, match=f"^partition folder {where} is altered") as err:
        partition_unseal(path, str(folder))
    assert isinstance(err.value, SealError) and err.value.folder == str(folder)
    assert err.value.files == ("MANIFEST.json",)
    path.write_text("{")
    with pytest.raises(CheckpointError, match=f"^checkpoint {where} is not valid JSON") as err:
        checkpoint_unseal(path, str(folder))
    assert err.value.checkpoint == err.value.folder == str(folder) and err.value.intact is None
    path.unlink()
    with pytest.raises(PartitionError, match=r"MANIFEST.json is missing \(not a partition folder\?\)$"):
        partition_unseal(path, str(folder))
    with pytest.raises(SealError, match=f"^sealed folder {where} is missing$"):
        unseal(path, str(folder))
