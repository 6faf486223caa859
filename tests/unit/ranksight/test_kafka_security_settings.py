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


# What librdkafka 2.x reports (error callbacks, log lines) when a secured broker refuses a client.
_AUTH = (
    "sasl_ssl://127.0.0.1:9093/bootstrap: SASL authentication error: Authentication failed during "
    "authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 314ms in state AUTH_REQ)"
)
_UNTRUSTED = (
    "sasl_ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate "
    "verify failed: broker certificate could not be verified, verify that ssl.ca.location is correctly "
    "configured or root CA certificates are installed (install ca-certificates package) (after 17ms in state "
    "SSL_HANDSHAKE)"
)
_PLAIN_TO_TLS = (
    "FAIL [rdkafka#producer-1] [thrd:127.0.0.1:9093/bootstrap]: 127.0.0.1:9093/bootstrap: Disconnected: "
    "connection closed by peer: receive 0 after POLLIN (after 3ms in state APIVERSION_QUERY)"
)
_MECHANISM = (
    "sasl_ssl://127.0.0.1:9093/bootstrap: SASL PLAIN mechanism handshake failed: Broker: Unsupported SASL "
    "mechanism: broker's supported mechanisms: SCRAM-SHA-512 (after 301ms in state AUTH_HANDSHAKE)"
)
_REFUSED = "127.0.0.1:9093/bootstrap: Connect to ipv4#127.0.0.1:9093 failed: Connection refused (after 0ms)"


def _secured(monkeypatch: pytest.MonkeyPatch, **extra: str) -> Settings:
    env = {
        "KAFKA_BOOTSTRAP": "127.0.0.1:9093",
        "RANKSIGHT_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "RANKSIGHT_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "RANKSIGHT_KAFKA_SASL_USERNAME": "ranksight",
        "RANKSIGHT_KAFKA_SASL_PASSWORD": "pw-123",
        **extra,
    }
    return _settings(monkeypatch, **env)


@pytest.mark.parametrize(
    ("reports", "names"),
    [
        ([_AUTH], "RANKSIGHT_KAFKA_SASL_USERNAME and RANKSIGHT_KAFKA_SASL_PASSWORD"),
        ([_UNTRUSTED], "RANKSIGHT_KAFKA_SSL_CA_LOCATION"),
        ([_PLAIN_TO_TLS, _PLAIN_TO_TLS], "RANKSIGHT_KAFKA_SECURITY_PROTOCOL"),
        ([_MECHANISM], "RANKSIGHT_KAFKA_SASL_MECHANISM"),
    ],
    ids=["wrong-password", "untrusted-certificate", "plaintext-to-tls", "mechanism"],
)
def test_a_refusal_is_one_sentence_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, reports: list[str], names: str
) -> None:
    from ranksight.broker import security_problem

    sentence = security_problem(_secured(monkeypatch), "127.0.0.1:9093", reports)
    assert sentence is not None and names in sentence
    assert "\n" not in sentence and "pw-123" not in sentence


def test_an_absent_broker_is_not_a_security_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    """Connection refused, or one connection cut once (a broker going down), is for the caller to judge."""
    from ranksight.broker import security_problem

    settings = _secured(monkeypatch)
    assert security_problem(settings, "127.0.0.1:9093", [_REFUSED, "1/1 brokers are down"]) is None
    assert security_problem(settings, "127.0.0.1:9093", [_PLAIN_TO_TLS]) is None


def test_a_missing_ca_file_is_named_before_any_connection(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from ranksight.broker import check_broker
    from ranksight.errors import KafkaSecurityError

    settings = _secured(monkeypatch, RANKSIGHT_KAFKA_SSL_CA_LOCATION=str(tmp_path / "nope.pem"))
    with pytest.raises(KafkaSecurityError, match=r"RANKSIGHT_KAFKA_SSL_CA_LOCATION names .*nope\.pem"):
        check_broker(settings, timeout=1.0)
