"""Trainers: link prediction with BPR on sampled blocks, full-ranking recommendation metrics, a
distributed DQN learner on replayed windows (`graphrl.train.rl`), and data-parallel BPR training with
torch.distributed, one shared graph copy per machine (`graphrl.train.ddp`, imported on its own)."""

from graphrl.train.link_prediction import (
    LinkPredictionConfig,
    LinkPredictionReport,
    TrainStats,
    bpr_batch_loss,
    bpr_loss,
    bpr_step,
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
from graphrl.train.rl import (
    DQNLearner,
    RLConfig,
    RLReport,
    SharedWeights,
    dqn_loss,
    n_step_targets,
    run_rl,
    window_priorities,
)

__all__ = [
    "DQNLearner",
    "LinkPredictionConfig",
    "LinkPredictionReport",
    "NodeClassificationReport",
    "NodeClassificationResult",
    "RLConfig",
    "RLReport",
    "RankingResult",
    "SharedWeights",
    "TrainStats",
    "accuracy",
    "bpr_batch_loss",
    "bpr_loss",
    "bpr_step",
    "csr_from_pairs",
    "dqn_loss",
    "evaluate_model",
    "evaluate_popularity",
    "evaluate_ranking",
    "l2_penalty",
    "n_step_targets",
    "ndcg_recall_from_topk",
    "popularity_scores",
    "row_normalize",
    "run_link_prediction",
    "run_node_classification",
    "run_rl",
    "topk_items",
    "train_bpr",
    "train_full_graph",
    "window_priorities",
]
