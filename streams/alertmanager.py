"""Bridge from ranksight Alert records to Prometheus Alertmanager's `POST /api/v2/alerts`.

Alertmanager resolves an alert on its own when it is not re-sent within `resolve_timeout`
(default 5 min), so firing alerts are re-sent every `resend_s` (default 60 s) until resolved;
a resolved record is sent once with `endsAt` set and forgotten.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx

from streams.errors import StreamsError

__all__ = ["AlertForwarder", "AlertmanagerClient", "AlertmanagerError", "to_alertmanager"]

# Alert fields copied into labels (identity: Alertmanager groups and deduplicates by labels).
_LABELS = (
    "team",
    "job_id",
    "node",
    "rank",
    "gpu_uuid",
    "gpu_index",
    "severity",
    "category",
    "cluster",
    "receiver",
)
_ANNOTATIONS = (
    "summary",
    "runbook_url",
    "invariant",
    "suspected_layer",
    "observed",
    "expected",
    "baseline",
    "owner",
)


class AlertmanagerError(StreamsError):
    """Alertmanager could not be reached or rejected the alerts."""


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def to_alertmanager(record: dict[str, Any], generator_url: str = "") -> dict[str, Any]:
    """One Alertmanager v2 alert (labels, annotations, startsAt, endsAt for resolved, generatorURL)."""
    labels = {"alertname": str(record["rule"]), "fingerprint": str(record["fingerprint"])}
    for name in _LABELS:
        value = record.get(name)
        if value is not None and value != "":
            labels[name] = str(value)
    for name, value in sorted((record.get("labels") or {}).items()):
        labels.setdefault(str(name), str(value))
    annotations = {}
    for name in _ANNOTATIONS:
        value = record.get(name)
        if value is not None and value != "":
            annotations[name] = str(value)
    alert: dict[str, Any] = {
        "labels": labels,
        "annotations": annotations,
        "startsAt": _iso(int(record["starts_at"])),
    }
    if record.get("status") == "resolved":
        alert["endsAt"] = _iso(int(record.get("ends_at") or record["ts"]))
    if generator_url:
        alert["generatorURL"] = generator_url
    return alert


class AlertmanagerClient:
    """POSTs lists of alerts to `<url>/api/v2/alerts`."""

    def __init__(self, url: str, *, timeout_s: float = 10.0, client: httpx.Client | None = None) -> None:
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self._client = client or httpx.Client(timeout=timeout_s)

    def post(self, alerts: list[dict[str, Any]]) -> None:
        """Send alerts; raise `AlertmanagerError` on a connection error or a non-2xx answer."""
        if not alerts:
            return
        try:
            response = self._client.post(self.url, json=alerts)
        except httpx.HTTPError as exc:
            raise AlertmanagerError(f"cannot reach Alertmanager at {self.url}: {exc}") from None
        if response.status_code // 100 != 2:
            raise AlertmanagerError(
                f"Alertmanager at {self.url} answered {response.status_code}: {response.text[:200]}"
            )

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()


class AlertForwarder:
    """Keeps firing alerts and re-sends them every `resend_s`; sends resolutions once."""

    def __init__(
        self,
        post: Callable[[list[dict[str, Any]]], None],
        *,
        resend_s: float = 60.0,
        generator_url: str = "",
        team: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._post = post
        self.resend_s = resend_s
        self.generator_url = generator_url
        self.team = team
        self._clock = clock
        # key (fingerprint, team) -> (payload, last sent at)
        self._firing: dict[tuple[str, str], tuple[dict[str, Any], float]] = {}
        self.sent = 0

    @property
    def firing(self) -> int:
        """Number of alerts being kept alive."""
        return len(self._firing)

    def handle(self, record: dict[str, Any]) -> bool:
        """Take one Alert record; send it now; return False when filtered out by team."""
        if self.team is not None and record.get("team") != self.team:
            return False
        key = (str(record["fingerprint"]), str(record.get("team", "")))
        payload = to_alertmanager(record, self.generator_url)
        if record.get("status") == "resolved":
            self._firing.pop(key, None)
        else:
            self._firing[key] = (payload, self._clock())
        self._post([payload])
        self.sent += 1
        return True

    def due(self) -> list[dict[str, Any]]:
        """Firing alerts not sent for `resend_s`."""
        now = self._clock()
        return [p for p, last in self._firing.values() if now - last >= self.resend_s]

    def tick(self) -> int:
        """Re-send the firing alerts that are due; return how many were sent."""
        now = self._clock()
        due_keys = [k for k, (_, last) in sorted(self._firing.items()) if now - last >= self.resend_s]
        if not due_keys:
            return 0
        self._post([self._firing[k][0] for k in due_keys])
        for k in due_keys:
            self._firing[k] = (self._firing[k][0], now)
        self.sent += len(due_keys)
        return len(due_keys)
