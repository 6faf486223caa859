"""Errors of the real-data importers."""

from __future__ import annotations

from schemas.errors import RanksightError

__all__ = ["ImportFormatError", "ImporterError"]


class ImporterError(RanksightError):
    """Root of the importer errors."""


class ImportFormatError(ImporterError):
    """An input file is not in the format the importer expects; names the file and the line."""

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {reason}")
