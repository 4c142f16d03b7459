"""Dataset loaders refuse damaged copies of the real files with a ValueError naming the file, before they
allocate anything sized by the damage: ids not integral, beyond the node count the files state, shapes that
disagree between files. Each test damages a copy in tmp_path, never the data itself."""

from __future__ import annotations

import pickle
import re
import shutil
import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

from graphrl.datasets import load_gowalla, load_lastfm, load_planetoid
from graphrl.datasets.planetoid import restricted_load

PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")


@pytest.fixture
def cora_copy(tmp_path, data_root):
    folder = tmp_path / "cora_citeseer"
    folder.mkdir()
    for part in PARTS:
        shutil.copy(data_root / "cora_citeseer" / f"ind.cora.{part}", folder)
    return tmp_path


def _load(path):
    with open(path, "rb") as f:
        return restricted_load(f)


def _refused(load, path, match, peak_mib=64):
    """``load()`` raises ValueError naming ``path`` and matching ``match``, peaking below ``peak_mib``."""
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as exc:
            load()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(path) in str(exc.value), exc.value
    assert re.search(match, str(exc.value)), exc.value
    assert peak < peak_mib * 2**20, f"allocated {peak / 2**20:.0f} MiB before refusing"


# -------------------------------------------------------------------------------------------- Planetoid
@pytest.mark.parametrize(("neighbour", "match"), [
    (10**7, r"neighbour id 10000000 of node 0 is outside the 2708 nodes"),
    (10**13, r"neighbour id 10000000000000 of node 0 is outside the 2708 nodes"),
    (2708, r"neighbour id 2708 of node 0 is outside the 2708 nodes the file lists \(0\.\.2707\)"),
    (-1, r"neighbour id -1 of node 0 is outside"),
    (5.0, r"neighbour 5\.0 of node 0 is not an integer id"),
    ("5", r"neighbour '5' of node 0 is not an integer id"),
], ids=["1e7", "1e13", "one-past", "negative", "float", "str"])
def test_planetoid_graph_file_with_a_bad_neighbour_is_refused(cora_copy, neighbour, match):
    path = cora_copy / "cora_citeseer" / "ind.cora.graph"
    graph = _load(path)
    graph[0].append(neighbour)
    path.write_bytes(pickle.dumps(graph, protocol=2))
    _refused(lambda: load_planetoid("cora", cora_copy), path, match)


def test_planetoid_graph_file_with_a_bad_key_is_refused(cora_copy):
    path = cora_copy / "cora_citeseer" / "ind.cora.graph"
    graph = _load(path)
    graph[10**9] = graph.pop(5)
    path.write_bytes(pickle.dumps(graph, protocol=2))
    _refused(lambda: load_planetoid("cora", cora_copy), path,
             r"keys must be the node ids 0\.\.2707, found key 1000000000")


@pytest.mark.parametrize(("line", "match"), [
    ("2708", r"test ids must lie in 1708\.\.2707.*first 2708"),
    ("100", r"test ids must lie in 1708\.\.2707.*first 100"),
    ("2000.5", r"expected one integer node id per line"),
    ("99999999999999999999999", r"expected one integer node id per line"),
], ids=["beyond", "inside-allx", "float", "overflow"])
def test_planetoid_bad_test_index_is_refused(cora_copy, line, match):
    path = cora_copy / "cora_citeseer" / "ind.cora.test.index"
    lines = path.read_text().split()
    lines[3] = line
    path.write_text("\n".join(lines) + "\n")
    _refused(lambda: load_planetoid("cora", cora_copy), path, match)


def test_planetoid_duplicate_test_id_is_refused(cora_copy):
    path = cora_copy / "cora_citeseer" / "ind.cora.test.index"
    lines = path.read_text().split()
    lines[3] = lines[4]
    path.write_text("\n".join(lines) + "\n")
    _refused(lambda: load_planetoid("cora", cora_copy), path, "listed twice")


def _replace(folder, part, value):
    path = folder / "cora_citeseer" / f"ind.cora.{part}"
    path.write_bytes(pickle.dumps(value, protocol=4))  # 2 would pickle bytes through _codecs
    return path


def test_planetoid_inconsistent_shapes_are_refused(cora_copy, data_root):
    real = {p: _load(data_root / "cora_citeseer" / f"ind.cora.{p}") for p in ("tx", "ty", "allx", "ally")}
    load = lambda: load_planetoid("cora", cora_copy)  # noqa: E731
    path = _replace(cora_copy, "ty", real["ty"][:-1])
    _refused(load, path, r"ty has 999 rows, tx \(ind\.cora\.tx\) 1000")
    _replace(cora_copy, "ty", real["ty"])
    path = _replace(cora_copy, "tx", real["tx"][:, :-1])
    _refused(load, path, r"tx has 1432 columns, x \(ind\.cora\.x\) 1433")
    _replace(cora_copy, "tx", real["tx"])
    path = _replace(cora_copy, "ally", real["ally"][:, :6])
    _refused(load, path, r"ally has 6 columns, y \(ind\.cora\.y\) 7")
    _replace(cora_copy, "ally", real["ally"])
    path = _replace(cora_copy, "allx", real["allx"][:600])  # cannot hold 140 train + 500 val
    _refused(load, cora_copy / "cora_citeseer" / "ind.cora.ally", r"ally has 1708 rows, allx")
    _replace(cora_copy, "ally", real["ally"][:600])
    _refused(load, path, r"600 rows cannot hold the 140 training and 500 validation nodes")
    _replace(cora_copy, "allx", real["allx"])
    _replace(cora_copy, "ally", real["ally"])
    assert load_planetoid("cora", cora_copy).num_nodes == 2708  # the repaired copy loads again


def test_planetoid_damaged_sparse_matrix_is_refused(cora_copy, data_root):
    real = {p: _load(data_root / "cora_citeseer" / f"ind.cora.{p}") for p in ("x", "tx", "allx")}
    load = lambda: load_planetoid("cora", cora_copy)  # noqa: E731

    def widened(m):  # the same entries under a damaged width of 10^9 columns (40 TB dense)
        return sp.csr_matrix((m.data, m.indices, m.indptr), shape=(m.shape[0], 10**9))

    path = _replace(cora_copy, "allx", widened(real["allx"]))
    _refused(load, path, r"allx has 1000000000 columns, x \(ind\.cora\.x\) 1433")
    _replace(cora_copy, "x", widened(real["x"]))
    _replace(cora_copy, "tx", widened(real["tx"]))
    _refused(load, path, r"1000000000 feature columns but only \d+ entries in x, tx and allx")
    for part in ("x", "allx"):
        _replace(cora_copy, part, real[part])
    tx = real["tx"].copy()
    tx.indices[7] = 10**6  # a column index far past the matrix: scipy's full format check refuses it
    path = _replace(cora_copy, "tx", tx)
    _refused(load, path, r"tx is a damaged sparse matrix")


# ---------------------------------------------------------------------------------------------- Gowalla
@pytest.fixture
def gowalla_copy(tmp_path, data_root):
    shutil.copytree(data_root / "gowalla", tmp_path / "gowalla")
    for f in (tmp_path / "gowalla").iterdir():
        f.chmod(0o644)
    return tmp_path


def _damage_first_line(path, token_index, value):
    text = path.read_text()
    first, rest = text.split("\n", 1)
    tokens = first.split()
    tokens[token_index] = value
    path.write_text(" ".join(tokens) + "\n" + rest)


@pytest.mark.parametrize(("file", "index", "value", "match"), [
    ("train.txt", 1, str(10**12), r"item id 1000000000000 is outside the 40981 items item_list\.txt lists"),
    ("test.txt", 1, "40981", r"item id 40981 is outside the 40981 items item_list\.txt lists"),
    ("train.txt", 0, "29858", r"user id 29858 is outside the 29858 users user_list\.txt lists"),
    ("train.txt", 1, "7.0", r"expected whitespace-separated integers"),
], ids=["item-1e12", "item-one-past", "user-one-past", "float"])
def test_gowalla_id_beyond_the_stated_count_is_refused(gowalla_copy, file, index, value, match):
    path = gowalla_copy / "gowalla" / file
    _damage_first_line(path, index, value)
    _refused(lambda: load_gowalla(gowalla_copy), path, match, peak_mib=256)


def test_gowalla_without_id_maps_bounds_ids_by_what_is_written(gowalla_copy):
    folder = gowalla_copy / "gowalla"
    (folder / "user_list.txt").unlink()
    (folder / "item_list.txt").unlink()
    path = folder / "train.txt"
    _damage_first_line(path, 1, str(10**12))
    _refused(lambda: load_gowalla(gowalla_copy), path,
             r"item id 1000000000000 is outside the 1027370 item ids written in train\.txt and test\.txt",
             peak_mib=256)


def test_gowalla_damaged_id_map_is_refused(gowalla_copy):
    path = gowalla_copy / "gowalla" / "item_list.txt"
    lines = path.read_text().splitlines()
    lines[10] = lines[10].split()[0] + " 12"
    path.write_text("\n".join(lines) + "\n")
    _refused(lambda: load_gowalla(gowalla_copy), path, r"remap ids must be 0, 1, 2, \.\.\. in order",
             peak_mib=256)
    path.write_text("\n".join(["org remap"] + lines[1:]) + "\n")
    _refused(lambda: load_gowalla(gowalla_copy), path, r"expected the header 'org_id remap_id'", peak_mib=256)


# ----------------------------------------------------------------------------------------------- LastFM
@pytest.fixture
def lastfm_copy(tmp_path, data_root):
    shutil.copytree(data_root / "lastfm", tmp_path / "lastfm")
    for f in (tmp_path / "lastfm").iterdir():
        f.chmod(0o644)
    return tmp_path


@pytest.mark.parametrize(("file", "column", "value", "match"), [
    ("data1.txt", 0, "1000000000", r"user id 1000000000 is beyond the \d+ user ids the files write"),
    ("test1.txt", 1, "1e12", r"artist id 1000000000000 is beyond the 52668 artist ids the files write"),
    ("trustnetwork.txt", 1, "2.5", r"user ids must be integers >= 1 \(1-based\), 1 are not, first 2\.5"),
    ("data1.txt", 1, "nan", r"artist ids must be integers >= 1"),
], ids=["user-1e9", "artist-1e12", "float", "nan"])
def test_lastfm_damaged_ids_are_refused(lastfm_copy, file, column, value, match):
    path = lastfm_copy / "lastfm" / file
    _damage_first_line(path, column, value)
    _refused(lambda: load_lastfm(lastfm_copy), path, match)


def test_lastfm_rows_of_the_wrong_width_are_refused(lastfm_copy):
    path = lastfm_copy / "lastfm" / "test1.txt"
    _damage_first_line(path, 2, "1 1")
    _refused(lambda: load_lastfm(lastfm_copy), path, r"expected 3 whitespace-separated numbers per line")


def test_undamaged_copies_still_load(cora_copy, gowalla_copy, lastfm_copy):
    assert load_planetoid("cora", cora_copy).num_nodes == 2708
    assert load_gowalla(gowalla_copy).num_items == 40_981
    assert load_lastfm(lastfm_copy).num_users == 1_892
    assert np.all(load_lastfm(lastfm_copy).train_items.numpy() < 4_489)


# -------------------------------------------------------------------------------------- synthetic sizes
def test_synthetic_sizes_past_int64_are_refused_up_front():
    from graphrl.datasets import synthetic_bipartite, synthetic_graph

    with pytest.raises(ValueError, match=r"num_nodes must be <= 9223372036854775807"):
        synthetic_graph(2**63, 10)
    with pytest.raises(ValueError, match=r"num_edges must be <= 9223372036854775807"):
        synthetic_graph(10, 2**63)
    with pytest.raises(ValueError, match=r"num_users \* num_items = 46116860184273879040 must be <= 2"):
        synthetic_bipartite(10, 2**62, 20)
    assert synthetic_graph(10, 5, seed=2**70).num_edges == 5  # seeds are not machine integers


def test_gowalla_id_beyond_int64_is_quoted_as_written(tmp_path, data_root):
    root = tmp_path / "data"
    shutil.copytree(data_root / "gowalla", root / "gowalla")
    train = root / "gowalla" / "train.txt"
    lines = train.read_text().splitlines()
    lines[0] += " 18446744073709551616"
    train.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"train.txt: id 18446744073709551616 does not fit an int64"):
        load_gowalla(root)
