"""Where Kafka is, for every command: KAFKA_BOOTSTRAP, else the broker `ranksight kafka up` runs.

`kafka_settings()` is what a command that talks to Kafka calls first; `check_broker()` asks the
resolved address for metadata so a command can fail with one sentence before it starts its
clients (the Faust worker would otherwise print an aiokafka traceback).
"""

from __future__ import annotations

from typing import Any, Literal

from infra.kafka.local import running_bootstrap
from ranksight.errors import KafkaNotFoundError, KafkaSecurityError, KafkaUnreachableError
from ranksight.settings import Settings, load_settings

__all__ = [
    "WORKER_ASSIGNORS",
    "BootstrapSource",
    "check_broker",
    "check_group_runtime",
    "kafka_settings",
    "resolve_bootstrap",
    "security_problem",
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


# The settings a user fixes, by the environment variable that sets them (ranksight.settings).
_PROTOCOL = "RANKSIGHT_KAFKA_SECURITY_PROTOCOL"
_MECHANISM = "RANKSIGHT_KAFKA_SASL_MECHANISM"
_CREDENTIALS = "RANKSIGHT_KAFKA_SASL_USERNAME and RANKSIGHT_KAFKA_SASL_PASSWORD"
_CA = "RANKSIGHT_KAFKA_SSL_CA_LOCATION"


def security_problem(settings: Settings, bootstrap: str, reports: list[str]) -> str | None:
    """The one sentence for what librdkafka reported (errors and log lines) when it is a refusal of
    this client's security settings rather than an absent broker; None otherwise. Never a secret:
    the password is not in librdkafka's messages, and only the setting's name is said here."""
    text = "\n".join(reports)
    protocol = settings.kafka_security_protocol
    ca = settings.kafka_ssl_ca_location
    if "certificate verify failed" in text or "broker certificate could not be verified" in text:
        where = f" (now {ca})" if ca is not None else " (not set: the system's trust store was used)"
        return (
            f"Kafka at {bootstrap} presented a TLS certificate this client does not trust: set {_CA} "
            f"to the PEM file of the CA that signed the broker's certificate{where}"
        )
    if "Unsupported SASL mechanism" in text:
        supported = (
            text.split("supported mechanisms:", 1)[1].split("(", 1)[0].strip()
            if ("supported mechanisms:" in text)
            else "another one"
        )
        return (
            f"Kafka at {bootstrap} does not offer SASL mechanism {settings.kafka_sasl_mechanism} "
            f"(it offers {supported}): set {_MECHANISM}"
        )
    if (
        "Authentication failed" in text
        or "SASL authentication error" in text
        or "invalid credentials" in text
    ):
        return (
            f"Kafka at {bootstrap} refused the credentials of user {settings.kafka_sasl_username!r} "
            f"({settings.kafka_sasl_mechanism}): check {_CREDENTIALS}"
        )
    if "SSL handshake failed" in text or "ssl.ca.location" in text:
        short = text.split("SSL handshake failed:", 1)[-1].split("(after", 1)[0].strip()[:160]
        return f"TLS with Kafka at {bootstrap} failed ({short}): check {_PROTOCOL} (now {protocol}) and {_CA}"
    # Once could be a broker going down mid-handshake; again and again is a listener that wants
    # another protocol (TLS, or SASL after TLS).
    closed = sum("closed by peer" in r and ("APIVERSION_QUERY" in r or "in state UP" in r) for r in reports)
    if closed >= 2 and "Connection refused" not in text:
        return (
            f"Kafka at {bootstrap} closed the connection during the handshake: {_PROTOCOL} (now {protocol}) "
            "may not match the broker's listener (e.g. SASL_SSL), or it expects SASL settings"
        )
    return None


class _Reports:
    """librdkafka's error callbacks and log lines, kept for `security_problem` instead of printed."""

    def __init__(self) -> None:
        self.errors: list[Any] = []
        self.lines: list[str] = []

    def error_cb(self, error: Any) -> None:
        self.errors.append(error)

    def log(self, level: int, fmt: str, *args: Any) -> None:
        if len(self.lines) < 200:
            self.lines.append(fmt % args if args else fmt)

    def texts(self) -> list[str]:
        return [e.str() for e in self.errors] + self.lines


def check_broker(settings: Settings, timeout: float = 10.0, *, allow_unreachable: bool = False) -> None:
    """Raise one sentence unless the resolved broker answers metadata with these security settings.

    `KafkaSecurityError` when it refuses them (wrong password, untrusted certificate, wrong
    protocol: the sentence names the setting), `KafkaUnreachableError` when it does not answer
    (unless `allow_unreachable`: producers spool while Kafka is away). A refused connection fails
    within about a second (librdkafka reports all brokers down); a silent address waits up to
    `timeout`.
    """
    import time

    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    bootstrap, source = resolve_bootstrap(settings)
    if bootstrap == running_bootstrap(settings.kafka_state_dir):
        source = "local"  # resolved earlier by `kafka_settings`, or KAFKA_BOOTSTRAP names that broker
    ca = settings.kafka_ssl_ca_location
    if ca is not None and settings.kafka_security_protocol in ("SSL", "SASL_SSL") and not ca.is_file():
        raise KafkaSecurityError(
            bootstrap, f"{_CA} names {ca}, which is not a readable file: give the CA's PEM file"
        )
    reports = _Reports()
    conf = {
        **settings.model_copy(update={"kafka_bootstrap": bootstrap}).kafka_config(),
        # The answer is the one sentence below, not librdkafka's log lines.
        "error_cb": reports.error_cb,
        "logger": reports,
    }
    try:
        admin = AdminClient(conf)
    except KafkaException as exc:  # a setting librdkafka rejects outright (an unreadable CA file)
        text = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
        raise KafkaSecurityError(
            bootstrap,
            security_problem(settings, bootstrap, [text]) or f"invalid Kafka client settings: {text}",
        ) from None
    deadline = time.monotonic() + timeout
    reason = "no answer"
    while True:
        try:
            admin.list_topics(timeout=min(0.5, max(0.05, deadline - time.monotonic())))
            return
        except KafkaException as exc:
            error = exc.args[0] if exc.args else exc
            reason = error.str() if hasattr(error, "str") else str(error)
        admin.poll(0)  # serves error_cb and the logger
        problem = security_problem(settings, bootstrap, reports.texts())
        if problem is not None:
            raise KafkaSecurityError(bootstrap, problem) from None
        refused = [e for e in reports.errors if e.code() == KafkaError._ALL_BROKERS_DOWN]
        if refused or time.monotonic() >= deadline:
            if allow_unreachable:
                return
            if reports.errors:
                reason = reports.errors[0].str()
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
