"""The runbooks (`ui/runbook_pages/<rule>.md`, shipped in the package; `docs/runbooks` links to them) served as pages at `/runbooks/<rule>`, rendered safely.

An alert's `runbook_url` is either `docs/runbooks/<rule>` (the engine's default base, relative) or an
absolute URL built from a configured base (which may point at this UI); the alert page links either
to a page here or to that URL. Markdown is rendered by markdown-it-py (CommonMark) with raw HTML
off: a `<script>` in a page is shown as text, and links that are not http(s), mailto or relative
(javascript:, data:) are not made links.
"""

from __future__ import annotations

import html
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from ui.errors import NotFoundError, UiError

__all__ = ["default_runbooks_dir", "render_runbook", "runbook_rules"]

_RULE = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
# A link to a sibling page, `job_stall.md` or `job_stall.md#what-to-do`: served without `.md`.
_SIBLING = re.compile(r"^([A-Za-z0-9_-]+)\.md(#[^\s]*)?$")


def default_runbooks_dir() -> Path:
    """The runbook pages shipped in this package (`ranksight ui --runbooks` names another folder).

    Read through importlib.resources, so an installed wheel serves the same pages as a checkout.
    """
    return Path(str(resources.files("ui").joinpath("runbook_pages")))


def runbook_rules(directory: Path) -> list[str]:
    """The rules with a page in `directory` (README, the index, excluded)."""
    return sorted(p.stem for p in directory.glob("*.md") if p.stem != "README")


@cache
def _markdown() -> Any:
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")
    renderer: Any = md.renderer

    def link_open(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        token = tokens[idx]
        href = token.attrGet("href") or ""
        sibling = _SIBLING.match(href)
        if sibling:
            name = sibling.group(1)
            token.attrSet("href", ("./" if name == "README" else name) + (sibling.group(2) or ""))
        return str(renderer.renderToken(tokens, idx, options, env))

    md.add_render_rule("link_open", link_open)
    return md


def render_runbook(directory: Path, rule: str) -> str:
    """The HTML page of one rule's runbook ("README": the index); NotFoundError for an unknown rule."""
    if not _RULE.match(rule):
        raise NotFoundError("runbook", rule)
    if not directory.is_dir():
        raise UiError(
            f"no runbooks at {directory}: start the UI with --runbooks DIR (a folder of <rule>.md pages)"
        )
    path = directory / f"{rule}.md"
    if not path.is_file():
        raise NotFoundError("runbook", rule)
    body = _markdown().render(path.read_text(encoding="utf-8"))
    title = "runbooks" if rule == "README" else f"runbook: {rule}"
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)} · ranksight</title><link rel='stylesheet' href='/static/style.css'></head>"
        "<body><nav class='top'><a href='/'>ranksight</a><a href='/runbooks/'>runbooks</a>"
        f"<span class='muted'>{html.escape(title)}</span></nav>"
        f"<article class='runbook' id='app' data-rule='{html.escape(rule, quote=True)}'>{body}</article></body></html>"
    )
