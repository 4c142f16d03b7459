"""Trainers: link prediction with BPR on sampled blocks, and full-ranking recommendation metrics."""

from graphrl.train.link_prediction import (
    LinkPredictionConfig,
    LinkPredictionReport,
    TrainStats,
    bpr_loss,
    evaluate_model,
    evaluate_popularity,
    l2_penalty,
    run_link_prediction,
    train_bpr,
)
from graphrl.train.metrics import (
    RankingResult,
    csr_from_pairs,
    evaluate_ranking,
    ndcg_recall_from_topk,
    popularity_scores,
    topk_items,
)
from graphrl.train.node_classification import (
    NodeClassificationReport,
    NodeClassificationResult,
    accuracy,
    row_normalize,
    run_node_classification,
    train_full_graph,
)

__all__ = [
    "LinkPredictionConfig",
    "LinkPredictionReport",
    "NodeClassificationReport",
    "NodeClassificationResult",
    "RankingResult",
    "TrainStats",
    "accuracy",
    "bpr_loss",
    "csr_from_pairs",
    "evaluate_model",
    "evaluate_popularity",
    "evaluate_ranking",
    "l2_penalty",
    "ndcg_recall_from_topk",
    "popularity_scores",
    "row_normalize",
    "run_link_prediction",
    "run_node_classification",
    "topk_items",
    "train_bpr",
    "train_full_graph",
]
