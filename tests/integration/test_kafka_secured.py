"""Against a broker that only speaks SASL_SSL (SCRAM-SHA-512, a CA this test makes with openssl).

Every command connects with the documented settings (RANKSIGHT_KAFKA_SECURITY_PROTOCOL,
_SASL_MECHANISM, _SASL_USERNAME, _SASL_PASSWORD, _SSL_CA_LOCATION): events published go through the
sink into ClickHouse and a worker joins its group. A wrong password or a certificate signed by a
CA the client does not trust is one sentence naming the setting to fix, within seconds, with no
librdkafka flood; no output of any command contains the password (issue 21.6).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.kafka.local import BrokerSecurity, LocalKafka, ensure_jars
from infra.kafka.tls import make_pki
from schemas.files import iter_container
from sinks.ddl import table_for
from tests.integration.stopping import RANKSIGHT, Running

USER = "ranksight"
# Bounded: a refusal is told at once, never after a client's retry loop (10 s metadata timeout).
REFUSAL_LIMIT_S = 30.0


@dataclass(frozen=True)
class Secured:
    """The running broker, the CA that signed it, another CA, and the user's password."""

    broker: LocalKafka
    ca: Path
    other_ca: Path
    password: str

    def env(self, home: Path, prefix: str = "", **overrides: str) -> dict[str, str]:
        return {
            "KAFKA_BOOTSTRAP": self.broker.bootstrap,
            "RANKSIGHT_HOME": str(home),
            "RANKSIGHT_TOPIC_PREFIX": prefix,
            "RANKSIGHT_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "RANKSIGHT_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "RANKSIGHT_KAFKA_SASL_USERNAME": USER,
            "RANKSIGHT_KAFKA_SASL_PASSWORD": self.password,
            "RANKSIGHT_KAFKA_SSL_CA_LOCATION": str(self.ca),
            **overrides,
        }


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    folder = tmp_path_factory.mktemp("secured")
    pki = make_pki(folder / "pki")
    other = make_pki(folder / "other-pki", name="someone-else")
    password = "pw-" + secrets.token_urlsafe(12)
    security = BrokerSecurity(pki.keystore, pki.keystore_password, {USER: password}, ca_location=pki.ca_pem)
    broker = LocalKafka(folder / "kafka", libs=ensure_jars(), security=security)
    broker.start()
    try:
        yield Secured(broker, pki.ca_pem, other.ca_pem, password)
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def events_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("secured-events")
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 120))
    made = subprocess.run(
        [
            RANKSIGHT,
            "simulate",
            "-s",
            "healthy",
            "--duration",
            "1m",
            "--start",
            start,
            "-o",
            "events.avro",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
    )
    assert made.returncode == 0, made.stderr
    return folder / "events.avro"


def _run(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RANKSIGHT, *args],
        # PYTHONPATH passes through: a checkout run against a shared virtual environment imports its own code.
        env={"PATH": "/usr/bin:/bin", **_pythonpath(), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _pythonpath() -> dict[str, str]:
    return {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}


def _no_secret(secured: Secured, *outputs: str) -> None:
    for text in outputs:
        assert secured.password not in text, "the SASL password appeared in a command's output"


def test_publish_then_sink_stores_every_event_over_sasl_ssl(
    secured: Secured, events_file: Path, tmp_path: Path
) -> None:
    prefix = f"s{uuid.uuid4().hex[:6]}."
    env = secured.env(tmp_path / "home", prefix)
    topics = _run(env, "kafka", "topics")
    assert topics.returncode == 0, topics.stderr
    published = _run(env, "publish", str(events_file))
    assert published.returncode == 0, published.stderr
    counts = Counter(table_for(e.type).name for e in iter_container(events_file))
    total = sum(counts.values())
    assert f"published {total:,} events" in published.stdout, published.stdout
    sink = _run(env, "sink", "--idle-exit", "5", "--batch-interval", "0.2")
    assert sink.returncode == 0, sink.stderr
    assert f"inserted {total:,} rows" in sink.stdout, sink.stdout
    statement = "SELECT " + " + ".join(f"(SELECT count() FROM {t})" for t in sorted(counts))
    rows = _run(env, "sql", "-f", "csv", statement)
    assert rows.returncode == 0, rows.stderr
    assert int(rows.stdout.strip().splitlines()[-1]) == total
    status = _run(env, "status")
    assert status.returncode == 0, status.stderr
    _no_secret(secured, *(r.stdout + r.stderr for r in (topics, published, sink, rows, status)))


@pytest.mark.parametrize("runtime", ["direct", "faust"])
def test_a_worker_joins_its_group_over_sasl_ssl(secured: Secured, tmp_path: Path, runtime: str) -> None:
    prefix = f"w{uuid.uuid4().hex[:6]}."
    env = secured.env(tmp_path / "home", prefix)
    assert _run(env, "kafka", "topics").returncode == 0
    worker = Running.start(
        ["worker", "--runtime", runtime, "--log-level", "info"],
        env=env,
        log=tmp_path / "worker.log",
        ignore_sigint=False,
    )
    try:
        worker.wait_for(r"assigned partitions|[Aa]ssigned.*partitions", timeout=180)
        stopped = worker.stop(signal.SIGTERM)
    finally:
        worker.kill()
    assert stopped.code == 0, stopped.output
    _no_secret(secured, stopped.output)


# Each command that talks to Kafka, as far as its connection goes.
COMMANDS = [
    ["kafka", "topics"],
    ["sink"],
    ["serve", "--port", "0"],
    ["worker", "--runtime", "direct"],
    ["worker", "--runtime", "faust"],
    ["alerts", "tail"],
    ["alerts", "forward", "--alertmanager", "http://127.0.0.1:9"],
    ["status"],
    ["record", "--from", "-1m", "-o", "out.avro"],
    ["replay-kafka", "--from", "-1m", "--dry-run"],
    ["publish", "EVENTS"],
    ["simulate", "-s", "healthy", "--duration", "1m", "--to-kafka", "--speed", "100"],
    ["agent", "--simulate", "--count", "1"],
    ["remediate", "--policy", "POLICY", "--slurm"],
    ["scheduler", "--slurm", "--count", "1"],
    ["replay", "EVENTS", "--to-kafka"],
]
# The shipped example policy: remediate reads it before it connects.
POLICY = Path(__file__).resolve().parents[2] / "examples" / "remediation.yaml"


@dataclass(frozen=True)
class Refusal:
    overrides: dict[str, str]
    names: str


def _refusals(secured: Secured) -> dict[str, Refusal]:
    return {
        "wrong-password": Refusal(
            {"RANKSIGHT_KAFKA_SASL_PASSWORD": "not-" + secured.password},
            "check RANKSIGHT_KAFKA_SASL_USERNAME and RANKSIGHT_KAFKA_SASL_PASSWORD",
        ),
        "untrusted-certificate": Refusal(
            {"RANKSIGHT_KAFKA_SSL_CA_LOCATION": str(secured.other_ca)},
            "does not trust: set RANKSIGHT_KAFKA_SSL_CA_LOCATION",
        ),
    }


@pytest.mark.parametrize("refusal", ["wrong-password", "untrusted-certificate"])
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "-".join(c[:2]))
def test_a_refused_client_gets_one_sentence_naming_the_setting(
    secured: Secured, events_file: Path, tmp_path: Path, command: list[str], refusal: str
) -> None:
    case = _refusals(secured)[refusal]
    env = secured.env(tmp_path / "home", f"r{uuid.uuid4().hex[:6]}.", **case.overrides)
    placeholders = {"EVENTS": str(events_file), "POLICY": str(POLICY)}
    args = [placeholders.get(a, a) for a in command]
    started = time.monotonic()
    done = _run(env, *args, timeout=120)
    took = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert case.names in done.stderr, output
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output  # one sentence ...
    assert len(done.stderr.splitlines()) <= 4, output  # ... not a librdkafka flood
    assert "Traceback" not in output
    assert took < REFUSAL_LIMIT_S, f"{took:.1f} s: {output}"
    _no_secret(secured, output)
    wrong = case.overrides.get("RANKSIGHT_KAFKA_SASL_PASSWORD")
    assert wrong is None or wrong not in output
