"""The UI's guards as pure functions: which Host headers it answers, credentials scrubbed from URLs,
and record strings that spell the JSON encoder's placeholders."""

from __future__ import annotations

import json

from ui.guard import HostCheck, redact_credentials, redacted
from ui.pages.common import RawJson, to_json


def test_a_rebinding_host_name_is_refused_and_the_uis_names_are_answered() -> None:
    check = HostCheck(["ui.example.org"], machine_names=False)
    for header in (
        "127.0.0.1:8088",
        "[::1]:8088",
        "10.1.2.3",
        "localhost:8088",
        "LOCALHOST",
        "UI.example.org.",
        "ui.example.org:443",
        "app.localhost",
        None,
        "",
    ):
        assert check.allows(header), header
    for header in (
        "evil.example",
        "evil.example:8088",
        "127.0.0.1.nip.io",
        "localhost.evil",
        "ui.example.org:x",
        "[::1",
        "ui.example.org.evil",
    ):
        assert not check.allows(header), header


def test_credentials_in_urls_are_redacted_wherever_they_are() -> None:
    text = "cannot reach Alertmanager at http://admin:pw@am:9093/api/v2/silences: refused"
    assert (
        redact_credentials(text) == "cannot reach Alertmanager at http://***@am:9093/api/v2/silences: refused"
    )
    assert redact_credentials("https://token@x.example/a?b=c@d") == "https://***@x.example/a?b=c@d"
    assert (
        redact_credentials("mail admin@example.org, http://x.example/")
        == "mail admin@example.org, http://x.example/"
    )
    nested = redacted({"error": "http://u:p@h/", "silences": [{"comment": "see https://a:b@c/"}], "n": 1})
    assert "p@" not in json.dumps(nested) and nested["n"] == 1


def test_a_record_string_equal_to_a_placeholder_stays_a_string() -> None:
    for spelled in ("\u0000raw0\u0000", "\u0000raw1\u0000", '"\\u0000raw0\\u0000"'):
        data = {"owner": spelled, "cells": RawJson("[[1,2],[3,4]]"), "again": spelled}
        assert json.loads(to_json(data)) == {"owner": spelled, "cells": [[1, 2], [3, 4]], "again": spelled}
