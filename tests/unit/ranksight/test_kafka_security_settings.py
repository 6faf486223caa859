"""Kafka security settings: what each client gets, and secrets never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from ranksight.settings import Settings


def _settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


def test_sasl_ssl_settings_reach_librdkafka(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    settings = _settings(
        monkeypatch,
        KAFKA_BOOTSTRAP="b:9093",
        RANKSIGHT_KAFKA_SECURITY_PROTOCOL="SASL_SSL",
        RANKSIGHT_KAFKA_SASL_MECHANISM="SCRAM-SHA-512",
        RANKSIGHT_KAFKA_SASL_USERNAME="ranksight",
        RANKSIGHT_KAFKA_SASL_PASSWORD="pw-123",
        RANKSIGHT_KAFKA_SSL_CA_LOCATION=str(ca),
    )
    conf = settings.kafka_config()
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.mechanism"] == "SCRAM-SHA-512"
    assert (conf["sasl.username"], conf["sasl.password"]) == ("ranksight", "pw-123")
    assert conf["ssl.ca.location"] == str(ca)


def test_a_ca_file_is_not_passed_without_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka warns about SSL settings on a plaintext connection: they are left out."""
    settings = _settings(monkeypatch, KAFKA_BOOTSTRAP="b:9092", RANKSIGHT_KAFKA_SSL_CA_LOCATION="/x/ca.pem")
    assert "ssl.ca.location" not in settings.kafka_config()
    assert settings.kafka_ssl_context() is None


def test_python_clients_get_a_verifying_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    import ssl

    settings = _settings(monkeypatch, KAFKA_BOOTSTRAP="b:9093", RANKSIGHT_KAFKA_SECURITY_PROTOCOL="SSL")
    context = settings.kafka_ssl_context()
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_the_password_is_hidden_in_as_dict_and_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(
        monkeypatch, RANKSIGHT_KAFKA_SASL_PASSWORD="pw-123", CLICKHOUSE_URL="http://u:chpw-9@h:8123"
    )
    shown = f"{settings.as_dict()} {settings!r} {settings}"
    assert "pw-123" not in shown and "chpw-9" not in shown
