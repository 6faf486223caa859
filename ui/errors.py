"""Errors of the UI, the report writer and their store."""

from __future__ import annotations

from schemas.errors import RanksightError

__all__ = ["NotFoundError", "UiError"]


class UiError(RanksightError):
    """The UI or a report could not be served or written."""


class NotFoundError(UiError):
    """A job or alert the store does not hold."""

    def __init__(self, kind: str, key: str) -> None:
        self.kind = kind
        self.key = key
        super().__init__(f"no {kind} {key!r} in the store")
