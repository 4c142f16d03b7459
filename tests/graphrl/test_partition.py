"""graphrl.partition: assignments, their balance, the sealed folder and its verified loading."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from graphrl.cli import main
from graphrl.datasets import synthetic_graph
from graphrl.graph import CSCGraph
from graphrl.partition import (
    PartitionError,
    assign_parts,
    balance,
    graph_fingerprint,
    load_book,
    load_partition,
    metis_available,
    verify,
    write_partitions,
)

N, E, P = 600, 6000, 3


@pytest.fixture(scope="module")
def graph() -> CSCGraph:
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, N, E), rng.integers(0, N, E)
    return CSCGraph.from_edges(torch.from_numpy(src), torch.from_numpy(dst), N, weights=torch.rand(E) + 0.1)


@pytest.fixture(scope="module")
def folder(graph, tmp_path_factory):
    path = tmp_path_factory.mktemp("parts") / "p"
    feats = np.arange(N * 3, dtype=np.float32).reshape(N, 3)
    body = write_partitions(graph, path, P, method="ldg", seed=0, features=feats, labels=np.arange(N) % 7)
    return path, body


def two_cliques() -> CSCGraph:
    """Two 20-node cliques joined by one edge each way: any good 2-way cut separates them (cut 2)."""
    pairs = [(a, b) for c in (0, 20) for a in range(c, c + 20) for b in range(c, c + 20) if a != b]
    pairs += [(0, 20), (20, 0)]
    src, dst = (torch.tensor(x) for x in zip(*pairs, strict=True))
    return CSCGraph.from_edges(src, dst, 40)


@pytest.mark.parametrize("method", ["ldg", pytest.param("metis", marks=pytest.mark.skipif(
    not metis_available(), reason="pymetis not installed (pip install 'graphrl[partition]')"))])
def test_assignment_is_balanced_and_finds_the_cut(method):
    g = two_cliques()
    owner = assign_parts(g, 2, method, seed=3)
    b = balance(g, owner, 2)
    assert b["edge_cut"] == 2 and b["nodes"] == [20, 20] and b["edges"] == [381, 381]
    big = synthetic_graph(2000, 20000, "powerlaw", seed=0)
    b = balance(big, assign_parts(big, 4, method, seed=0), 4)
    assert sum(b["nodes"]) == 2000 and sum(b["edges"]) == 20000 and b["edge_imbalance"] < 1.1


def test_balance_counts_by_hand():
    g = CSCGraph.from_edges(torch.tensor([0, 1, 2, 0]), torch.tensor([1, 2, 0, 0]), 3)
    b = balance(g, np.array([0, 0, 1]), 2)
    assert b["nodes"] == [2, 1] and b["edges"] == [3, 1] and b["edge_cut"] == 2 and b["cut_fraction"] == 0.5


def test_bad_arguments_are_refused(graph, tmp_path):
    with pytest.raises(ValueError, match="num_parts"):
        assign_parts(graph, 0)
    with pytest.raises(ValueError, match="method"):
        assign_parts(graph, 2, "spectral")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ValueError, match="not an empty folder"):
        write_partitions(graph, tmp_path / "full", 2, method="ldg")
    with pytest.raises(ValueError, match="features must have shape"):
        write_partitions(graph, tmp_path / "new", 2, method="ldg", features=np.zeros((N - 1, 2)))


def test_folder_round_trip(graph, folder):
    path, body = folder
    assert body["method"] == "ldg" and body["num_parts"] == P
    book = load_book(path, graph_fingerprint(graph))
    indptr, indices = graph.indptr.numpy(), graph.indices.numpy()
    eids, weights = graph.csc_edge_ids().numpy(), graph.weights.numpy()
    seen = np.zeros(N, dtype=int)
    for p in range(P):
        part = load_partition(path, p, expect=book.fingerprint)
        assert (book.node_part[part.owned] == p).all() and (np.diff(part.owned) > 0).all()
        seen[part.owned] += 1
        for i, v in enumerate(part.owned):
            lo, hi = indptr[v], indptr[v + 1]
            a, b = part.indptr[i], part.indptr[i + 1]
            assert (part.indices[a:b] == indices[lo:hi]).all() and (part.edge_ids[a:b] == eids[lo:hi]).all()
            assert (part.weights[a:b] == weights[lo:hi]).all()
        want_halo = np.unique(part.indices[book.node_part[part.indices] != p])
        assert (part.halo == want_halo).all()
        assert (part.out_degree == np.bincount(indices, minlength=N)[part.owned]).all()
        assert (part.features[:, 0] == 3 * part.owned).all() and (part.labels == part.owned % 7).all()
        assert (part.local_ids(part.owned[::-1]) == np.arange(part.owned.shape[0])[::-1]).all()
        with pytest.raises(ValueError, match=f"not owned by part {p}"):
            part.local_ids(np.flatnonzero(book.node_part != p)[:2])
    assert (seen == 1).all()
    assert verify(path)["balance"]["edge_cut"] == body["balance"]["edge_cut"]


def test_bad_part_ids_and_another_graph_are_refused(graph, folder):
    path, _ = folder
    for bad in (-1, P, "1", True, 1.0):
        with pytest.raises(PartitionError, match=r"part must be an int in \[0, 3\)"):
            load_partition(path, bad)
    other = synthetic_graph(N, E, seed=5)
    with pytest.raises(PartitionError, match="holds another graph"):
        load_partition(path, 0, expect=graph_fingerprint(other))
    wide = CSCGraph(graph.indptr, graph.indices.long(), graph.edge_ids, graph.weights.double())
    load_partition(path, 0, expect=graph_fingerprint(wide))  # the same graph in wider dtypes is this graph
    with pytest.raises(PartitionError, match="another graph"):
        load_book(path, expect=graph_fingerprint(other))


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "extra"])
def test_a_damaged_folder_is_refused_naming_the_file(folder, tmp_path, damage):
    path = _copy(folder[0], tmp_path / "copy")
    target = path / "part1" / "indices.npy"
    if damage == "flip":
        data = bytearray(target.read_bytes())
        data[-3] ^= 0xFF
        target.write_bytes(bytes(data))
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:-8])
    elif damage == "delete":
        target.unlink()
    else:
        target = path / "part1" / "stray.npy"
        target.write_bytes(b"x")
    rel = "part1/stray.npy" if damage == "extra" else "part1/indices.npy"
    with pytest.raises(PartitionError, match=rel) as err:
        verify(path)
    assert rel in err.value.files
    if damage != "extra":
        with pytest.raises(PartitionError, match=rel):
            load_partition(path, 1)
    load_partition(path, 0)  # an owner checks its own files: part 0 is intact


def test_an_altered_manifest_is_refused(folder, tmp_path):
    path = _copy(folder[0], tmp_path / "copy")
    text = (path / "MANIFEST.json").read_text().replace('"num_parts": 3', '"num_parts": 4')
    (path / "MANIFEST.json").write_text(text)
    with pytest.raises(PartitionError, match="MANIFEST.json is altered"):
        load_partition(path, 0)
    with pytest.raises(PartitionError, match="MANIFEST.json is missing"):
        load_book(tmp_path)


def test_cli_partition(tmp_path):
    out = tmp_path / "parts"
    args = ["partition", str(out), "--size", "500,4000", "--parts", "2", "--method", "ldg"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "with ldg" in res.output and "edge cut:" in res.output
    fingerprint = graph_fingerprint(synthetic_graph(500, 4000, "powerlaw", seed=0))
    assert f"graph fingerprint (expect= of LocalOwners / RayOwners): {fingerprint}" in res.output
    body = verify(out, fingerprint)
    assert sum(body["balance"]["edges"]) == 4000
    res = CliRunner().invoke(main, ["partition", str(out), "--size", "500,4000"])
    assert res.exit_code != 0 and "not an empty folder" in res.output
    res = CliRunner().invoke(main, ["partition", str(tmp_path / "c"), "--dataset", "cora", "--data-root",
                                    str(tmp_path / "none")])
    assert res.exit_code == 1 and "Error: data folder" in res.output and "--data-root" in res.output
    assert isinstance(res.exception, SystemExit)  # a message, not a traceback


def test_feature_dtypes_round_trip_and_others_are_refused(graph, tmp_path):
    half = (np.arange(N * 2).reshape(N, 2) % 50).astype(np.float16)
    body = write_partitions(graph, tmp_path / "a", P, method="ldg", features=half,
                            labels=np.arange(N, dtype=np.int64) * 3, owner=np.arange(N) % P)
    assert body["method"] == "given" and body["features"] == ["float16", [2]] and body["labels"] == "int64"
    part = load_partition(tmp_path / "a", 1)
    assert part.features.dtype == np.float16 and (part.features == half[part.owned]).all()
    assert (part.labels == part.owned * 3).all() and (part.owned % P == 1).all()
    for kw, match in [({"features": np.array([[None]] * N)}, "features must be of a bool, integer or float"),
                      ({"labels": np.array(["a"] * N)}, "labels must be of a bool, integer or float"),
                      ({"features": torch.zeros(N, 2, dtype=torch.bfloat16)},
                       r"bfloat16 .* \(features\.float\(\)\)"),
                      ({"owner": np.full(N, 1.5)}, "owner must be an integer array")]:
        with pytest.raises(TypeError, match=match):
            write_partitions(graph, tmp_path / "b", P, **kw)
    edge_list = type("DGLGraph", (), {"num_nodes": lambda self: N})()  # a DGL or PyG user's graph
    with pytest.raises(TypeError, match="graph must be a CSCGraph .*from_edges.* got DGLGraph"):
        write_partitions(edge_list, tmp_path / "b", P, features=half, owner=np.arange(N) % P)
    assert not (tmp_path / "b").exists()


def test_a_resealed_manifest_that_disagrees_with_its_files_is_refused(folder, tmp_path):
    from graphrl.partition.files import seal, unseal

    path = _copy(folder[0], tmp_path / "copy")
    body, _ = unseal(path / "MANIFEST.json", str(path))
    seal(path / "MANIFEST.json", {**body, "num_parts": 2})  # node_part.npy names part 2
    with pytest.raises(PartitionError, match=r"node_part.npy is not int32 \[600\] in \[0, 2\)") as err:
        load_book(path)
    assert err.value.files == ("node_part.npy",)
    seal(path / "MANIFEST.json", {k: v for k, v in body.items() if k != "files"})
    with pytest.raises(PartitionError, match=r"MANIFEST.json lacks \['files'\]"):
        load_partition(path, 0)
    with pytest.raises(TypeError, match="expect must be a graph_fingerprint"):
        load_book(folder[0], expect=5)
