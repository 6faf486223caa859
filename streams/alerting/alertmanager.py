"""Bridge from ranksight Alert records to Prometheus Alertmanager's `POST /api/v2/alerts`.

Delivery survives restarts. The forwarder is a pure state machine over Alert records; the
`alerts forward` command feeds it from a Kafka consumer group and commits offsets only after
Alertmanager accepted what they carried. On start it *rebuilds* its firing set by re-reading
the topic from a lookback point up to the committed offset (`restore`, nothing sent), then
re-sends every alert still firing at once, before the `endsAt` of its last send can lapse.

Every firing alert is sent with `endsAt` = now + `keepalive_s` (default 4 x `resend_s`, as
Prometheus does) and re-sent every `resend_s`, so Alertmanager keeps it firing while ranksight
does and resolves it by itself only when the forwarder is gone for longer than `keepalive_s`.
A resolved record is sent once with its real `endsAt` and forgotten. Records are coalesced per
alert (last state wins) within a batch, so a backlog that holds a firing and its resolution
never pages the firing one.

Runbook links: an alert whose `runbook_url` is not absolute (the engine's default base is the
repository path `docs/runbooks/`) is sent with `<runbook base>/<rule>`, the base being
`runbook_base_url` when given, else `<ui_url>/runbooks/` (the UI serves every runbook there).

Job labels are claims, not control: only the names an operator allowlists (`job_labels`) reach
Alertmanager, renamed to its label syntax (`[a-zA-Z_][a-zA-Z0-9_]*`, `label_name`), never one of
the names ranksight itself sets (`RESERVED_LABELS`: identity, `inhibited_by`, `receiver`, the
routing keys). An alert Alertmanager refuses (HTTP 400/422) is set aside with the reason
(`take_refused`, which `alerts forward` dead-letters) and the rest go on: one bad alert never
holds the others back or the offsets uncommitted.

Silences are Alertmanager's acknowledgement: `read_silences` reads them (`GET /api/v2/silences`)
and which ranksight alerts each one mutes (`GET /api/v2/alerts`), for pages that show them.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from schemas.progress import describe
from streams.errors import StreamsError

__all__ = [
    "LABEL_FIELDS",
    "RESERVED_LABELS",
    "AlertForwarder",
    "AlertmanagerClient",
    "AlertmanagerError",
    "AlertmanagerRefused",
    "Silence",
    "SilenceReport",
    "alert_key",
    "check_job_labels",
    "coalesce",
    "generator_url",
    "label_name",
    "read_silences",
    "redact_url",
    "round_observed",
    "runbook_link",
    "to_alertmanager",
]

# Alert fields copied into labels (identity: Alertmanager groups and deduplicates by labels).
# `job` is the conventional Alertmanager/Prometheus name for the job identity, `job_id` stays for
# existing routes. run_id is deliberately not a label: a restarted run is the same alert.
# `inhibited_by` (the alert_id of the cause that mutes it) is a label so Alertmanager routes and
# silences can use the engine's verdict, including mutes Alertmanager cannot work out by itself.
LABEL_FIELDS: tuple[str, ...] = (
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
    "inhibited_by",
)
# Names a job label can never take, whatever the allowlist says: the alert's identity and what
# Alertmanager routes, groups, inhibits and silences on.
RESERVED_LABELS: frozenset[str] = frozenset({"alertname", "fingerprint", "job", *LABEL_FIELDS})
_LABEL_VALUE_CHARS = 1024  # a label value longer than this is cut (a claim, not a page's content)
_NOT_LABEL_CHAR = re.compile(r"[^a-zA-Z0-9_]")
_ANNOTATIONS = (
    "summary",
    "runbook_url",
    "run_id",
    "invariant",
    "suspected_layer",
    "observed",
    "expected",
    "baseline",
    "owner",
    "group_key",
    "current_step",
    "image",  # where the job runs (issue 35.5): context for whoever acts, never a label
    "workspace",
)
_NUMERIC_ANNOTATIONS = ("observed", "expected")


class AlertmanagerError(StreamsError):
    """Alertmanager could not be reached or rejected the alerts."""


class AlertmanagerRefused(AlertmanagerError):
    """Alertmanager answered that the alerts are invalid (400/422): re-sending them cannot help."""

    def __init__(self, message: str, status: int, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def label_name(name: str) -> str:
    """A job label's name in Alertmanager's label syntax: other characters become `_`, no leading digit."""
    cleaned = _NOT_LABEL_CHAR.sub("_", name)
    return cleaned if cleaned and not cleaned[0].isdigit() else "_" + cleaned


def check_job_labels(names: Iterable[str]) -> tuple[str, ...]:
    """The job-label allowlist, refused (ValueError) when a name would land on a reserved label."""
    names = tuple(dict.fromkeys(names))
    for name in names:
        if label_name(name) in RESERVED_LABELS:
            raise ValueError(
                f"job label {name!r} would set Alertmanager's {label_name(name)!r}, which ranksight "
                "sets itself; choose other job labels"
            )
    return names


def redact_url(url: str) -> str:
    """`url` with any password in it replaced by `***` (`http://admin:***@am:9093`), for messages and logs."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}{slash}{path}"


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def round_observed(value: Any) -> str:
    """A measured value as people read it: 3 significant digits (`1.41`, `97.3`, `12300`)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    return f"{value:.3g}" if abs(value) < 1e6 else f"{value:.4g}"


def generator_url(record: dict[str, Any], ui_url: str) -> str:
    """The UI's page of the alert (`<ui>/alerts/<alert_id>`), or "" without a UI."""
    if not ui_url:
        return ""
    return f"{ui_url.rstrip('/')}/alerts/{record['alert_id']}"


def runbook_link(record: dict[str, Any], *, runbook_base_url: str = "", ui_url: str = "") -> str:
    """The alert's runbook as an absolute URL when it can be one.

    An absolute `runbook_url` (the engine was given an absolute base) is kept. A relative one is
    rebuilt from `runbook_base_url`, else from the UI (`<ui_url>/runbooks/<rule>`); with neither
    it stays as it is.
    """
    current = str(record.get("runbook_url") or "")
    if "://" in current:
        return current
    base = runbook_base_url or (f"{ui_url.rstrip('/')}/runbooks/" if ui_url else "")
    if not base:
        return current
    return f"{base if base.endswith('/') else base + '/'}{record['rule']}"


def alert_key(record: dict[str, Any]) -> tuple[str, str]:
    """The identity of one alert towards Alertmanager: (fingerprint, team)."""
    return str(record["fingerprint"]), str(record.get("team") or "")


def coalesce(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last state of each alert, in the order of those last states."""
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for record in records:
        key = alert_key(record)
        last.pop(key, None)  # re-insert: keep the order of the last appearance
        last[key] = record
    return list(last.values())


def to_alertmanager(
    record: dict[str, Any],
    *,
    ui_url: str = "",
    ends_at_ms: int | None = None,
    runbook_base_url: str = "",
    job_labels: Iterable[str] = (),
) -> dict[str, Any]:
    """One Alertmanager v2 alert: labels, annotations, startsAt, endsAt, generatorURL.

    A resolved record gets its own `ends_at`; a firing one `ends_at_ms` when given (the
    keep-alive deadline), else no `endsAt` (Alertmanager's `resolve_timeout` applies). The
    `runbook_url` annotation is absolute whenever a base is known (`runbook_link`). Of the job's
    labels only those named in `job_labels` are sent, as `label_name`s, never a reserved one.
    """
    labels = {"alertname": str(record["rule"]), "fingerprint": str(record["fingerprint"])}
    for name in LABEL_FIELDS:
        value = record.get(name)
        if value is not None and value != "":
            labels[name] = str(value)
    if record.get("job_id"):
        labels["job"] = str(record["job_id"])
    claimed = record.get("labels") or {}
    for name in job_labels:
        value = claimed.get(name)
        shown = label_name(name)
        if value is None or value == "" or shown in RESERVED_LABELS:
            continue
        labels.setdefault(shown, str(value)[:_LABEL_VALUE_CHARS])
    annotations = {}
    for name in _ANNOTATIONS:
        value = record.get(name)
        if value is None or value == "" or value == []:
            continue
        if name in _NUMERIC_ANNOTATIONS:
            annotations[name] = round_observed(value)
        elif isinstance(value, list):
            annotations[name] = ",".join(str(v) for v in value)
        else:
            annotations[name] = str(value)
    # How far the run is and the time left at its recent step rate, in words (issue 23.1).
    progress = describe(
        record.get("target_kind"), record.get("target"), record.get("target_done"), record.get("eta_s")
    )
    if progress:
        annotations["progress"] = progress
    eta = record.get("eta_s")
    if isinstance(eta, int | float) and math.isfinite(eta):
        annotations["eta_s"] = str(round(eta))  # whole seconds, for templates that do arithmetic
    alert: dict[str, Any] = {
        "labels": labels,
        "annotations": annotations,
        "startsAt": _iso(int(record["starts_at"])),
    }
    if record.get("status") == "resolved":
        alert["endsAt"] = _iso(int(record.get("ends_at") or record["ts"]))
    elif ends_at_ms is not None:
        alert["endsAt"] = _iso(ends_at_ms)
    runbook = runbook_link(record, runbook_base_url=runbook_base_url, ui_url=ui_url)
    if runbook:
        annotations["runbook_url"] = runbook
    url = generator_url(record, ui_url)
    if url:
        alert["generatorURL"] = url
    return alert


class AlertmanagerClient:
    """POSTs lists of alerts to `<url>/api/v2/alerts`."""

    def __init__(self, url: str, *, timeout_s: float = 10.0, client: httpx.Client | None = None) -> None:
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.shown_url = redact_url(self.url)  # what messages say: never the password
        self._client = client or httpx.Client(timeout=timeout_s)

    def _hidden(self, text: str) -> str:
        """`text` with the URL's password taken out (httpx may quote the URL it failed on)."""
        text = text.replace(self.url, self.shown_url)
        try:
            password = httpx.URL(self.url).password
        except httpx.InvalidURL:
            password = None
        return text.replace(password, "***") if password else text

    def post(self, alerts: list[dict[str, Any]]) -> None:
        """Send alerts; raise `AlertmanagerError` on a connection error or a non-2xx answer.

        A 400/422 (Alertmanager validated the alerts and refused them) raises `AlertmanagerRefused`.
        """
        if not alerts:
            return
        try:
            response = self._client.post(self.url, json=alerts)
        except httpx.HTTPError as exc:
            raise AlertmanagerError(
                self._hidden(f"cannot reach Alertmanager at {self.shown_url}: {exc}")
            ) from None
        if response.status_code // 100 != 2:
            reason = self._hidden(response.text[:200].strip())
            message = f"Alertmanager at {self.shown_url} answered {response.status_code}: {reason}"
            if response.status_code in (400, 422):
                raise AlertmanagerRefused(message, response.status_code, reason)
            raise AlertmanagerError(message)

    def _get(self, path: str) -> Any:
        url = self.url.removesuffix("/api/v2/alerts") + path
        shown = redact_url(url)
        try:
            response = self._client.get(url)
        except httpx.HTTPError as exc:
            raise AlertmanagerError(self._hidden(f"cannot reach Alertmanager at {shown}: {exc}")) from None
        if response.status_code // 100 != 2:
            raise AlertmanagerError(
                self._hidden(
                    f"Alertmanager at {shown} answered {response.status_code}: {response.text[:200]}"
                )
            )
        try:
            return response.json()
        except ValueError:
            raise AlertmanagerError(f"Alertmanager at {shown} answered something that is not JSON") from None

    def silences(self) -> list[dict[str, Any]]:
        """Every silence Alertmanager keeps (`GET /api/v2/silences`), as it answers."""
        data = self._get("/api/v2/silences")
        return data if isinstance(data, list) else []

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert Alertmanager holds (`GET /api/v2/alerts`), silenced and inhibited ones included."""
        data = self._get("/api/v2/alerts")
        return data if isinstance(data, list) else []

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()


@dataclass(frozen=True)
class Silence:
    """One Alertmanager silence: an acknowledgement with its author, comment and time span."""

    id: str
    state: str  # active, pending or expired
    matchers: tuple[tuple[str, str, str], ...]  # (label, operator =, !=, =~ or !~, value)
    created_by: str
    comment: str
    starts_at: str
    ends_at: str

    def matches(self, labels: dict[str, str]) -> bool:
        """True when every matcher holds for these labels (regexes anchored, as Alertmanager does)."""
        for name, op, value in self.matchers:
            have = labels.get(name, "")
            if op in ("=~", "!~"):
                try:
                    hit = re.fullmatch(value, have) is not None
                except re.error:
                    return False
            else:
                hit = have == value
            if hit != (op in ("=", "=~")):
                return False
        return True

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (for a UI)."""
        return {
            "id": self.id,
            "state": self.state,
            "matchers": [{"name": n, "op": o, "value": v} for n, o, v in self.matchers],
            "created_by": self.created_by,
            "comment": self.comment,
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
        }


@dataclass(frozen=True)
class SilenceReport:
    """Silences and the ranksight alerts they mute, keyed like the forwarder: (fingerprint, team)."""

    silences: tuple[Silence, ...]
    silenced: dict[tuple[str, str], tuple[str, ...]]

    def active(self) -> list[Silence]:
        """The silences in force now."""
        return [s for s in self.silences if s.state == "active"]

    def silenced_by(self, record: dict[str, Any]) -> tuple[str, ...]:
        """Ids of the silences muting this Alert record in Alertmanager (empty: not silenced)."""
        return self.silenced.get(alert_key(record), ())


def _silence(data: dict[str, Any]) -> Silence:
    matchers = []
    for m in data.get("matchers") or []:
        equal, regex = m.get("isEqual", True), m.get("isRegex", False)
        op = ("=~" if equal else "!~") if regex else ("=" if equal else "!=")
        matchers.append((str(m.get("name", "")), op, str(m.get("value", ""))))
    return Silence(
        id=str(data.get("id", "")),
        state=str((data.get("status") or {}).get("state", "")),
        matchers=tuple(matchers),
        created_by=str(data.get("createdBy", "")),
        comment=str(data.get("comment", "")),
        starts_at=str(data.get("startsAt", "")),
        ends_at=str(data.get("endsAt", "")),
    )


def read_silences(url: str, *, timeout_s: float = 3.0, client: httpx.Client | None = None) -> SilenceReport:
    """The silences of the Alertmanager at `url` and which ranksight alerts they mute now.

    Raises `AlertmanagerError` (one sentence) when it cannot be reached or answers nonsense.
    """
    am = AlertmanagerClient(url, timeout_s=timeout_s, client=client)
    try:
        silences = tuple(_silence(s) for s in am.silences() if isinstance(s, dict))
        silenced: dict[tuple[str, str], tuple[str, ...]] = {}
        for alert in am.alerts():
            labels = alert.get("labels") or {}
            ids = tuple((alert.get("status") or {}).get("silencedBy") or ())
            if ids and "fingerprint" in labels:
                silenced[(str(labels["fingerprint"]), str(labels.get("team", "")))] = ids
    finally:
        if client is None:
            am.close()
    return SilenceReport(silences=silences, silenced=silenced)


def _labels_changed(before: dict[str, Any], record: dict[str, Any]) -> bool:
    """True when the alert's Alertmanager labels differ between two records of it."""
    return to_alertmanager(before)["labels"] != to_alertmanager(record)["labels"]


class AlertForwarder:
    """The firing set: restores it from history, sends new states, keeps firing alerts alive.

    `clock` is wall-clock seconds (it sets `endsAt`); tests pass a fake one.
    """

    def __init__(
        self,
        post: Callable[[list[dict[str, Any]]], None],
        *,
        resend_s: float = 60.0,
        keepalive_s: float | None = None,
        ui_url: str = "",
        team: str | None = None,
        clock: Callable[[], float] = time.time,
        runbook_base_url: str = "",
        job_labels: Iterable[str] = (),
    ) -> None:
        self._post = post
        self.runbook_base_url = runbook_base_url
        self.job_labels = check_job_labels(job_labels)
        self.resend_s = resend_s
        self.keepalive_s = 4 * resend_s if keepalive_s is None else keepalive_s
        if self.keepalive_s <= resend_s:
            raise ValueError("keepalive_s must be longer than resend_s, or firing alerts lapse between sends")
        self.ui_url = ui_url
        self.team = team
        self._clock = clock
        # key (fingerprint, team) -> (latest firing record, last sent at; -inf = never by us)
        self._firing: dict[tuple[str, str], tuple[dict[str, Any], float]] = {}
        self._unsent_resolved: dict[tuple[str, str], dict[str, Any]] = {}
        self._refused: list[tuple[dict[str, Any], AlertmanagerRefused]] = []
        self.sent = 0
        self.restored = 0
        self.refused = 0

    @property
    def firing(self) -> int:
        """Number of alerts being kept alive."""
        return len(self._firing)

    @property
    def settled(self) -> bool:
        """True when every state taken so far reached Alertmanager (offsets may be committed)."""
        return not self._unsent_resolved and all(last > -math.inf for _, last in self._firing.values())

    def firing_records(self) -> list[dict[str, Any]]:
        """The firing alerts' latest records, by key."""
        return [record for _, (record, _) in sorted(self._firing.items())]

    def _wanted(self, record: dict[str, Any]) -> bool:
        return self.team is None or record.get("team") == self.team

    def _payload(self, record: dict[str, Any], now: float) -> dict[str, Any]:
        ends = None if record.get("status") == "resolved" else int((now + self.keepalive_s) * 1000)
        return to_alertmanager(
            record,
            ui_url=self.ui_url,
            ends_at_ms=ends,
            runbook_base_url=self.runbook_base_url,
            job_labels=self.job_labels,
        )

    def restore(self, record: dict[str, Any]) -> None:
        """Take one record from before the committed offset: update the firing set, send nothing."""
        if not self._wanted(record):
            return
        key = alert_key(record)
        if record.get("status") == "resolved":
            self._firing.pop(key, None)
        else:
            # Sent by the previous forwarder at an unknown time: due at the next tick.
            self._firing[key] = (record, -math.inf)
        self.restored += 1

    def handle(self, record: dict[str, Any]) -> bool:
        """Take one new Alert record and send it now; False when filtered out by team."""
        return bool(self.handle_batch([record]))

    def handle_batch(self, records: Iterable[dict[str, Any]]) -> int:
        """Take new records, coalesced per alert, and send their last states in one post.

        A resolution is sent even when the firing set never held the alert (it may have fired
        before the lookback); it never pages. Raises `AlertmanagerError` after updating the set,
        so the next `tick` retries what did not go out.
        """
        now = self._clock()
        out: list[dict[str, Any]] = []
        for record in coalesce(r for r in records if self._wanted(r)):
            key = alert_key(record)
            before = self._firing.get(key)
            if before is not None and _labels_changed(before[0], record):
                # A cause fired after its symptom and muted it: `inhibited_by` is a label, so
                # Alertmanager holds the unmuted alert apart; resolve it rather than let it lapse.
                ended = max(int(now * 1000), int(record.get("ts") or 0), int(before[0]["starts_at"]))
                out.append({**before[0], "status": "resolved", "ends_at": ended})
            if record.get("status") == "resolved":
                self._firing.pop(key, None)
                self._unsent_resolved[key] = record
            else:
                self._firing[key] = (record, -math.inf)
            out.append(record)
        if out:
            self._send(out, now)
        return len(out)

    def take_refused(self) -> list[tuple[dict[str, Any], AlertmanagerRefused]]:
        """The alerts Alertmanager refused since the last call, each with its reason (for the dead letters)."""
        refused, self._refused = self._refused, []
        return refused

    def holds(self, key: tuple[str, str]) -> bool:
        """Whether the alert `key` (`alert_key`) is firing or has a resolution still to send."""
        return key in self._firing or key in self._unsent_resolved

    def _refuse(self, record: dict[str, Any], refusal: AlertmanagerRefused) -> None:
        """Set aside an alert Alertmanager refused: never re-sent, it no longer holds the offsets back."""
        key = alert_key(record)
        if record.get("status") == "resolved":
            if self._unsent_resolved.get(key) is record:
                del self._unsent_resolved[key]
        elif key in self._firing and self._firing[key][0] is record:
            del self._firing[key]
        self._refused.append((record, refusal))
        self.refused += 1

    def _send(self, records: list[dict[str, Any]], now: float) -> None:
        try:
            self._post([self._payload(r, now) for r in records])
        except AlertmanagerRefused as exc:
            # Alertmanager keeps the valid alerts of a batch and names only what it refused:
            # send each alone to know which (re-sending an accepted alert is harmless).
            if len(records) == 1:
                self._refuse(records[0], exc)
                return
            for record in records:
                self._send([record], now)
            return
        for record in records:
            key = alert_key(record)
            if record.get("status") == "resolved":
                self._unsent_resolved.pop(key, None)
            elif key in self._firing:
                self._firing[key] = (record, now)
        self.sent += len(records)

    def due(self) -> list[dict[str, Any]]:
        """Records to send at this tick: unsent resolutions, then firing alerts not sent for `resend_s`."""
        now = self._clock()
        firing = [r for _, (r, last) in sorted(self._firing.items()) if now - last >= self.resend_s]
        return list(self._unsent_resolved.values()) + firing

    def tick(self) -> int:
        """Send what is due; return how many alerts went out."""
        due = self.due()
        if not due:
            return 0
        self._send(due, self._clock())
        return len(due)
