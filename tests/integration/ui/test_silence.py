"""Silencing from an alert page: the UI creates the silence in a real Alertmanager (author, comment,
expiry), behind its own authentication (a token, or a reverse proxy's user header; open only on
loopback), and refuses a request another site could have sent."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ranksight.commands.ui import silence_creator, silence_reader
from tests.integration.alerting.conftest import Alertmanager, start_alertmanager  # noqa: F401 (a fixture)
from tests.integration.ui.conftest import READY, UiStore, needs_chromium
from ui.server import UiServer

_CONFIG = "route:\n  receiver: 'null'\nreceivers:\n  - name: 'null'\n"
_ACTION = {"X-Ranksight-Action": "silence"}


@pytest.fixture
def alertmanager(start_alertmanager: Callable[[Path], Alertmanager], tmp_path: Path) -> Alertmanager:  # noqa: F811
    config = tmp_path / "am.yml"
    config.write_text(_CONFIG)
    return start_alertmanager(config)


@pytest.fixture
def serve(ui_store: UiStore, alertmanager: Alertmanager) -> Iterator[Callable[..., str]]:
    servers: list[UiServer] = []

    def start(host: str = "127.0.0.1", **auth: Any) -> str:
        server = UiServer(
            ui_store.client,
            host,
            0,
            silences=silence_reader(alertmanager.url),
            silence=silence_creator(alertmanager.url),
            **auth,
        )
        servers.append(server)
        return server.start().replace("0.0.0.0", "127.0.0.1")

    yield start
    for server in servers:
        server.stop()


def _firing(ui_store: UiStore) -> tuple[str, str]:
    [(alert_id, fingerprint)] = ui_store.client.query(
        "SELECT alert_id, any(fingerprint) FROM alerts GROUP BY alert_id ORDER BY min(starts_at) LIMIT 1"
    ).result_rows
    return str(alert_id), str(fingerprint)


def test_a_silence_is_created_in_alertmanager_with_author_comment_and_expiry(
    serve: Callable[..., str], ui_store: UiStore, alertmanager: Alertmanager
) -> None:
    url = serve()
    alert_id, fingerprint = _firing(ui_store)
    body = {"author": "oncall-ana", "comment": "INC-42: draining node-03", "minutes": 90}
    answer = httpx.post(f"{url}api/alerts/{alert_id}/silence", json=body, headers=_ACTION, timeout=30)
    assert answer.status_code == 201, answer.text
    silence_id = answer.json()["silence_id"]
    [made] = [
        s
        for s in httpx.get(f"{alertmanager.url}/api/v2/silences", timeout=10).json()
        if s["id"] == silence_id
    ]
    assert made["createdBy"] == "oncall-ana" and made["comment"] == body["comment"]
    assert {"name": "fingerprint", "value": fingerprint, "isRegex": False, "isEqual": True} in made[
        "matchers"
    ]
    assert made["status"]["state"] == "active"
    from datetime import datetime

    span = datetime.fromisoformat(made["endsAt"].replace("Z", "+00:00")) - datetime.fromisoformat(
        made["startsAt"].replace("Z", "+00:00")
    )
    assert 89 * 60 <= span.total_seconds() <= 91 * 60
    # Refused: no custom header (a cross-site form), no comment, an unknown alert.
    assert httpx.post(f"{url}api/alerts/{alert_id}/silence", json=body, timeout=30).status_code == 403
    bad = httpx.post(
        f"{url}api/alerts/{alert_id}/silence", json={**body, "comment": ""}, headers=_ACTION, timeout=30
    )
    assert bad.status_code == 400
    assert (
        httpx.post(f"{url}api/alerts/nope/silence", json=body, headers=_ACTION, timeout=30).status_code == 404
    )


def test_silencing_needs_the_token_or_the_proxys_user_and_is_closed_off_loopback(
    serve: Callable[..., str], ui_store: UiStore
) -> None:
    alert_id, _ = _firing(ui_store)
    body = {"author": "someone", "comment": "maintenance", "minutes": 30}
    with_token = serve(auth_token="s3cret")
    path = f"api/alerts/{alert_id}/silence"
    assert httpx.post(with_token + path, json=body, headers=_ACTION, timeout=30).status_code == 401
    wrong = {**_ACTION, "Authorization": "Bearer nope"}
    assert httpx.post(with_token + path, json=body, headers=wrong, timeout=30).status_code == 401
    right = {**_ACTION, "Authorization": "Bearer s3cret"}
    assert httpx.post(with_token + path, json=body, headers=right, timeout=30).status_code == 201
    proxied = serve(auth_header="X-Forwarded-User")
    assert httpx.post(proxied + path, json=body, headers=_ACTION, timeout=30).status_code == 401
    made = httpx.post(proxied + path, json=body, headers={**_ACTION, "X-Forwarded-User": "bob"}, timeout=30)
    assert made.status_code == 201 and made.json()["author"] == "bob"  # the proxy's user, not the form's
    exposed = serve(host="0.0.0.0")
    refused = httpx.post(exposed + path, json=body, headers=_ACTION, timeout=30)
    assert refused.status_code == 401 and "--auth-token" in refused.json()["error"]


@needs_chromium
def test_the_alert_page_silences_from_its_form(
    serve: Callable[..., str], ui_store: UiStore, alertmanager: Alertmanager, browser: Any
) -> None:
    url = serve()
    [(alert_id,)] = ui_store.client.query(
        "SELECT alert_id FROM alerts GROUP BY alert_id HAVING argMax(status, ts) = 'firing' LIMIT 1"
    ).result_rows
    tab = browser.new_page()
    tab.goto(f"{url}alerts/{alert_id}")
    tab.wait_for_function(READY, timeout=60_000)
    tab.fill("#silence-form input[name='author']", "ana")
    tab.fill("#silence-form input[name='comment']", "looking into it")
    tab.click("#silence-form button[type='submit']")
    tab.wait_for_function(
        "() => document.getElementById('silence-result').textContent.startsWith('silenced')"
    )
    silences = httpx.get(f"{alertmanager.url}/api/v2/silences", timeout=10).json()
    assert any(s["createdBy"] == "ana" and s["comment"] == "looking into it" for s in silences)
    tab.close()
