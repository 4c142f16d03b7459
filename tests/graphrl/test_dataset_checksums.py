"""Dataset files are read back, not trusted: the loaders check every file the data folder's
SHA256SUMS lists before parsing it (a truncated, edited or emptied file that would still parse is
refused naming the file), and damaged Planetoid pickles or non-text Gowalla files give ValueErrors
naming the file even in a folder without a checksum list."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from graphrl.datasets import load_gowalla, load_lastfm, load_planetoid
from graphrl.datasets.base import CHECKSUMS, verify_checksums


@pytest.fixture
def copy(tmp_path, data_root):
    """A writable copy of the real data folder, its SHA256SUMS included."""
    root = tmp_path / "data"
    shutil.copytree(data_root, root)
    for p in root.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return root


def test_an_intact_copy_loads_and_verifies(copy):
    paths = [copy / line.split("  ", 1)[1] for line in (copy / CHECKSUMS).read_text().splitlines() if line]
    assert len(paths) == 25
    verify_checksums(copy, paths)  # every listed file
    assert load_gowalla(copy).num_train == 810_128 and load_lastfm(copy).num_train == 42_135
    assert load_planetoid("cora", copy).num_nodes == 2708


@pytest.mark.parametrize(
    ("file", "damage", "load"),
    [
        ("gowalla/train.txt", "half", load_gowalla),  # still parses: 414,571 interactions
        ("gowalla/test.txt", "empty", load_gowalla),
        ("gowalla/user_list.txt", "digit", load_gowalla),
        ("lastfm/test1.txt", "empty", load_lastfm),
        ("lastfm/trustnetwork.txt", "half", load_lastfm),
        ("cora_citeseer/ind.cora.allx", "bit", lambda root: load_planetoid("cora", root)),
        ("cora_citeseer/ind.citeseer.test.index", "digit", lambda root: load_planetoid("citeseer", root)),
    ],
)
def test_a_damaged_listed_file_is_refused_naming_it(copy, file, damage, load):
    path = copy / file
    data = bytearray(path.read_bytes())
    if damage == "half":
        data = data[: len(data) // 2]
        data = data[: data.rfind(b"\n") + 1]  # whole lines: the parser alone would accept it
    elif damage == "empty":
        data = bytearray()
    elif damage == "digit":
        i = next(j for j in range(len(data) - 1, 0, -1) if data[j : j + 1].isdigit())
        data[i] = ord("0") + (data[i] - ord("0") + 1) % 10
    else:
        data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    digest = "[0-9a-f]{64}"
    message = rf"{file}: SHA-256 {digest} differs from {digest} listed in .*{CHECKSUMS}"
    with pytest.raises(ValueError, match=message):
        load(copy)


def test_without_a_list_damaged_pickles_and_bytes_still_name_the_file(copy):
    (copy / CHECKSUMS).unlink()
    graph = copy / "cora_citeseer/ind.cora.graph"
    whole = graph.read_bytes()
    for cut in (whole[: len(whole) // 2], b""):
        graph.write_bytes(cut)
        with pytest.raises(ValueError, match=r"ind\.cora\.graph: not a Planetoid pickle \(truncated"):
            load_planetoid("cora", copy)
    graph.write_bytes(whole)
    x = copy / "cora_citeseer/ind.cora.x"
    x.write_bytes(x.read_bytes()[:1000])
    with pytest.raises(ValueError, match=r"ind\.cora\.x: not a Planetoid pickle"):
        load_planetoid("cora", copy)
    train = copy / "gowalla/train.txt"
    raw = bytearray(train.read_bytes())
    raw[5000] = 0xFF
    train.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"gowalla/train\.txt: not a text file of ids"):
        load_gowalla(copy)
    assert np.isfinite(load_lastfm(copy).train_weights.numpy()).all()  # the rest still loads unchecked


def test_a_list_in_binary_mode_is_read_too(copy):
    # sha256sum -b writes "<digest> *<name>": the same files are checked
    sums = copy / CHECKSUMS
    pairs = [line.split() for line in sums.read_text().splitlines()]
    sums.write_text("".join(f"{digest} *{name}\n" for digest, name in pairs))
    test = copy / "lastfm/test1.txt"
    test.write_bytes(b"")
    with pytest.raises(ValueError, match=r"lastfm/test1\.txt: SHA-256"):
        load_lastfm(copy)
