"""The HTML shell of every page: served pages load the assets by URL, reports inline them."""

from __future__ import annotations

import html
import json
from functools import cache
from importlib import resources
from typing import Any

from ui.errors import UiError

__all__ = ["ASSETS", "asset_text", "page_html", "report_html"]

ASSETS = {"app.js": "app.js", "style.css": "style.css", "echarts.min.js": "vendor/echarts.min.js"}


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
    return f'<nav class="top"><a href="/">ranksight</a><span class="muted">{html.escape(title)}</span></nav>'


def page_html(kind: str, key: str | None, title: str) -> str:
    """A served page: the shell whose script fetches its data from /api."""
    page = html.escape(json.dumps({"kind": kind, "id": key}), quote=True)
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)} · ranksight</title>"
        "<link rel='stylesheet' href='/static/style.css'>"
        "<script src='/static/echarts.min.js'></script><script src='/static/app.js'></script>"
        f"</head><body data-page=\"{page}\">{_nav(title)}<div id='app'><p class='muted'>loading…</p></div></body></html>"
    )


def _inline_json(data: Any) -> str:
    # `</` would end the script element early; `<!--` would start a comment state in it.
    from ui.queries import to_json

    return to_json(data).replace("</", "<\\/").replace("<!--", "<\\!--")


def report_html(kind: str, key: str, title: str, data: Any, generated: str) -> str:
    """A self-contained report: styles, ECharts, the page script and its data in one file."""
    payload = _inline_json({"page": {"kind": kind, "id": key}, "data": data, "generated": generated})
    scripts = "".join(
        "<script>" + asset_text(name).replace("</script", "<\\/script") + "</script>"
        for name in ("echarts.min.js", "app.js")
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)} · ranksight report</title>"
        f"<style>{asset_text('style.css')}</style>"
        f"<script>window.RANKSIGHT_REPORT = {payload};</script>{scripts}</head><body>"
        "<nav class='top'><span>ranksight report</span>"
        f"<span class='muted'>{html.escape(title)} · generated {html.escape(generated)}</span></nav>"
        "<div id='app'><p class='muted'>loading…</p></div></body></html>"
    )
