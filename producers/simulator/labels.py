"""Labels on disk: one JSON object per line, keys in a fixed order, written atomically."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["label_line", "write_labels"]


def label_line(label: dict[str, Any]) -> str:
    """One label as a JSON line (no newline)."""
    return json.dumps(label, separators=(", ", ": "), allow_nan=True)


def write_labels(path: str | Path, labels: Iterable[dict[str, Any]]) -> int:
    """Write labels as JSON Lines to `path` atomically; returns how many."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    count = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for label in labels:
                fh.write(label_line(label) + "\n")
                count += 1
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return count
