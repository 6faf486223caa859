"""`ui/` reads stores and events; it runs no detector (issue 18: recordings are replayed by the CLI layer)."""

from __future__ import annotations

import ast
from pathlib import Path

import ui

UI_DIR = Path(ui.__file__).parent


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_no_ui_module_imports_the_stream_processing_code() -> None:
    """No module of `ui/` imports `streams` (engine, config, routing, replay), at the top or inside a function."""
    offenders = {
        str(path.relative_to(UI_DIR)): sorted(
            m for m in _imports(path) if m == "streams" or m.startswith("streams.")
        )
        for path in sorted(UI_DIR.rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    assert len(offenders) >= 8  # the check saw the package
