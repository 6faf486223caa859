"""The light install: the SDK and the agent (and `ranksight agent`) import only the base dependencies,
and the base dependencies bring none of the server side (Faust, chDB, ClickHouse, pandas, pyarrow).

Walks the module-level imports (imports inside functions are lazy and optional by design) from
the SDK and agent entry modules through every first-party module they reach.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
FIRST_PARTY = {"producers", "schemas", "streams", "sinks", "infra", "ranksight"}
# import name -> the base distribution that provides it
LIGHT = {
    "fastavro": "fastavro",
    "confluent_kafka": "confluent-kafka",
    "pynvml": "nvidia-ml-py",
    "psutil": "psutil",
    "typer": "typer",
    "rich": "rich",
    "pydantic_settings": "pydantic-settings",
    "pydantic": "pydantic-settings",  # its dependency
}
SERVER = {"faust-streaming", "chdb", "clickhouse-connect", "pandas", "pyarrow", "pyyaml", "rocksdict"}
ENTRY = [
    "producers.training",
    "producers.training.reporter",
    "producers.training.hooks",
    "producers.agent",
    "producers.agent.attribution",
    "ranksight.commands.agent",
    "ranksight.console",
    "ranksight.settings",
]


def _module_file(name: str) -> Path | None:
    path = ROOT.joinpath(*name.split("."))
    if (path / "__init__.py").exists():
        return path / "__init__.py"
    if path.with_suffix(".py").exists():
        return path.with_suffix(".py")
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level_imports(path: Path) -> set[str]:
    """Modules imported at module level (also inside top-level try/if blocks), not inside functions."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(node.orelse)  # `if TYPE_CHECKING:` imports never run
            elif isinstance(node, (ast.Try, ast.If)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            elif isinstance(node, ast.ClassDef):
                visit(node.body)

    visit(tree.body)
    return found


def _reachable() -> tuple[set[str], set[str]]:
    """(first-party modules reached, third-party top-level packages imported)."""
    seen: set[str] = set()
    third: set[str] = set()
    todo = list(ENTRY)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name)
        if path is None:
            continue
        seen.add(name)
        for imported in _top_level_imports(path):
            top = imported.split(".")[0]
            if top in FIRST_PARTY:
                todo.append(imported)
                parts = imported.split(".")
                todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
            elif top not in sys.stdlib_module_names and top != "__future__":
                third.add(top)
    return seen, third


def _base_dependencies() -> set[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() for d in deps}


def test_sdk_and_agent_import_only_light_dependencies() -> None:
    modules, third = _reachable()
    assert "producers.training.reporter" in modules and "producers.agent.gpu" in modules
    assert not any(m.startswith(("streams", "sinks")) for m in modules), sorted(modules)
    assert third <= set(LIGHT), f"heavy imports reachable from the SDK/agent: {sorted(third - set(LIGHT))}"


def test_base_install_is_the_light_dependencies_and_the_server_side_is_an_extra() -> None:
    base = _base_dependencies()
    assert set(LIGHT.values()) <= base
    assert not base & SERVER, f"server packages in the base install: {sorted(base & SERVER)}"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    server = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() for d in extras["server"]}
    assert {"faust-streaming", "chdb", "clickhouse-connect"} <= server


def test_the_framework_adapters_are_not_imported_by_the_sdk_package() -> None:
    modules, _ = _reachable()
    assert "producers.training.lightning" not in modules and "producers.training.hf" not in modules


def _command_modules() -> list[str]:
    return [
        f"ranksight.commands.{p.stem}"
        for p in sorted((ROOT / "ranksight" / "commands").glob("*.py"))
        if not p.stem.startswith("_")
    ]


def test_every_cli_command_module_imports_only_light_dependencies_at_top_level() -> None:
    heavy: dict[str, set[str]] = {}
    for module in ["ranksight.cli", *_command_modules()]:
        path = _module_file(module)
        assert path is not None
        third = {
            name.split(".")[0]
            for name in _top_level_imports(path)
            if name.split(".")[0] not in sys.stdlib_module_names | FIRST_PARTY | {"__future__"}
        }
        first = {n for n in _top_level_imports(path) if n.split(".")[0] in {"streams", "sinks", "infra"}}
        if third - set(LIGHT) or first:
            heavy[module] = (third - set(LIGHT)) | first
    assert not heavy, heavy
