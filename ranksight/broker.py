"""Where Kafka is, for every command: KAFKA_BOOTSTRAP, else the broker `ranksight kafka up` runs.

`kafka_settings()` is what a command that talks to Kafka calls first; `check_broker()` asks the
resolved address for metadata so a command can fail with one sentence before it starts its
clients (the Faust worker would otherwise print an aiokafka traceback).
"""

from __future__ import annotations

from typing import Any, Literal

from infra.kafka.local import running_bootstrap
from ranksight.errors import KafkaNotFoundError, KafkaUnreachableError
from ranksight.settings import Settings, load_settings

__all__ = [
    "WORKER_ASSIGNORS",
    "BootstrapSource",
    "check_broker",
    "check_group_runtime",
    "kafka_settings",
    "resolve_bootstrap",
]

# The partition assignor each worker runtime joins its group with (`ranksight worker --runtime`).
WORKER_ASSIGNORS = {"faust": "faust", "direct": "range"}

BootstrapSource = Literal["env", "local"]


def resolve_bootstrap(settings: Settings) -> tuple[str, BootstrapSource]:
    """The bootstrap address and where it came from; `KafkaNotFoundError` when there is none."""
    if settings.kafka_bootstrap:
        return settings.kafka_bootstrap, "env"
    found = running_bootstrap(settings.kafka_state_dir)
    if found is not None:
        return found, "local"
    state = settings.kafka_state_dir / "kafka.json"
    if state.is_file():
        raise KafkaNotFoundError(
            f"no Kafka: the local broker of {settings.home} is no longer running; "
            "start it again with `ranksight kafka up`, or set KAFKA_BOOTSTRAP=host:port"
        )
    raise KafkaNotFoundError(
        "no Kafka: set KAFKA_BOOTSTRAP=host:port, or start a local broker with `ranksight kafka up`"
    )


def kafka_settings(**overrides: Any) -> Settings:
    """Settings with `kafka_bootstrap` resolved (see `resolve_bootstrap`); raises `KafkaNotFoundError`."""
    settings = load_settings(**overrides)
    bootstrap, _ = resolve_bootstrap(settings)
    return settings.model_copy(update={"kafka_bootstrap": bootstrap})


def check_broker(settings: Settings, timeout: float = 10.0) -> None:
    """Raise `KafkaUnreachableError` (one sentence) unless the resolved broker answers metadata.

    A refused connection fails within about a second (librdkafka reports all brokers down); a
    silent address waits up to `timeout`.
    """
    import time

    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    bootstrap, source = resolve_bootstrap(settings)
    if bootstrap == running_bootstrap(settings.kafka_state_dir):
        source = "local"  # resolved earlier by `kafka_settings`, or KAFKA_BOOTSTRAP names that broker
    errors: list[Any] = []
    conf = {
        **settings.model_copy(update={"kafka_bootstrap": bootstrap}).kafka_config(),
        # The answer is the one sentence below, not librdkafka's log lines.
        "log_level": 0,
        "error_cb": errors.append,
    }
    admin = AdminClient(conf)
    deadline = time.monotonic() + timeout
    reason = "no answer"
    while True:
        try:
            admin.list_topics(timeout=min(0.5, max(0.05, deadline - time.monotonic())))
            return
        except KafkaException as exc:
            error = exc.args[0] if exc.args else exc
            reason = error.str() if hasattr(error, "str") else str(error)
        admin.poll(0)  # serves error_cb
        refused = [e for e in errors if e.code() == KafkaError._ALL_BROKERS_DOWN]
        if refused or time.monotonic() >= deadline:
            if errors:
                reason = errors[0].str()
            raise KafkaUnreachableError(bootstrap, source, reason) from None


def check_group_runtime(conf: dict[str, Any], group: str, runtime: str, timeout: float = 10.0) -> None:
    """Raise `KafkaSetupError` when live members of `group` run the other worker runtime.

    The two runtimes join with different partition assignors, which Kafka refuses to mix in one
    group (a Faust worker would wait in its join forever). A group without members, or one whose
    assignor is not known yet (rebalancing), passes."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from infra.errors import KafkaSetupError

    admin = AdminClient({**conf, "log_level": 0})
    try:
        desc = admin.describe_consumer_groups([group], request_timeout=timeout)[group].result(timeout + 5)
    except (KafkaException, TimeoutError):
        return  # an older broker or no answer: the join itself will tell
    assignor = desc.partition_assignor or ""
    wanted = WORKER_ASSIGNORS[runtime]
    if not desc.members or not assignor or assignor == wanted:
        return
    other = next((name for name, a in WORKER_ASSIGNORS.items() if a == assignor), None)
    running = f"the {other} runtime" if other else f"partition assignor {assignor!r}"
    fix = f"stop them first, or start this worker with --runtime {other}" if other else "stop them first"
    raise KafkaSetupError(
        f"consumer group {group} has {len(desc.members)} member(s) running {running}; the worker"
        f" runtimes cannot share a group: {fix} (a member that crashed leaves when its session"
        " times out, 10 s)"
    )
