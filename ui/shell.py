"""The HTML shell of every page: served pages load the assets by URL, reports inline them.

Record strings are data, never markup: the shells carry them only HTML-escaped (titles) or as JSON
the page script reads and inserts as text nodes. Served pages run under `CONTENT_SECURITY_POLICY`
(no inline script at all); a report, one self-contained file, runs under its own policy in a
`<meta>` element that allows exactly its two inlined scripts and its stylesheet by hash, and keeps
its data in a non-executable `application/json` block.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from functools import cache
from importlib import resources
from typing import Any

from ui.errors import UiError

__all__ = [
    "ASSETS",
    "CONTENT_SECURITY_POLICY",
    "REPORT_DATA_ID",
    "asset_text",
    "inline_json",
    "page_html",
    "report_html",
]

ASSETS = {"app.js": "app.js", "style.css": "style.css", "echarts.min.js": "vendor/echarts.min.js"}

# Every served response carries it: scripts and styles only from this server, no inline script,
# no eval, no plugins, no framing, no form posts; the page talks to its own /api only.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# The id of a report's data block (`<script type="application/json">`, read with JSON.parse).
REPORT_DATA_ID = "ranksight-report"


@cache
def asset_text(name: str) -> str:
    """The text of a static asset shipped in `ui/static`."""
    path = resources.files("ui") / "static" / ASSETS[name]
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UiError(
            f"the UI asset {ASSETS[name]} is missing: run `make ui-assets` (it fetches ECharts from npm once)"
        ) from None


def _nav(title: str) -> str:
    return (
        '<nav class="top"><a href="/">ranksight</a><a href="/history">alert history</a>'
        f'<span class="muted">{html.escape(title)}</span></nav>'
    )


def page_html(kind: str, key: str | None, title: str, extra: dict[str, Any] | None = None) -> str:
    """A served page: the shell whose script fetches its data from /api."""
    page = html.escape(json.dumps({"kind": kind, "id": key, **(extra or {})}), quote=True)
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)} · ranksight</title>"
        "<link rel='stylesheet' href='/static/style.css'>"
        "<script src='/static/echarts.min.js'></script><script src='/static/app.js'></script>"
        f"</head><body data-page=\"{page}\">{_nav(title)}<div id='app'><p class='muted'>loading…</p></div></body></html>"
    )


def inline_json(data: Any) -> str:
    """JSON safe inside an HTML element: `<`, `>` and `&` written as \\u escapes (still the same JSON).

    Outside strings JSON has none of these characters, so the text can neither end its element
    (`</script>`), open a comment (`<!--`) nor start a character reference.
    """
    from ui.pages.common import to_json

    return to_json(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


def report_html(kind: str, key: str, title: str, data: Any, generated: str) -> str:
    """A self-contained report: styles, ECharts, the page script and its data in one file."""
    payload = inline_json({"page": {"kind": kind, "id": key}, "data": data, "generated": generated})
    scripts = [asset_text(name).replace("</script", "<\\/script") for name in ("echarts.min.js", "app.js")]
    style = asset_text("style.css")
    policy = (
        "default-src 'none'; "
        f"script-src {' '.join(_sha256(s) for s in scripts)}; style-src {_sha256(style)}; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f'<meta http-equiv="Content-Security-Policy" content="{html.escape(policy, quote=True)}">'
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)} · ranksight report</title>"
        f"<style>{style}</style>"
        f"<script type='application/json' id='{REPORT_DATA_ID}'>{payload}</script>"
        + "".join(f"<script>{s}</script>" for s in scripts)
        + "</head><body class='report'>"
        "<nav class='top'><span>ranksight report</span>"
        f"<span class='muted'>{html.escape(title)} · generated {html.escape(generated)}</span></nav>"
        "<div id='app'><p class='muted'>loading…</p></div></body></html>"
    )
