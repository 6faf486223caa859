"""The rule catalogue: what is constant about each rule, declared once beside the rule's logic.

A rule module declares its `Rule` (name, category, severity, invariant, runbook, suspected layer) at
the top, and its findings state only what varies: the identity, the time, the evidence
(`Rule.finding`). An invariant that names a knob is a template (`Rule.says` fills it). A rule whose
severity, category or layer depends on the evidence (an XID class, an OOM, the kind of a rank's
failure) declares the usual one and its finding names the other. `catalogue()` lists every rule
the detectors declare, for docs and checks.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streams.detectors.base import Category, Finding, Severity

if TYPE_CHECKING:
    from streams.detectors.placement import Place

__all__ = ["RUNBOOKS", "Rule", "catalogue"]

RUNBOOKS = "docs/runbooks"  # each rule's runbook is RUNBOOKS/<runbook>.md in the repository


@dataclass(frozen=True, slots=True)
class Rule:
    """What every alert of one rule says whatever the evidence."""

    name: str
    category: Category
    severity: Severity
    invariant: str  # what must hold; `{name}` fields are filled from the rule's knobs (`says`)
    suspected_layer: str = "unknown"
    runbook: str = ""  # the runbook's file name without `.md` (default: the rule's name)

    @property
    def runbook_path(self) -> str:
        """Where the rule's runbook lives in the repository."""
        return f"{RUNBOOKS}/{self.runbook or self.name}.md"

    def says(self, **knobs: Any) -> str:
        """The invariant with the rule's knob values filled in."""
        return self.invariant.format(**knobs)

    def finding(
        self, key: tuple[str, ...], active: bool, ts: int, *, place: Place | None = None, **evidence: Any
    ) -> Finding:
        """A finding of this rule: the catalogue's fields, then what the caller states (identity,
        evidence, and where it varies, the severity, category, invariant or layer). `place`: the
        node and GPU of the rank it is about."""
        fields: dict[str, Any] = {
            "category": self.category,
            "severity": self.severity,
            "invariant": self.invariant,
            "suspected_layer": self.suspected_layer,
        }
        if place is not None:
            fields.update(node=place.node, gpu_uuid=place.gpu_uuid, gpu_index=place.gpu_index)
        fields.update(evidence)
        return Finding(rule=self.name, key=key, active=active, ts=ts, **fields)

    def for_job(self, job_id: str, active: bool, ts: int, **evidence: Any) -> Finding:
        """A finding whose identity is the job."""
        return self.finding((job_id,), active, ts, job_id=job_id, **evidence)

    def for_rank(
        self, job_id: str, rank: int, place: Place, active: bool, ts: int, **evidence: Any
    ) -> Finding:
        """A finding whose identity is a rank of the job, on its node and GPU (`place`)."""
        return self.finding(
            (job_id, str(rank)), active, ts, place=place, job_id=job_id, rank=rank, **evidence
        )


def catalogue() -> dict[str, Rule]:
    """Every rule a detector module declares, by name: a detector's own module and its bases'
    (the imbalance detector's rules live in `straggler.py`, `gpu_imbalance.py`, ...)."""
    from streams.detectors import ALL_DETECTORS  # late: rule modules import this one

    out: dict[str, Rule] = {}
    for cls in ALL_DETECTORS:
        for module in dict.fromkeys(klass.__module__ for klass in cls.__mro__):
            for value in vars(sys.modules[module]).values():
                if isinstance(value, Rule):
                    out[value.name] = value
    return dict(sorted(out.items()))
