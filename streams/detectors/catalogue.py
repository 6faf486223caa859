"""The rule catalogue: what is constant about each rule, in one table (`streams/rules.yaml`).

Every rule's name, category, severity, invariant, runbook and suspected layer are one entry of
`streams/rules.yaml`, read once; a rule module takes its `Rule` from there at the top
(`X = catalogued("x")`), and its findings state only what varies: the identity, the time, the
evidence (`Rule.finding`). An invariant that names a knob is a template (`Rule.says` fills it). A
rule whose severity, category or layer depends on the evidence (an XID class, an OOM, the kind of a
rank's failure) declares the usual one and its finding names the other. `catalogue()` lists every
rule the detectors take, for docs and checks; a test holds the table and the detectors equal.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import yaml

from streams.detectors.base import Category, Finding, Severity

if TYPE_CHECKING:
    from streams.detectors.placement import Place

__all__ = ["RULES_PATH", "RUNBOOKS", "Rule", "catalogue", "catalogued", "table"]

RUNBOOKS = "docs/runbooks"  # each rule's runbook is RUNBOOKS/<runbook>.md in the repository
RULES_PATH = Path(__file__).resolve().parent.parent / "rules.yaml"
_FIELDS = ("category", "severity", "invariant", "suspected_layer", "runbook")


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


@cache
def table() -> dict[str, Rule]:
    """Every rule of `streams/rules.yaml`, checked: known fields, a category and severity the
    engine knows, an invariant. A shipped file that breaks these is a bug: it fails at import."""
    raw = yaml.safe_load(RULES_PATH.read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ValueError(f"{RULES_PATH}: expected one mapping of rule name -> fields")
    out: dict[str, Rule] = {}
    for name, fields in raw.items():
        where = f"{RULES_PATH}: rule {name!r}"
        if not isinstance(fields, dict) or not isinstance(fields.get("invariant"), str):
            raise ValueError(f"{where}: expected fields with at least an invariant")
        unknown = sorted(set(fields) - set(_FIELDS))
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(_FIELDS)})")
        if fields.get("category") not in get_args(Category):
            raise ValueError(f"{where}: category must be one of {', '.join(get_args(Category))}")
        if fields.get("severity") not in get_args(Severity):
            raise ValueError(f"{where}: severity must be one of {', '.join(get_args(Severity))}")
        out[str(name)] = Rule(
            str(name),
            category=fields["category"],
            severity=fields["severity"],
            invariant=fields["invariant"],
            suspected_layer=str(fields.get("suspected_layer", "unknown")),
            runbook=str(fields.get("runbook", "")),
        )
    return out


def catalogued(name: str) -> Rule:
    """The catalogue's entry for rule `name` (a rule module's declaration of the rule it raises)."""
    try:
        return table()[name]
    except KeyError:
        raise KeyError(f"rule {name!r} is not in {RULES_PATH}: add its entry there") from None
