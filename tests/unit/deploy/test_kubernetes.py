"""deploy/kubernetes renders, validates offline and runs only what ranksight accepts (issue 36.2).

Every overlay is rendered with `kubectl kustomize`; every object is validated against the
Kubernetes schemas (kubernetes-validate, strict: an unknown field fails) or, for the operators'
kinds, against the vendored CRDs' openAPIV3Schema with unknown fields refused the way server-side
strict field validation refuses them. Then what the objects run: each ranksight container's
command line parses with the real CLI, sets only environment variables ranksight reads, takes
secrets only from Secrets, and matches the topics, probes and grace periods the commands have.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from infra.kafka.topics import COPARTITIONED, DEFAULT_TOPIC_SPECS
from ranksight.signals import HARD_EXIT_S
from streams.alerting.remediation import load_policy
from tests.unit.deploy.invocations import parse_invocation, ranksight_lines, unknown_envvars

ROOT = Path(__file__).resolve().parents[3]
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p.name for p in (KUBE / "overlays").iterdir() if p.is_dir())
KUBERNETES_VERSION = "1.32.0"
# Environment a GPU container needs from the NVIDIA container runtime, not from ranksight.
RUNTIME_ENV = {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}
SECRET_NAMES = ("PASSWORD", "CLICKHOUSE_URL", "BASIC_AUTH")
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    """The objects `kubectl kustomize overlays/<overlay>` prints."""
    if shutil.which("kubectl") is None:
        if os.environ.get("RANKSIGHT_REQUIRE_DEPLOY_TOOLS") == "1":
            pytest.fail(
                "kubectl is required here to render deploy/kubernetes (kubectl kustomize)", pytrace=False
            )
        pytest.skip("kubectl is not installed: deploy/kubernetes is not rendered")
    out = subprocess.run(
        ["kubectl", "kustomize", str(KUBE / "overlays" / overlay)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def _strict(schema: Any) -> Any:
    """A CRD schema that refuses unknown fields where the CRD does not preserve them (strict field validation)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the strict schema of each vendored CRD version."""
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted((KUBE / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
            schema.setdefault("properties", {}).pop("metadata", None)
            schema["properties"]["metadata"] = {"type": "object"}
            schema["properties"]["apiVersion"] = {"type": "string"}
            schema["properties"]["kind"] = {"type": "string"}
            schemas[(f"{group}/{version['name']}", kind)] = _strict(schema)
    return schemas


def _name(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    if obj["kind"] not in WORKLOADS:
        return None
    return obj["spec"]["template"]["spec"]


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    pod = _pod_spec(obj)
    return [] if pod is None else [*pod.get("initContainers", []), *pod["containers"]]


def _is_ranksight(container: dict[str, Any]) -> bool:
    """The images built from deploy/containers (named by the base kustomization's `images`)."""
    return container["image"].startswith(("ghcr.io/ranksight/", "ranksight-"))


def _invocations(container: dict[str, Any]) -> list[list[str]]:
    """The ranksight argvs a container runs (`ranksight` + args, or `sh -c` lines that call it)."""
    command, args = container.get("command", []), container.get("args", [])
    if command == ["ranksight"]:
        return [list(args)]
    if command[:2] == ["sh", "-c"]:
        return list(ranksight_lines(command[2]))
    raise AssertionError(f"container {container['name']}: command {command} is neither ranksight nor sh -c")


def _configmaps(objects: tuple[dict[str, Any], ...]) -> dict[str, dict[str, str]]:
    return {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_its_schema(overlay: str) -> None:
    """Kubernetes kinds against the API schemas, operator kinds against their vendored CRDs; unknown fields fail."""
    objects = render(overlay)
    assert len(objects) > 30
    crds = crd_schemas()
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        if key in crds:
            errors = sorted(jsonschema.Draft7Validator(crds[key]).iter_errors(obj), key=str)
            assert not errors, (
                f"{overlay}: {_name(obj)}: {errors[0].message} at {list(errors[0].absolute_path)}"
            )
        else:
            assert "." not in obj["apiVersion"].split("/")[0] or obj["apiVersion"].endswith(".k8s.io/v1"), (
                f"{overlay}: {_name(obj)} is a custom kind without a vendored CRD in deploy/kubernetes/crds"
            )
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_strict_crd_check_refuses_an_unknown_field() -> None:
    """The CRD check is not a pass-through: a misspelt field of a KafkaTopic fails."""
    topic = next(o for o in render("small") if o["kind"] == "KafkaTopic")
    bad = copy.deepcopy(topic)
    bad["spec"]["partition"] = bad["spec"].pop("partitions")
    schema = crd_schemas()[(bad["apiVersion"], bad["kind"])]
    assert list(jsonschema.Draft7Validator(schema).iter_errors(bad))
    assert not list(jsonschema.Draft7Validator(schema).iter_errors(topic))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_a_valid_ranksight_command(overlay: str) -> None:
    """Each ranksight container's command line parses with the real CLI (commands, options, values)."""
    seen: set[tuple[str, ...]] = set()
    for obj in render(overlay):
        for container in filter(_is_ranksight, _containers(obj)):
            for argv in _invocations(container):
                seen.add(tuple(parse_invocation(argv)))
    assert {("agent",), ("worker",), ("sink",), ("ui",), ("alerts", "forward"), ("scheduler",)} <= seen
    assert {("remediate",), ("sql",)} <= seen


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_environment_variable_is_one_ranksight_reads(overlay: str) -> None:
    """env and envFrom ConfigMaps set only what ranksight's settings or the command's options read."""
    objects = render(overlay)
    configmaps = _configmaps(objects)
    for obj in objects:
        for container in filter(_is_ranksight, _containers(obj)):
            names = {e["name"] for e in container.get("env", [])}
            for source in container.get("envFrom", []):
                names |= set(configmaps[source["configMapRef"]["name"]])
            for argv in _invocations(container):
                unknown = unknown_envvars(names, parse_invocation(argv), argv) - RUNTIME_ENV
                assert not unknown, f"{overlay}: {_name(obj)}/{container['name']} sets {sorted(unknown)}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_come_from_secrets_only(overlay: str) -> None:
    """No Secret object is rendered, and no password or URL with credentials is a literal value."""
    objects = render(overlay)
    assert not [_name(o) for o in objects if o["kind"] == "Secret"]
    for name, data in _configmaps(objects).items():
        assert not [k for k in data if any(s in k for s in SECRET_NAMES)], f"ConfigMap {name} holds a secret"
    for obj in objects:
        for container in _containers(obj):
            for env in container.get("env", []):
                if any(s in env["name"] for s in SECRET_NAMES):
                    assert "secretKeyRef" in env.get("valueFrom", {}), (
                        f"{_name(obj)}: {env['name']} is not from a Secret"
                    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_topics_match_the_topic_specs_and_the_worker_partitions(overlay: str) -> None:
    """Every rs.* topic is declared with infra/kafka/topics.py's retention; the co-partitioned ones have the worker's --partitions."""
    objects = render(overlay)
    topics = {o["spec"]["topicName"]: o["spec"] for o in objects if o["kind"] == "KafkaTopic"}
    assert set(topics) == {s.name for s in DEFAULT_TOPIC_SPECS}
    for spec in DEFAULT_TOPIC_SPECS:
        assert topics[spec.name]["config"]["retention.ms"] == spec.retention_ms, spec.name
        assert topics[spec.name]["config"]["cleanup.policy"] == spec.cleanup_policy, spec.name
    worker = next(
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "ranksight-worker"
    )
    args = worker["spec"]["template"]["spec"]["containers"][0]["args"]
    partitions = int(next(a.split("=", 1)[1] for a in args if a.startswith("--partitions=")))
    for name in COPARTITIONED:
        assert topics[name]["partitions"] == partitions, (
            f"{overlay}: {name} vs worker --partitions={partitions}"
        )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_grace_and_budgets(overlay: str) -> None:
    """Probes hit the port the command serves; grace outlasts the commands' own stop deadline; services have PDBs."""
    objects = render(overlay)
    budgets = {
        o["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
        for o in objects
        if o["kind"] == "PodDisruptionBudget"
    }
    for obj in objects:
        pod = _pod_spec(obj)
        if pod is None or obj["kind"] == "Job":
            continue
        assert pod["terminationGracePeriodSeconds"] > HARD_EXIT_S, _name(obj)
        for container in filter(_is_ranksight, pod["containers"]):
            args = container.get("args", [])
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            for probe in ("livenessProbe", "readinessProbe"):
                if probe not in container:
                    continue
                port = ports[container[probe]["httpGet"]["port"]]
                assert f"--metrics-port={port}" in args or f"--port={port}" in args, f"{_name(obj)} {probe}"
            if ports:
                assert "livenessProbe" in container and "readinessProbe" in container, _name(obj)
        if obj["kind"] == "Deployment" and obj["spec"]["replicas"] > 1:
            assert obj["metadata"]["name"] in budgets, f"{_name(obj)} has no PodDisruptionBudget"


def test_remediate_acts_only_where_its_role_allows(tmp_path: Path) -> None:
    """remediate's --namespace is the one namespace its Role is in; the policy it mounts loads."""
    objects = render("small")
    deployment = next(
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "ranksight-remediate"
    )
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    namespace = next(a.split("=", 1)[1] for a in args if a.startswith("--namespace="))
    roles = [
        o for o in objects if o["kind"] in {"Role", "RoleBinding"} and "remediate" in o["metadata"]["name"]
    ]
    assert {o["metadata"]["namespace"] for o in roles} == {namespace}
    assert not [
        o for o in objects if o["kind"] == "ClusterRoleBinding" and "remediate" in o["metadata"]["name"]
    ]
    assert "--execute" not in args, "the base runs remediate as a dry run"
    policy = next(
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "ranksight-remediation-policy"
    )
    path = tmp_path / "policy.yaml"
    path.write_text(policy["data"]["policy.yaml"], encoding="utf-8")
    assert load_policy(path).rules


def _allows(acls: list[dict[str, Any]], operation: str, kind: str, name: str) -> bool:
    """Whether a Strimzi ACL list allows `operation` on resource `kind`/`name` (no deny rules are used)."""
    for acl in acls:
        resource = acl["resource"]
        if resource["type"] != kind or acl.get("type", "allow") != "allow":
            continue
        literal = resource.get("patternType", "literal") == "literal"
        matches = name == resource["name"] if literal else name.startswith(resource["name"])
        if matches and (operation in acl["operations"] or "All" in acl["operations"]):
            return True
    return False


def test_each_service_user_may_do_what_its_command_does_and_no_more_writes() -> None:
    """The KafkaUsers' ACLs cover what each command reads and writes (from the code's own topic lists),
    and no producer-side user may write the worker's outputs (the trust model)."""
    from sinks.consumer import SINK_TOPICS
    from streams.runtime.changelog import ROUTES_TABLE, SNAPSHOT_TABLE, changelog_topic
    from streams.runtime.options import (
        BINDINGS,
        CONTROL,
        DEFAULT_APP_ID,
        INPUT_TOPICS,
        SUMMARIES,
        TELEMETRY_BY_JOB,
    )

    internal = (BINDINGS, TELEMETRY_BY_JOB, CONTROL, SUMMARIES)

    users = {
        o["metadata"]["name"]: o["spec"]["authorization"]["acls"]
        for o in render("small")
        if o["kind"] == "KafkaUser"
    }
    changelogs = [changelog_topic(DEFAULT_APP_ID, t) for t in (SNAPSHOT_TABLE, ROUTES_TABLE)]
    needs = {
        "ranksight-agent": [
            ("Write", t)
            for t in (
                "rs.telemetry.gpu",
                "rs.telemetry.host",
                "rs.telemetry.job",
                "rs.telemetry.unattributed",
            )
        ],
        "ranksight-training": [("Write", t) for t in ("rs.training.steps", "rs.training.events")],
        "ranksight-worker": [("Read", t) for t in INPUT_TOPICS]
        + [
            ("Write", t)
            for t in ("rs.alerts", "rs.derived.rank", "rs.derived.job", "rs.deadletter", *internal)
        ]
        + [(op, t) for t in [*internal, *changelogs] for op in ("Create", "Read", "Write")],
        "ranksight-sink": [("Read", t) for t in SINK_TOPICS] + [("Write", "rs.deadletter")],
        "ranksight-forwarder": [("Read", "rs.alerts")],
        "ranksight-remediate": [
            ("Read", "rs.alerts"),
            ("Read", "rs.training.events"),
            ("Write", "rs.actions"),
        ],
        "ranksight-scheduler": [("Write", "rs.scheduler.states")],
    }
    for user, wanted in needs.items():
        missing = [(op, t) for op, t in wanted if not _allows(users[user], op, "topic", t)]
        assert not missing, f"{user} lacks {missing}"
    for user in ("ranksight-agent", "ranksight-training", "ranksight-scheduler"):
        for topic in ("rs.alerts", "rs.derived.rank", "rs.actions", "rs.internal.summaries", changelogs[0]):
            assert not _allows(users[user], "Write", "topic", topic), f"{user} may write {topic}"
    # The job states the worker believes (--job-states=scheduler): only the scheduler watcher's.
    for user in ("ranksight-agent", "ranksight-training"):
        assert not _allows(users[user], "Write", "topic", "rs.scheduler.states"), (
            f"{user} may write job states"
        )
    assert not _allows(users["ranksight-scheduler"], "Write", "topic", "rs.training.events")
    assert _allows(users["ranksight-worker"], "Read", "group", DEFAULT_APP_ID)
    assert _allows(users["ranksight-sink"], "Read", "group", "ranksight-sink")
