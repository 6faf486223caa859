"""Every command finds Kafka the same way: KAFKA_BOOTSTRAP, else the running local broker, else one right sentence."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ranksight.broker import check_broker, kafka_settings, resolve_bootstrap
from ranksight.cli import app
from ranksight.errors import KafkaNotFoundError, KafkaUnreachableError
from ranksight.settings import Settings

runner = CliRunner()

# Each command that talks to Kafka, with arguments that get it as far as finding Kafka.
KAFKA_COMMANDS = [
    ["worker"],
    ["sink"],
    ["alerts", "tail"],
    ["alerts", "forward", "--alertmanager", "http://127.0.0.1:9"],
    ["record", "--from", "-1m", "-o", "out.avro"],
    ["replay-kafka", "--from", "-1m", "--dry-run"],
    ["publish", "events.avro"],
    ["agent", "--simulate", "--count", "1"],
    ["simulate", "--scenario", "mixed", "--to-kafka"],
    ["kafka", "topics"],
    ["spool", "drain"],
]


def test_the_environment_wins(home: Path, local_broker_state: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "kafka.example:9092")
    assert resolve_bootstrap(Settings()) == ("kafka.example:9092", "env")


def test_the_running_local_broker_is_found(home: Path, local_broker_state: str) -> None:
    assert resolve_bootstrap(Settings()) == (local_broker_state, "local")
    assert kafka_settings().kafka_bootstrap == local_broker_state


def test_no_kafka_at_all_says_how_to_get_one(home: Path) -> None:
    with pytest.raises(
        KafkaNotFoundError, match=r"set KAFKA_BOOTSTRAP=host:port, or start .*`ranksight kafka up`"
    ):
        resolve_bootstrap(Settings())


def test_a_stopped_local_broker_is_named(home: Path) -> None:
    (home / "kafka").mkdir(parents=True)
    (home / "kafka" / "kafka.json").write_text(
        '{"pid": 999999999, "bootstrap": "127.0.0.1:1", "config": "/nonexistent/server.properties"}'
    )
    with pytest.raises(KafkaNotFoundError, match="no longer running"):
        resolve_bootstrap(Settings())


def test_a_refused_connection_fails_fast_in_one_sentence(home: Path, closed_port: int) -> None:
    settings = Settings(kafka_bootstrap=f"127.0.0.1:{closed_port}")
    with pytest.raises(KafkaUnreachableError) as caught:
        check_broker(settings, timeout=30)  # refused: answered within about a second, not 30
    message = str(caught.value)
    assert message.startswith(f"Kafka at 127.0.0.1:{closed_port} does not answer")
    assert "\n" not in message
    assert "KAFKA_BOOTSTRAP" in message


@pytest.mark.parametrize("args", KAFKA_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_every_command_says_the_same_sentence_without_kafka(
    home: Path, args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "events.avro").write_bytes(b"")
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "no Kafka: set KAFKA_BOOTSTRAP=host:port, or start a local broker with `ranksight kafka up`" in (
        result.output
    )
    assert "Traceback" not in result.output


def test_the_worker_uses_the_local_broker_and_does_not_tell_to_start_it(
    home: Path, local_broker_state: str
) -> None:
    """The broker process runs (its port does not answer): the error names it, not `kafka up`."""
    result = runner.invoke(app, ["worker"])
    assert result.exit_code == 1
    assert f"Kafka at {local_broker_state} does not answer" in result.output
    assert "ranksight kafka status" in result.output
    assert "kafka up" not in result.output


def test_the_worker_against_a_closed_port_is_one_line_not_a_traceback(
    home: Path, closed_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP", f"127.0.0.1:{closed_port}")
    result = runner.invoke(app, ["worker"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"error: Kafka at 127.0.0.1:{closed_port} does not answer")
