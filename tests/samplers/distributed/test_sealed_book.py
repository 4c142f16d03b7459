"""A partition folder is exactly what was sealed: `load_book` (and so every group of owners) refuses an
extra file and a missing one, naming it, while reading only the manifest and the book.

Extra files at the top and inside a part, a missing part file and a missing book, each in a fresh copy of
one sealed folder; the whole folder loads and samples as before.
"""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from graphrl.datasets import synthetic_graph
from graphrl.partition import PartitionError, load_book, write_partitions
from samplers import NeighborSampler
from samplers.distributed import DistNeighborSampler, LocalOwners

N, E = 200, 1200


@pytest.fixture(scope="module")
def sealed(tmp_path_factory):
    graph = synthetic_graph(N, E, "powerlaw", seed=2)
    folder = tmp_path_factory.mktemp("sealed") / "parts"
    write_partitions(graph, folder, 2, method="ldg", labels=torch.arange(N))
    return graph, folder


def test_the_sealed_folder_loads_and_samples(sealed):
    graph, folder = sealed
    book = load_book(folder)
    assert book.num_parts == 2 and book.node_part.shape == (N,)
    seeds = torch.arange(0, N, 3)
    want, got = NeighborSampler(graph, [3, 2], seed=4).sample(seeds), \
        DistNeighborSampler(LocalOwners(str(folder)), [3, 2], seed=4).sample(seeds)
    for a, b in zip(want, got, strict=True):
        assert torch.equal(a.indices, b.indices) and torch.equal(a.edge_ids, b.edge_ids)


def test_the_book_reads_no_part_file(sealed, tmp_path):
    _, folder = sealed
    copy = shutil.copytree(folder, tmp_path / "copy")
    path = copy / "part1" / "indices.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # same name and size: only reading the file finds it, which its owner does
    path.write_bytes(bytes(data))
    assert load_book(copy).num_parts == 2
    with pytest.raises(PartitionError, match=re.escape("part1/indices.npy: altered")):
        LocalOwners(str(copy))


@pytest.mark.parametrize("extra", ["notes.txt", "part1/weights.npy", ".hidden"])
def test_an_extra_file_is_refused_by_name(sealed, tmp_path, extra):
    _, folder = sealed
    copy = shutil.copytree(folder, tmp_path / "copy")
    (copy / extra).write_bytes(b"not sealed")
    with pytest.raises(PartitionError, match=re.escape(f"{extra}: unexpected file (not written by the "
                                                       "partitioner)")) as err:
        load_book(copy)
    assert err.value.files == (extra,) and err.value.folder == str(copy)
    with pytest.raises(PartitionError, match=re.escape(extra)):
        LocalOwners(str(copy))


@pytest.mark.parametrize("gone", ["part1/halo.npy", "part0/labels.npy", "node_part.npy"])
def test_a_missing_file_is_refused_by_name(sealed, tmp_path, gone):
    _, folder = sealed
    copy = shutil.copytree(folder, tmp_path / "copy")
    (copy / gone).unlink()
    with pytest.raises(PartitionError, match=re.escape(f"{gone}: missing")) as err:
        load_book(copy)
    assert err.value.files == (gone,)


def test_an_extra_and_a_missing_file_are_both_named(sealed, tmp_path):
    _, folder = sealed
    copy = shutil.copytree(folder, tmp_path / "copy")
    (copy / "part0" / "owned.npy").rename(copy / "part0" / "owned.bak")
    with pytest.raises(PartitionError) as err:
        load_book(copy)
    assert set(err.value.files) == {"part0/owned.npy", "part0/owned.bak"}
    text = str(err.value)
    assert "part0/owned.npy: missing" in text and "part0/owned.bak: unexpected file" in text

