"""The training SDK: report steps, checkpoints, faults and job state from inside the training loop."""

from producers.training.identity import RankIdentity, resolve_identity
from producers.training.reporter import SEGMENTS, CheckpointReport, Reporter, Step, visible_gpu

__all__ = [
    "SEGMENTS",
    "CheckpointReport",
    "RankIdentity",
    "Reporter",
    "Step",
    "resolve_identity",
    "visible_gpu",
]
