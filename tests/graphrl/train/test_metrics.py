"""Full-ranking metrics against values computed by hand: ties, masking, users with few test items."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from graphrl.train.link_prediction import evaluate_popularity
from graphrl.train.metrics import (
    csr_from_pairs,
    evaluate_ranking,
    ndcg_recall_from_topk,
    popularity_scores,
    topk_items,
)

L3 = 1 / math.log2(3)  # discount of rank 2
L4 = 1 / math.log2(4)  # rank 3
L6 = 1 / math.log2(6)  # rank 5
INF = math.inf


def csr(pairs: dict[int, list[int]], num_users: int):
    users = [u for u, items in pairs.items() for _ in items]
    items = [i for _, its in pairs.items() for i in its]
    return csr_from_pairs(np.array(users, dtype=np.int64), np.array(items, dtype=np.int64), num_users)


def evaluate(scores: list[list[float]], train: dict, test: dict, k: int):
    table = torch.tensor(scores, dtype=torch.float32)
    n = table.shape[0]
    return evaluate_ranking(lambda u: table[u], csr(train, n), csr(test, n), k=k, batch_size=2)


def test_topk_breaks_ties_by_lower_item_id():
    scores = torch.tensor([[0.5, 0.9, 0.5, 0.5, 0.1],
                           [0.7, 0.7, 0.7, 0.1, 0.0],  # tie across the boundary: lowest ids win
                           [-INF, 0.2, -INF, 0.2, 0.3]])
    assert topk_items(scores, 3).tolist() == [[1, 0, 2], [0, 1, 2], [4, 1, 3]]
    assert topk_items(scores, 2).tolist() == [[1, 0], [0, 1], [4, 1]]
    assert topk_items(scores, 5)[2].tolist() == [4, 1, 3, 0, 2]


def test_topk_matches_a_plain_sort_with_many_ties():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 6, (64, 40), generator=gen).float()
    scores[torch.rand(64, 40, generator=gen) < 0.2] = -INF
    got = topk_items(scores, 7)
    for row, ranked in zip(scores.tolist(), got.tolist(), strict=True):
        expect = sorted(range(40), key=lambda i, row=row: (-row[i], i))[:7]
        assert ranked == expect


def test_topk_rejects_bad_k():
    with pytest.raises(ValueError, match="k must lie"):
        topk_items(torch.zeros(2, 3), 4)


def test_hand_computed_recall_and_ndcg_with_masking_and_ties():
    # k = 2.
    # u0: item 0 (0.9) is a training item and is masked; items 2 and 3 tie at 0.5 -> ranking [2, 3].
    #     test {3, 4}: hit at rank 2. recall 1/2; NDCG (1/log2 3) / (1 + 1/log2 3).
    # u1: no train items; items 1 and 2 tie at 0.8 -> [1, 2]; test {1}: hit at rank 1 -> recall 1, NDCG 1.
    # u2: no test items -> not averaged.
    # u3: item 4 masked -> [3, 2]; test {0}: no hit -> 0, 0.
    # u4: three-way tie at 0.7 across the boundary -> [0, 1]; test {1, 2}: hit at rank 2.
    scores = [[0.9, 0.1, 0.5, 0.5, 0.3],
              [0.2, 0.8, 0.8, 0.1, 0.0],
              [0.0, 0.0, 0.0, 0.0, 0.0],
              [0.1, 0.2, 0.3, 0.4, 0.5],
              [0.7, 0.7, 0.7, 0.1, 0.0]]
    train = {0: [0], 3: [4]}
    test = {0: [3, 4], 1: [1], 3: [0], 4: [1, 2]}
    res = evaluate(scores, train, test, k=2)
    ndcg_half = L3 / (1 + L3)
    assert res.num_users == 4
    assert res.recall == pytest.approx((0.5 + 1 + 0 + 0.5) / 4, abs=1e-12)
    assert res.ndcg == pytest.approx((ndcg_half + 1 + 0 + ndcg_half) / 4, abs=1e-12)


def test_fewer_test_items_than_k_and_more_than_k():
    # k = 3. u0: ranking [5, 4, 3, ...]; test {5, 3}: hits at ranks 1 and 3; IDCG over min(2, 3) = 2 items.
    # u1: test {0, 1, 2, 3} (more than k) ranked [0, 1, 2, ...]: 3 hits -> recall 3/4, NDCG 1.
    # u2: one test item at rank 2, one training item above it masked: ranking [4, 1, 0] after masking 5.
    scores = [[0, 1, 2, 3, 4, 5],
              [6, 5, 4, 3, 2, 1],
              [1, 2, 0, 0, 3, 9]]
    train = {2: [5]}
    test = {0: [5, 3], 1: [0, 1, 2, 3], 2: [1]}
    res = evaluate(scores, train, test, k=3)
    u0 = (1 + L4) / (1 + L3)
    u1 = 1.0
    u2 = L3 / 1.0
    assert res.recall == pytest.approx((1.0 + 0.75 + 1.0) / 3, abs=1e-12)
    assert res.ndcg == pytest.approx((u0 + u1 + u2) / 3, abs=1e-12)


def test_ndcg_recall_from_topk_per_user():
    test = csr({0: [2, 7], 1: [0]}, 2)
    top = torch.tensor([[7, 1, 2, 5, 6], [3, 4, 5, 6, 0]])
    recall, ndcg = ndcg_recall_from_topk(top, test[0], test[1], torch.tensor([0, 1]))
    assert recall.tolist() == [1.0, 1.0]
    assert ndcg[0].item() == pytest.approx((1 + L4) / (1 + L3))
    assert ndcg[1].item() == pytest.approx(L6)


def test_all_masked_but_few_items_and_empty_test_set():
    # 3 items, k = 3, user 0 trained on 2 of them: the masked ones fill the tail and never hit.
    res = evaluate([[0.1, 0.2, 0.3]], {0: [1, 2]}, {0: [0]}, k=3)
    assert (res.recall, res.ndcg) == (1.0, 1.0)
    res = evaluate([[0.1, 0.2, 0.3]], {0: [1]}, {}, k=2)
    assert (res.recall, res.ndcg, res.num_users) == (0.0, 0.0, 0)


def test_popularity_baseline_by_hand():
    # Train counts: item 0 x3, items 1 and 2 x1, item 3 x0. k = 2.
    # u0 owns items 0, 1 -> recommends [2, 3]; test {3}: hit at rank 2.
    # u1 owns item 0 -> [1, 2] (tie: lower id first); test {1}: rank 1.
    # u2 owns items 0, 2 -> [1, 3]; test {3}: rank 2.
    tr = csr({0: [0, 1], 1: [0], 2: [0, 2]}, 3)
    counts = popularity_scores(tr[1], 4)
    assert counts.tolist() == [3.0, 1.0, 1.0, 0.0]
    te = csr({0: [3], 1: [1], 2: [3]}, 3)
    res = evaluate_popularity(tr, te, num_items=4, k=2)
    assert res.recall == pytest.approx(1.0)
    assert res.ndcg == pytest.approx((L3 + 1 + L3) / 3)


def test_csr_from_pairs_sorts_and_validates():
    indptr, items = csr_from_pairs(np.array([1, 0, 1, 1]), np.array([5, 3, 2, 9]), 3)
    assert indptr.tolist() == [0, 1, 4, 4]
    assert items.tolist() == [3, 2, 5, 9]
    with pytest.raises(ValueError, match="users"):
        csr_from_pairs(np.array([3]), np.array([0]), 3)


def test_popularity_reproduces_the_readme_on_gowalla(data_root):
    from graphrl.datasets import load_gowalla

    ds = load_gowalla(data_root)
    res = evaluate_popularity(ds.user_item_csr("train"), ds.user_item_csr("test"), ds.num_items)
    assert res.num_users == 29858
    assert round(res.recall, 4) == 0.0416
    assert round(res.ndcg, 4) == 0.0317
