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
import shlex
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from ui.errors import NotFoundError, UiError

__all__ = ["RUNBOOK_PARAMETERS", "default_runbooks_dir", "render_runbook", "runbook_rules"]

# The alert fields a runbook's queries take as `{name:Type}` parameters (the alert page's link carries them).
RUNBOOK_PARAMETERS = ("job_id", "node", "rank", "gpu_index")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*):[^}]+\}")

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

    def fence(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        # A SQL block is followed by its statements as `ranksight sql --param ...` commands, filled in
        # with the alert's values (the page was opened from an alert); values are shell-quoted text.
        out = str(renderer.rules["fence_default"](tokens, idx, options, env))
        token = tokens[idx]
        params = env.get("params") or {}
        if token.info.strip() != "sql" or not params:
            return out
        commands = [c for c in map(lambda s: _command(s, params), _statements(token.content)) if c]
        if commands:
            out += (
                "<p class='run'>Run for this alert:</p><pre class='run'><code>"
                + html.escape("\n\n".join(commands))
                + "</code></pre>\n"
            )
        return out

    renderer.rules["fence_default"] = renderer.rules["fence"]
    md.add_render_rule("link_open", link_open)
    md.add_render_rule("fence", fence)
    return md


def _statements(block: str) -> list[str]:
    """The statements of a SQL block, without their comment lines."""
    text = "\n".join(line for line in block.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in text.split(";") if s.strip()]


def _command(statement: str, params: Mapping[str, str]) -> str | None:
    """`ranksight sql --param ... '<statement>'` when every placeholder of the statement has a value."""
    names = list(dict.fromkeys(_PLACEHOLDER.findall(statement)))
    if not names or any(n not in params for n in names):
        return None
    flags = " ".join(f"--param {shlex.quote(f'{n}={params[n]}')}" for n in names)
    return f"ranksight sql {flags} {shlex.quote(' '.join(statement.split()))}"


def render_runbook(directory: Path, rule: str, params: Mapping[str, str] | None = None) -> str:
    """The HTML page of one rule's runbook ("README": the index); NotFoundError for an unknown rule.

    `params` (an alert's `job_id`, `node`, `rank`, `gpu_index`): each SQL block is followed by its
    statements as runnable `ranksight sql --param` commands with those values.
    """
    if not _RULE.match(rule):
        raise NotFoundError("runbook", rule)
    if not directory.is_dir():
        raise UiError(
            f"no runbooks at {directory}: start the UI with --runbooks DIR (a folder of <rule>.md pages)"
        )
    path = directory / f"{rule}.md"
    if not path.is_file():
        raise NotFoundError("runbook", rule)
    given = {k: str(v) for k, v in (params or {}).items() if k in RUNBOOK_PARAMETERS and str(v) != ""}
    body = _markdown().render(path.read_text(encoding="utf-8"), {"params": given})
    title = "runbooks" if rule == "README" else f"runbook: {rule}"
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)} · ranksight</title><link rel='stylesheet' href='/static/style.css'></head>"
        "<body><nav class='top'><a href='/'>ranksight</a><a href='/runbooks/'>runbooks</a>"
        f"<span class='muted'>{html.escape(title)}</span></nav>"
        f"<article class='runbook' id='app' data-rule='{html.escape(rule, quote=True)}'>{body}</article></body></html>"
    )
