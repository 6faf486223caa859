"""The rules of one config section run together over one topology, in engine order.

Rules that one detector class held before they were split into a file each share its config
section; a test that asserts what the section's rules do together (nothing fires, the state round
trips) drives them through `SectionRules`.
"""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.config import config_section
from streams.detectors import ALL_DETECTORS
from streams.detectors.base import Detector, Finding, Topology

__all__ = ["SectionRules"]


class SectionRules(Detector):
    """Every detector class of config section `section`, in engine order, over one topology."""

    def __init__(self, section: str, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        self.members = [cls(topology, params) for cls in ALL_DETECTORS if config_section(cls) == section]
        assert self.members, f"no detector reads section {section}"

    def observe(self, event: Event) -> list[Finding]:
        """Each member's findings on the event, in engine order."""
        return [f for d in self.members for f in d.observe(event)]

    def advance(self, watermark: int) -> list[Finding]:
        """Each member's findings at the watermark, in engine order."""
        return [f for d in self.members for f in d.advance(watermark)]

    def forget_job(self, job_id: str) -> None:
        """Every member forgets the job."""
        for d in self.members:
            d.forget_job(job_id)

    def state(self) -> dict[str, Any]:
        """The members' states by class name."""
        return {type(d).__name__: d.state() for d in self.members}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore every member from `state()`."""
        for d in self.members:
            d.load_state(state[type(d).__name__])
