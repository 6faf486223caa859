"""Converters of public real training data to ranksight events (offline replay fixtures).

- `alibaba_pai`: Alibaba PAI mini-batch times per worker (`job_N_norm.csv`) -> StepCompleted.
- `nanogpt`: modded-nanogpt speedrun logs -> StepCompleted (rank 0) and ValidationResult.
- `pythia`: Pythia per-step training loss (`70m-0.csv`) -> StepCompleted.

Each converter also emits the JobStarted/RankBound that give the steps a job identity, and a
final JobStateChanged `completed`. None of them synthesises telemetry.
"""

from __future__ import annotations

from producers.importers.alibaba_pai import convert_pai
from producers.importers.errors import ImporterError, ImportFormatError
from producers.importers.nanogpt import convert_nanogpt
from producers.importers.pythia import convert_pythia

__all__ = ["ImportFormatError", "ImporterError", "convert_nanogpt", "convert_pai", "convert_pythia"]
