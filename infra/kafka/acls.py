"""Who may write what: the Kafka ACLs of a secured ranksight cluster, rendered and applied.

The authorization model (docs/security.md, "Who may write what"): one principal per component,
each allowed only what it needs, on a cluster with an authorizer (KRaft: `StandardAuthorizer`) and
no `allow.everyone.if.no.acl.found`:

- node agents write telemetry only; the training SDK (and importers) training records only;
- the scheduler watcher writes job states (today on `rs.training.events`, shared with the SDK);
- the worker reads what producers write and alone writes alerts, derived windows, its dead
  letters and its internal and changelog topics;
- `ranksight remediate` reads alerts and training events and alone writes `rs.actions`;
- the sink reads what it stores and writes its dead letters; readers (UI, `status`, `alerts
  tail|forward`, `record`) read every topic and write none.

`grants` is the pure model (a list of `Grant`), `render` prints it, `apply` creates the bindings
through the admin API (`AdminClient.create_acls`, idempotent: Kafka keeps one copy of a binding).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from infra.errors import KafkaSetupError
from schemas.topics import (
    ACTIONS,
    ALERTS,
    DEADLETTER,
    DERIVED_JOB,
    DERIVED_RANK,
    SCHEDULER_STATES,
    SINK_TOPICS,
    TELEMETRY_GPU,
    TELEMETRY_HOST,
    TELEMETRY_JOB,
    TELEMETRY_UNATTRIBUTED,
    TOPICS,
    TRAINING_EVENTS,
    TRAINING_STEPS,
    WORKER_SOURCES,
)

__all__ = ["ROLES", "Grant", "Principals", "apply", "grants", "render", "writers"]

Operation = Literal["READ", "WRITE", "DESCRIBE", "CREATE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"]
Resource = Literal["TOPIC", "GROUP"]
Pattern = Literal["LITERAL", "PREFIXED"]

# Role -> what it is, for `--help` and the rendered table.
ROLES: dict[str, str] = {
    "agent": "node agents (`ranksight agent`)",
    "sdk": "training jobs (the SDK) and importers",
    "scheduler": "the scheduler watcher (`ranksight scheduler`)",
    "worker": "the stream worker (`ranksight worker`)",
    "remediate": "`ranksight remediate`",
    "sink": "the ClickHouse sink (`ranksight sink` / `serve`)",
    "reader": "read-only tools (UI, `status`, `alerts tail|forward`, `record`)",
}
TELEMETRY: tuple[str, ...] = (TELEMETRY_GPU, TELEMETRY_HOST, TELEMETRY_JOB, TELEMETRY_UNATTRIBUTED)
TRAINING: tuple[str, ...] = (TRAINING_STEPS, TRAINING_EVENTS)
# Written by the worker only (with the internal and changelog topics, by prefix).
WORKER_OUTPUTS: tuple[str, ...] = (ALERTS, DERIVED_RANK, DERIVED_JOB, DEADLETTER)


@dataclass(frozen=True)
class Principals:
    """The Kafka principal of each role (`User:<SASL user>` with SCRAM, `User:CN=...` with mTLS)."""

    agent: str = "User:ranksight-agent"
    sdk: str = "User:ranksight-sdk"
    scheduler: str = "User:ranksight-scheduler"
    worker: str = "User:ranksight-worker"
    remediate: str = "User:ranksight-remediate"
    sink: str = "User:ranksight-sink"
    reader: str = "User:ranksight-reader"

    @classmethod
    def parse(cls, pairs: Iterable[str]) -> Principals:
        """From `role=principal` pairs (`worker=User:detect`); a bad one is a `KafkaSetupError`."""
        values: dict[str, str] = {}
        for pair in pairs:
            role, sep, principal = pair.partition("=")
            if not sep or role not in ROLES:
                raise KafkaSetupError(
                    f"--principal {pair!r}: expected ROLE=PRINCIPAL, ROLE one of {', '.join(ROLES)}"
                )
            if ":" not in principal or principal.startswith(":") or principal.endswith(":"):
                raise KafkaSetupError(
                    f"--principal {pair!r}: a principal is TYPE:NAME, e.g. User:ranksight-{role}"
                )
            values[role] = principal
        return cls(**values)


@dataclass(frozen=True)
class Grant:
    """One ALLOW binding: a principal may do `operation` on a topic or group (by literal name or prefix)."""

    role: str
    principal: str
    operation: Operation
    resource: Resource
    name: str
    pattern: Pattern = "LITERAL"
    host: str = field(default="*", compare=True)


def _topics(
    role: str, principal: str, names: Sequence[str], ops: Sequence[Operation], prefix: str
) -> list[Grant]:
    return [Grant(role, principal, op, "TOPIC", prefix + name) for name in names for op in ops]


def grants(principals: Principals, *, prefix: str = "", app_id: str = "ranksight-detect") -> list[Grant]:
    """Every ALLOW binding of the model, for topics named `prefix + name` and a worker of `app_id`."""
    p = principals
    out: list[Grant] = []
    produce: tuple[Operation, ...] = ("WRITE", "DESCRIBE")
    consume: tuple[Operation, ...] = ("READ", "DESCRIBE")
    out += _topics("agent", p.agent, TELEMETRY, produce, prefix)
    out += _topics("sdk", p.sdk, TRAINING, produce, prefix)
    # Job states as the scheduler reports them: a topic no agent or training job may write.
    out += _topics("scheduler", p.scheduler, (SCHEDULER_STATES,), produce, prefix)
    # The worker: its sources, its outputs, and everything it names itself (internal topics, changelogs,
    # its consumer groups), by prefix; it creates its internal topics.
    out += _topics("worker", p.worker, WORKER_SOURCES, consume, prefix)
    out += _topics("worker", p.worker, WORKER_OUTPUTS, (*produce, "DESCRIBE_CONFIGS"), prefix)
    for own in (f"{prefix}rs.internal.", f"{prefix}{app_id}"):
        out += [
            Grant("worker", p.worker, op, "TOPIC", own, "PREFIXED")
            for op in ("READ", "WRITE", "DESCRIBE", "CREATE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS")
        ]
    out.append(Grant("worker", p.worker, "READ", "GROUP", f"{prefix}{app_id}", "PREFIXED"))
    # remediate rebuilds from three topics and writes its decisions; its groups are never committed.
    out += _topics("remediate", p.remediate, (ALERTS, TRAINING_EVENTS, ACTIONS), consume, prefix)
    out += _topics("remediate", p.remediate, (ACTIONS,), ("WRITE",), prefix)
    out.append(Grant("remediate", p.remediate, "READ", "GROUP", "ranksight-remediate-", "PREFIXED"))
    # The sink stores, and dead-letters what it cannot.
    out += _topics("sink", p.sink, SINK_TOPICS, consume, prefix)
    out += _topics("sink", p.sink, (DEADLETTER,), produce, prefix)
    out.append(Grant("sink", p.sink, "READ", "GROUP", f"{prefix}ranksight-sink", "PREFIXED"))
    # Readers read every ranksight topic, write none.
    out += _topics("reader", p.reader, (*TOPICS,), consume, prefix)
    out += [
        Grant("reader", p.reader, "READ", "GROUP", g, "PREFIXED")
        for g in ("ranksight-", f"{prefix}ranksight-")
    ]
    # Deduplicated, in a stable order (the same group prefix twice when `prefix` is empty).
    return sorted(set(out), key=lambda g: (list(ROLES).index(g.role), g.resource, g.name, g.operation))


def writers(model: Iterable[Grant]) -> dict[str, set[str]]:
    """Topic (or prefix + `*`) -> the roles that may write it: what the model says, for tests and docs."""
    out: dict[str, set[str]] = {}
    for g in model:
        if g.resource == "TOPIC" and g.operation == "WRITE":
            out.setdefault(g.name + ("*" if g.pattern == "PREFIXED" else ""), set()).add(g.role)
    return out


def render(model: Sequence[Grant]) -> str:
    """The bindings as a table, one line each, grouped by role."""
    lines = [f"{'principal':<28} {'operation':<16} {'resource':<8} {'pattern':<8} name"]
    for g in model:
        lines.append(f"{g.principal:<28} {g.operation:<16} {g.resource:<8} {g.pattern:<8} {g.name}")
    return "\n".join(lines)


def _binding(g: Grant) -> Any:
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    return AclBinding(
        ResourceType[g.resource],
        g.name,
        ResourcePatternType[g.pattern],
        g.principal,
        g.host,
        AclOperation[g.operation],
        AclPermissionType.ALLOW,
    )


def apply(conf: Mapping[str, Any], model: Sequence[Grant], *, timeout: float = 30) -> int:
    """Create every binding on the cluster `conf` reaches (an admin principal's settings); how many."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({**conf, "log_level": 0})
    futures = admin.create_acls([_binding(g) for g in model], request_timeout=timeout)
    for binding, future in futures.items():
        try:
            future.result(timeout=timeout + 5)
        except KafkaException as exc:
            error = exc.args[0]
            hint = ""
            if "SECURITY_DISABLED" in error.name() or "authorizer" in error.str().lower():
                hint = ": the cluster has no authorizer (authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer)"
            elif "AUTHORIZATION" in error.name():
                hint = ": this principal may not create ACLs; use an admin (a super user, or ALTER on the cluster)"
            raise KafkaSetupError(f"cannot create ACL {binding}: {error.str()}{hint}") from exc
        except TimeoutError as exc:
            raise KafkaSetupError(
                f"cannot create ACLs: no answer from Kafka at {conf.get('bootstrap.servers')}"
            ) from exc
    return len(futures)
