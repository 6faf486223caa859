"""The training SDK: report steps, checkpoints, evaluations, faults and job state from inside the training loop.

Framework callbacks: `producers.training.lightning.RanksightCallback` (PyTorch Lightning) and
`producers.training.hf.RanksightCallback` (Hugging Face `Trainer`); they import their framework
only when used.
"""

from producers.training.identity import RankIdentity, resolve_identity
from producers.training.reporter import (
    SEGMENTS,
    CheckpointReport,
    EvaluationReport,
    Reporter,
    Step,
    visible_gpu,
)
from producers.training.timing import CudaTimer, HostTimer, SegmentTimer

__all__ = [
    "SEGMENTS",
    "CheckpointReport",
    "CudaTimer",
    "EvaluationReport",
    "HostTimer",
    "RankIdentity",
    "Reporter",
    "SegmentTimer",
    "Step",
    "resolve_identity",
    "visible_gpu",
]
