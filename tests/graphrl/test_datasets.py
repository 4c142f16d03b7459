"""Real-data loaders: every count of ../shared/data/README.md, splits, parsing edge cases, errors."""

from __future__ import annotations

import collections
import io
import os
import pickle
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from graphrl.datasets import (
    InteractionDataset,
    NodeDataset,
    load_gowalla,
    load_lastfm,
    load_planetoid,
)
from graphrl.datasets import data_root as resolve_root
from graphrl.datasets.gowalla import read_lightgcn_split
from graphrl.datasets.planetoid import RestrictedUnpickler, restricted_load


def pair_keys(users: torch.Tensor, items: torch.Tensor) -> np.ndarray:
    return users.numpy() * 1_000_000 + items.numpy()


# ================================================================================================ Gowalla
@pytest.fixture(scope="module")
def gowalla(data_root) -> InteractionDataset:
    return load_gowalla(data_root)


def test_gowalla_counts(gowalla):
    assert gowalla.name == "gowalla"
    assert gowalla.num_users == 29_858
    assert gowalla.num_items == 40_981
    assert gowalla.num_train == 810_128
    assert gowalla.num_test == 217_242
    assert gowalla.num_nodes == 70_839
    assert gowalla.graph.num_nodes == 70_839 and gowalla.graph.num_edges == 2 * 810_128
    assert gowalla.train_weights is None
    for t in (gowalla.train_users, gowalla.train_items, gowalla.test_users, gowalla.test_items):
        assert t.dtype == torch.int64 and int(t.min()) == 0


def test_gowalla_no_duplicates_no_overlap(gowalla):
    train = pair_keys(gowalla.train_users, gowalla.train_items)
    test = pair_keys(gowalla.test_users, gowalla.test_items)
    assert np.unique(train).size == train.size
    assert np.unique(test).size == test.size
    assert np.intersect1d(train, test).size == 0


def test_gowalla_train_degrees(gowalla):
    user_deg = np.bincount(gowalla.train_users.numpy(), minlength=gowalla.num_users)
    item_deg = np.bincount(gowalla.train_items.numpy(), minlength=gowalla.num_items)
    assert (user_deg.min(), np.median(user_deg), user_deg.max()) == (8, 16, 811)
    assert (item_deg.min(), item_deg.max()) == (1, 1_415)
    # the bipartite graph's in-degrees are the same counts (users, then items at offset U)
    deg = gowalla.graph.in_degrees().numpy()
    assert np.array_equal(deg[: gowalla.num_users], user_deg)
    assert np.array_equal(deg[gowalla.num_users:], item_deg)


def test_gowalla_parse_equals_plain_python(gowalla, data_root):
    users, items = [], []
    for line in (data_root / "gowalla" / "train.txt").read_text().splitlines():
        tok = [int(t) for t in line.split()]
        if tok:
            users += [tok[0]] * (len(tok) - 1)
            items += tok[1:]
    assert np.array_equal(gowalla.train_users.numpy(), users)
    assert np.array_equal(gowalla.train_items.numpy(), items)


def test_gowalla_id_maps_agree(gowalla, data_root):
    for name, count in (("user_list.txt", gowalla.num_users), ("item_list.txt", gowalla.num_items)):
        lines = (data_root / "gowalla" / name).read_text().splitlines()
        assert lines[0].split() == ["org_id", "remap_id"]
        remap = np.array([int(line.split()[1]) for line in lines[1:]])
        assert np.array_equal(remap, np.arange(count))


def _write_gowalla(folder: Path, train: str, test: str) -> Path:
    (folder / "gowalla").mkdir(parents=True)
    (folder / "gowalla" / "train.txt").write_text(train)
    (folder / "gowalla" / "test.txt").write_text(test)
    return folder


def test_lightgcn_format_edge_cases(tmp_path):
    # user 1 has no train items; blank line; tabs and trailing spaces; user 3 only in test
    root = _write_gowalla(tmp_path, "0 4 2\n1\n\n2\t0 1 \n", "0 1\n3 4\n")
    ds = load_gowalla(root)
    assert ds.num_users == 4 and ds.num_items == 5
    assert ds.train_users.tolist() == [0, 0, 2, 2] and ds.train_items.tolist() == [4, 2, 0, 1]
    assert ds.test_users.tolist() == [0, 3] and ds.test_items.tolist() == [1, 4]
    assert ds.graph.num_edges == 8
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    users, items = read_lightgcn_split(empty)
    assert users.size == 0 and items.size == 0 and users.dtype == np.int64


@pytest.mark.parametrize("bad", ["0 1 2.5\n", "0 1 x\n", "0,1\n", "0 1e3\n"])
def test_lightgcn_format_rejects_non_integers(tmp_path, bad):
    f = tmp_path / "train.txt"
    f.write_text("1 2 3\n" + bad)
    with pytest.raises(ValueError, match=f"{f}: expected whitespace-separated integers"):
        read_lightgcn_split(f)


def test_lightgcn_format_rejects_negative_ids(tmp_path):
    f = tmp_path / "train.txt"
    f.write_text("0 1 -2\n")
    with pytest.raises(ValueError, match="non-negative, found -2"):
        read_lightgcn_split(f)


def test_gowalla_missing_files_name_path_and_remedy(tmp_path):
    (tmp_path / "gowalla").mkdir()
    with pytest.raises(FileNotFoundError) as exc:
        load_gowalla(tmp_path)
    msg = str(exc.value)
    assert str(tmp_path / "gowalla" / "train.txt") in msg
    assert "LightGCN Gowalla split (train.txt, test.txt)" in msg and "GRAPHRL_DATA" in msg
    (tmp_path / "gowalla" / "train.txt").write_text("0 1\n")
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "gowalla" / "test.txt")):
        load_gowalla(tmp_path)


# ================================================================================================ data_root
def test_data_root_default_is_env(tmp_path, monkeypatch):
    root = _write_gowalla(tmp_path / "d", "0 1\n", "0 0\n")
    monkeypatch.setenv("GRAPHRL_DATA", str(root))
    assert resolve_root() == root
    assert load_gowalla().num_train == 1
    assert resolve_root(tmp_path) == tmp_path  # an explicit root wins over the environment


def test_data_root_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("GRAPHRL_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="set GRAPHRL_DATA"):
        resolve_root()
    with pytest.raises(FileNotFoundError, match="set GRAPHRL_DATA"):
        load_lastfm()
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=f"data folder {missing} does not exist"):
        load_planetoid("cora", missing)
    monkeypatch.setenv("GRAPHRL_DATA", str(missing))
    with pytest.raises(FileNotFoundError, match=str(missing)):
        load_gowalla()


# ============================================================================================== Planetoid
@pytest.fixture(scope="module")
def cora(data_root) -> NodeDataset:
    return load_planetoid("cora", data_root)


@pytest.fixture(scope="module")
def citeseer(data_root) -> NodeDataset:
    return load_planetoid("citeseer", data_root)


def undirected_pairs(ds: NodeDataset) -> tuple[np.ndarray, np.ndarray]:
    g = ds.graph
    dst = np.repeat(np.arange(g.num_nodes), g.in_degrees().numpy())
    return g.indices.numpy().astype(np.int64), dst


@pytest.mark.parametrize("name, nodes, undirected, feats, classes, train",
                         [("cora", 2708, 5278, 1433, 7, 140), ("citeseer", 3327, 4552, 3703, 6, 120)])
def test_planetoid_counts(request, name, nodes, undirected, feats, classes, train):
    ds = request.getfixturevalue(name)
    assert ds.name == name
    assert ds.num_nodes == nodes and ds.graph.num_nodes == nodes
    assert ds.features.shape == (nodes, feats) and ds.num_features == feats
    assert ds.features.dtype == torch.float32 and ds.labels.dtype == torch.int64
    assert ds.num_classes == classes
    # graph: both directions, no duplicates, no self-loops => num_edges = 2 x undirected edges
    assert ds.graph.num_edges == 2 * undirected
    src, dst = undirected_pairs(ds)
    assert not np.any(src == dst)
    keys = src * nodes + dst
    assert np.unique(keys).size == keys.size
    assert np.array_equal(np.sort(keys), np.sort(dst * nodes + src))  # symmetric
    # split
    for m in (ds.train_mask, ds.val_mask, ds.test_mask):
        assert m.dtype == torch.bool and m.shape == (nodes,)
    assert torch.equal(torch.nonzero(ds.train_mask).flatten(), torch.arange(train))
    assert torch.equal(torch.nonzero(ds.val_mask).flatten(), torch.arange(train, train + 500))
    assert int(ds.test_mask.sum()) == 1000
    assert not (ds.train_mask & ds.test_mask).any() and not (ds.val_mask & ds.test_mask).any()
    # every node in a mask has a class label; every train class has 20 nodes
    in_split = ds.train_mask | ds.val_mask | ds.test_mask
    assert int(ds.labels[in_split].min()) == 0 and int(ds.labels[in_split].max()) == classes - 1
    assert torch.bincount(ds.labels[ds.train_mask]).tolist() == [20] * classes


def test_planetoid_test_ids_are_the_index_file(cora, citeseer, data_root):
    for ds in (cora, citeseer):
        index = np.loadtxt(data_root / "cora_citeseer" / f"ind.{ds.name}.test.index", dtype=np.int64)
        assert np.array_equal(np.flatnonzero(ds.test_mask.numpy()), np.sort(index))


def test_planetoid_test_rows_follow_test_index(cora, citeseer, data_root):
    """Row j of tx/ty belongs to node test.index[j] (the reference loaders' reordering)."""
    for ds in (cora, citeseer):
        folder = data_root / "cora_citeseer"
        index = np.loadtxt(folder / f"ind.{ds.name}.test.index", dtype=np.int64)
        with open(folder / f"ind.{ds.name}.tx", "rb") as f:
            tx = restricted_load(f).toarray()
        with open(folder / f"ind.{ds.name}.ty", "rb") as f:
            ty = restricted_load(f)
        assert np.array_equal(ds.features.numpy()[index], tx)
        assert np.array_equal(ds.labels.numpy()[index], ty.argmax(1))
        assert not np.array_equal(index, np.sort(index))  # the file is shuffled: order matters


def test_planetoid_labels_agree_along_edges(cora, citeseer):
    """Citation graphs are homophilous (~0.81 Cora, ~0.74 CiteSeer); misplaced test rows would drop it."""
    for ds, floor in ((cora, 0.78), (citeseer, 0.70)):
        src, dst = undirected_pairs(ds)
        y = ds.labels.numpy()
        test_edges = ds.test_mask.numpy()[dst] & (y[src] >= 0)
        assert (y[src] == y[dst])[test_edges].mean() > floor


def test_cora_label_distribution(cora):
    assert torch.bincount(cora.labels).tolist() == [351, 217, 418, 818, 426, 298, 180]


def test_planetoid_features_are_bag_of_words(cora, citeseer):
    for ds in (cora, citeseer):
        x = ds.features
        assert set(torch.unique(x).tolist()) == {0.0, 1.0}
        labelled = ds.labels >= 0
        assert float(x[labelled].sum(1).min()) >= 1.0  # every real paper has at least one word


def test_citeseer_padding_and_self_loops(citeseer):
    padded = citeseer.extra["padded_nodes"]
    assert padded.tolist() == [2407, 2489, 2553, 2682, 2781, 2953, 3042, 3063, 3212, 3214, 3250, 3292,
                               3305, 3306, 3309]
    assert float(citeseer.features[padded].abs().sum()) == 0.0
    assert citeseer.labels[padded].tolist() == [-1] * 15
    assert int((citeseer.labels == -1).sum()) == 15
    for m in (citeseer.train_mask, citeseer.val_mask, citeseer.test_mask):
        assert not m[padded].any()
    assert citeseer.extra["self_loop_entries"] == 248
    assert citeseer.extra["self_loop_nodes"].numel() == 124


def test_cora_has_no_padding_or_self_loops(cora):
    assert cora.extra["padded_nodes"].numel() == 0
    assert cora.extra["self_loop_entries"] == 0
    assert int((cora.labels < 0).sum()) == 0


def test_planetoid_name_checks(data_root):
    with pytest.raises(ValueError, match="name must be 'cora' or 'citeseer', got 'pubmed'"):
        load_planetoid("pubmed", data_root)
    with pytest.raises(ValueError, match="name"):
        load_planetoid(None, data_root)
    assert load_planetoid("CiteSeer", data_root).name == "citeseer"


def test_planetoid_missing_file(tmp_path, data_root):
    folder = tmp_path / "cora_citeseer"
    folder.mkdir()
    for part in ("x", "y", "tx", "ty", "allx", "ally", "test.index"):  # no ind.cora.graph
        shutil.copy(data_root / "cora_citeseer" / f"ind.cora.{part}", folder)
    with pytest.raises(FileNotFoundError) as exc:
        load_planetoid("cora", tmp_path)
    assert str(folder / "ind.cora.graph") in str(exc.value)
    assert "ind.cora.{x,y,tx,ty,allx,ally,graph,test.index}" in str(exc.value)


# ------------------------------------------------------------------------------------ restricted unpickler
class _Shell:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Eval:
    def __reduce__(self):
        return (eval, ("1 + 1",))


def test_restricted_unpickler_refuses_code(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Shell(marker), protocol=2)
    assert pickle.loads(payload) == 0 and marker.exists()  # the payload is live with plain pickle
    marker.unlink()
    with pytest.raises(pickle.UnpicklingError, match=r"refusing to unpickle global (posix|nt)\.system"):
        restricted_load(payload)
    assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError, match=r"(__builtin__|builtins)\.eval"):
        restricted_load(pickle.dumps(_Eval(), protocol=2))
    with pytest.raises(pickle.UnpicklingError, match=r"(__builtin__|builtins)\.dict"):
        restricted_load(pickle.dumps(dict, protocol=2))  # even harmless classes off the list


@pytest.mark.parametrize("part", ["x", "y", "tx", "ty", "allx", "ally", "graph"])
def test_restricted_unpickler_reads_the_planetoid_files_like_pickle(data_root, part):
    """Same objects as an unrestricted load (safe here: these are the known, checksummed files)."""
    path = data_root / "cora_citeseer" / f"ind.citeseer.{part}"
    with open(path, "rb") as f:
        mine = restricted_load(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # scipy.sparse.csr namespace
        with open(path, "rb") as f:
            ref = pickle.load(f, encoding="latin1")
    assert type(mine) is type(ref)
    if sp.issparse(ref):
        assert (mine != ref).nnz == 0 and mine.dtype == ref.dtype
    elif isinstance(ref, np.ndarray):
        assert np.array_equal(mine, ref) and mine.dtype == ref.dtype
    else:
        assert mine == ref and mine.default_factory is list


def test_restricted_unpickler_allows_only_exact_names():
    unpickler = RestrictedUnpickler(io.BytesIO(b""))
    assert unpickler.find_class("collections", "defaultdict") is collections.defaultdict
    assert unpickler.find_class("scipy.sparse.csr", "csr_matrix") is sp.csr_matrix
    for module, name in (("collections", "OrderedDict"), ("numpy", "load"), ("scipy.sparse", "load_npz"),
                         ("numpy.core.multiarray", "scalar"), ("__builtin__", "getattr")):
        with pytest.raises(pickle.UnpicklingError, match=f"{module}.{name}"):
            unpickler.find_class(module, name)


def test_load_planetoid_refuses_a_malicious_file(tmp_path, data_root):
    folder = tmp_path / "cora_citeseer"
    shutil.copytree(data_root / "cora_citeseer", folder)
    marker = tmp_path / "pwned"
    target = folder / "ind.cora.ally"
    target.chmod(0o644)
    target.write_bytes(pickle.dumps(_Shell(marker), protocol=2))
    with pytest.raises(pickle.UnpicklingError, match="system"):
        load_planetoid("cora", tmp_path)
    assert not marker.exists()


# ================================================================================================= LastFM
@pytest.fixture(scope="module")
def lastfm(data_root) -> InteractionDataset:
    return load_lastfm(data_root)


def test_lastfm_counts(lastfm):
    assert lastfm.name == "lastfm"
    assert lastfm.num_users == 1_892 and lastfm.num_items == 4_489
    assert lastfm.num_train == 42_135 and lastfm.num_test == 10_533
    assert lastfm.graph.num_nodes == 1_892 + 4_489 and lastfm.graph.num_edges == 2 * 42_135
    # 1-based ids became 0-based and cover the full range
    ids = torch.cat([lastfm.train_items, lastfm.test_items])
    assert int(ids.min()) == 0 and int(ids.max()) == 4_488 and torch.unique(ids).numel() == 4_489
    train = pair_keys(lastfm.train_users, lastfm.train_items)
    test = pair_keys(lastfm.test_users, lastfm.test_items)
    assert np.unique(train).size == train.size and np.unique(test).size == test.size
    assert np.intersect1d(train, test).size == 0


def test_lastfm_first_rows_and_weights(lastfm, data_root):
    first = (data_root / "lastfm" / "data1.txt").read_text().split("\n", 1)[0].split()
    assert first == ["424", "4076", "993"]
    assert (int(lastfm.train_users[0]), int(lastfm.train_items[0])) == (423, 4075)
    w = lastfm.train_weights
    assert w.dtype == torch.float32 and w.shape == (42_135,)
    assert float(w[0]) == 993.0
    assert float(w.min()) >= 1.0 and float(w.max()) == 324_660.0  # written "3.2466e+05"
    assert torch.equal(w, torch.round(w))
    tw = lastfm.extra["test_weights"]
    assert tw.dtype == torch.float32 and tw.shape == (10_533,) and float(tw.max()) == 144_560.0
    # the graph carries the weights on both directions
    g = lastfm.graph
    both = torch.cat([w, w])
    assert torch.equal(g.weights, both[g.edge_ids])


def test_lastfm_friends(lastfm):
    friends = lastfm.extra["friends"]
    assert friends.num_nodes == 1_892 and friends.num_edges == 25_434
    src = friends.indices.numpy().astype(np.int64)
    dst = np.repeat(np.arange(1_892), friends.in_degrees().numpy())
    keys = src * 1_892 + dst
    assert np.unique(keys).size == 25_434  # 12,717 friendships x 2 directions
    assert np.array_equal(np.sort(keys), np.sort(dst * 1_892 + src))
    assert not np.any(src == dst)


def test_lastfm_parse_errors(tmp_path):
    folder = tmp_path / "lastfm"
    folder.mkdir()
    (folder / "data1.txt").write_text("1 2 3\n2 1.5 4\n")
    (folder / "test1.txt").write_text("1 1 1e3\n")
    (folder / "trustnetwork.txt").write_text("1 2\n2 1\n")
    with pytest.raises(ValueError, match=r"data1.txt: artist ids must be integers >= 1 \(1-based\)"):
        load_lastfm(tmp_path)
    (folder / "data1.txt").write_text("1 2 3\n0 1 4\n")
    with pytest.raises(ValueError, match="user ids must be integers >= 1"):
        load_lastfm(tmp_path)
    (folder / "data1.txt").write_text("1 2\n")
    with pytest.raises(ValueError, match="expected 3 columns"):
        load_lastfm(tmp_path)
    (folder / "data1.txt").write_text("1 2 3\n2 1 4.5e2\n")
    ds = load_lastfm(tmp_path)
    assert ds.train_weights.tolist() == [3.0, 450.0] and ds.num_items == 2 and ds.num_users == 2
    (folder / "trustnetwork.txt").unlink()
    with pytest.raises(FileNotFoundError) as exc:
        load_lastfm(tmp_path)
    assert str(folder / "trustnetwork.txt") in str(exc.value) and "HetRec 2011 LastFM" in str(exc.value)
