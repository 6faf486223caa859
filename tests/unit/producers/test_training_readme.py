"""The README's SDK snippet, run as written (with a stand-in model and loader), produces a correct job:
the launcher's identity, the team it names, one step per batch, a checkpoint."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from schemas.files import iter_container

# The README points at it; the snippet itself moved to docs/producing.md with the reference (issue 31.6).
README = Path(__file__).resolve().parents[3] / "docs" / "producing.md"


def _sdk_snippet() -> str:
    text = README.read_text()
    section = text[text.index("**Training SDK**") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "docs/producing.md's SDK section has a python block"
    return match.group(1)


class _Loss:
    def __init__(self, value: float) -> None:
        self.value = value

    def backward(self) -> None:
        pass

    def detach(self) -> float:
        return self.value


def test_readme_sdk_snippet_produces_a_job_with_identity_and_team(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "events.avro"
    for name in ("RANKSIGHT_JOB_ID", "RANKSIGHT_RUN_ID", "SLURM_JOB_ID", "RANKSIGHT_OWNER", "RANKSIGHT_TEAM"):
        monkeypatch.delenv(name, raising=False)
    # What torchrun sets for rank 0 of a 1-process job, plus where the events go.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "readme-run-7")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANKSIGHT_DESTINATION", f"file://{out}")
    monkeypatch.setenv("RANKSIGHT_RUNTIME_DIR", str(tmp_path / "run"))
    namespace: dict[str, Any] = {
        "loader": [[1.0], [2.0], [3.0]],
        "model": lambda batch: _Loss(batch[0]),
        "opt": type("Opt", (), {"step": lambda self: None})(),
        "lr": 0.1,
        "norm": 1.0,
        "bs": 32,
        "seq": 128,
        "save": lambda model: 4096,
        "checksum": "sha256:0",
    }
    exec(compile(_sdk_snippet(), "docs/producing.md", "exec"), namespace)
    events = list(iter_container(out))
    [started] = [e.record for e in events if e.type == "JobStarted"]
    assert (started["job_id"], started["team"], started["owner"]) == ("readme-run-7", "vision", "ada")
    steps = [e.record for e in events if e.type == "StepCompleted"]
    assert [(s["job_id"], s["rank"], s["step"]) for s in steps] == [("readme-run-7", 0, n) for n in range(3)]
    assert [s["loss"] for s in steps] == [1.0, 2.0, 3.0]
    assert all(s["forward_s"] is not None for s in steps)
    phases = [e.record["phase"] for e in events if e.type == "CheckpointEvent"]
    assert phases == ["started", "completed", "verified"]
    assert [e.record["job_id"] for e in events if e.type == "RankBound"] == ["readme-run-7"]
