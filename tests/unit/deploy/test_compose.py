"""infra/docker-compose.yml and deploy/containers hold together without a container engine (issue 36.5).

No engine runs in CI, so neither is built or started here: the compose file is parsed, its
references resolved, and every ranksight command (compose `command`, Containerfile `CMD`) parsed
with the real CLI; environment variables must be ones ranksight reads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from ranksight import __version__
from tests.unit.deploy.invocations import parse_invocation, unknown_envvars

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "infra" / "docker-compose.yml"
CONTAINERS = ROOT / "deploy" / "containers"
RANKSIGHT_IMAGE = "ghcr.io/ranksight/"


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def test_compose_references_resolve() -> None:
    """depends_on names services, named volumes are declared, mounted files exist, build files exist."""
    compose = _compose()
    services, volumes = compose["services"], set(compose.get("volumes") or {})
    for name, service in services.items():
        for dep in service.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown {dep}"
        for mount in service.get("volumes", []):
            source = mount.split(":", 1)[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in volumes, f"{name} mounts undeclared volume {source}"
        if "build" in service:
            build = service["build"]
            assert (COMPOSE.parent / build["context"] / build["dockerfile"]).is_file(), name


def test_compose_ranksight_services_run_valid_commands() -> None:
    """Each ranksight service's command parses with the CLI and sets only variables ranksight reads."""
    services = {n: s for n, s in _compose()["services"].items() if s["image"].startswith(RANKSIGHT_IMAGE)}
    assert {"worker", "sink", "ui"} <= set(services)
    for name, service in services.items():
        assert service["image"].endswith(f":{__version__}"), f"{name}: image tag is not {__version__}"
        path = parse_invocation(service["command"])
        unknown = unknown_envvars(service.get("environment", {}), path)
        assert not unknown, f"{name} sets {sorted(unknown)}"
        kafka = service.get("environment", {}).get("KAFKA_BOOTSTRAP")
        assert kafka in (None, "kafka:29092"), f"{name}: containers reach Kafka on its INTERNAL listener"


def _instructions(path: Path) -> list[tuple[str, str]]:
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln and not ln.startswith("#")]
    text = "\n".join(lines).replace("\\\n", " ")
    return [(m.group(1).upper(), m.group(2)) for m in re.finditer(r"^(\w+)\s+(.*)$", text, re.M)]


@pytest.mark.parametrize("path", sorted(CONTAINERS.glob("Containerfile.*")), ids=lambda p: p.suffix[1:])
def test_containerfile_runs_a_valid_command_from_the_wheel(path: Path) -> None:
    """A Containerfile installs this version's wheel (or builds on the image that does) and its CMD parses."""
    steps = _instructions(path)
    base = next(arg for op, arg in steps if op == "FROM")
    if base.startswith(RANKSIGHT_IMAGE):
        assert base == f"{RANKSIGHT_IMAGE}server:{__version__}", path.name
    else:
        assert any(op == "ARG" and arg == f"VERSION={__version__}" for op, arg in steps), path.name
        assert any(op == "RUN" and "ranksight-${VERSION}-py3-none-any.whl" in arg for op, arg in steps), (
            path.name
        )
        assert ("ENTRYPOINT", '["ranksight"]') in steps, path.name
    cmd = json.loads(next(arg for op, arg in steps if op == "CMD"))
    if cmd != ["--help"]:
        parse_invocation(cmd)
