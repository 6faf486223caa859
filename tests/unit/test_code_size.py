"""No product file over 900 lines, no product function over 120 (issue 31.5): a file or function past
that is split along its seams, not allowlisted."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "producers", "streams", "sinks", "infra", "ranksight", "ui")
MAX_FILE_LINES = 900
MAX_FUNCTION_LINES = 120
EXEMPT: tuple[str, ...] = ()  # nothing is allowlisted


def _product_files() -> list[Path]:
    files = [f for package in PACKAGES for f in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 100, "the product packages were not found"
    return [f for f in files if f.relative_to(ROOT).parts[0] not in EXEMPT]


def _too_long(path: Path) -> tuple[int | None, list[str]]:
    """(the file's length if over the limit, the functions over theirs as 'name (N lines)')."""
    text = path.read_text(encoding="utf-8")
    lines = len(text.splitlines())
    functions = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text, str(path)))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    return (lines if lines > MAX_FILE_LINES else None), functions


def test_no_product_file_or_function_too_long() -> None:
    """Every product module is at most 900 lines and every function (nested ones too) at most 120."""
    found = []
    for path in _product_files():
        lines, functions = _too_long(path)
        where = path.relative_to(ROOT)
        if lines is not None:
            found.append(f"{where}: {lines} lines (max {MAX_FILE_LINES})")
        found += [f"{where}: {f} (max {MAX_FUNCTION_LINES})" for f in functions]
    assert not found, "split along its seams:\n" + "\n".join(found)


def test_the_measure_sees_a_long_file_and_function(tmp_path: Path) -> None:
    """A function counts from its `def` to its last line, a file by its lines; the limits themselves pass."""
    path = tmp_path / "sized.py"

    def write(function_lines: int, file_lines: int) -> None:
        body = "".join(f"    x{i} = {i}\n" for i in range(function_lines - 1))
        path.write_text("async def f():\n" + body + "\n" * (file_lines - function_lines))

    write(MAX_FUNCTION_LINES, MAX_FILE_LINES)
    assert _too_long(path) == (None, [])
    write(MAX_FUNCTION_LINES + 1, MAX_FILE_LINES + 1)
    assert _too_long(path) == (MAX_FILE_LINES + 1, [f"f ({MAX_FUNCTION_LINES + 1} lines)"])
