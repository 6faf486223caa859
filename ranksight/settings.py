"""Typed, frozen settings from the environment: `RANKSIGHT_*` plus the standard service variables."""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["ENV", "Settings", "default_home", "load_settings"]

_TLS = ("SSL", "SASL_SSL")

# Every environment variable ranksight reads, in one place.
ENV = {
    "kafka_bootstrap": "KAFKA_BOOTSTRAP",
    "clickhouse_url": "CLICKHOUSE_URL",
    "schema_registry_url": "SCHEMA_REGISTRY_URL",
    "home": "RANKSIGHT_HOME",
    "xdg_data_home": "XDG_DATA_HOME",
}


def default_home() -> Path:
    """The per-user data directory: `$XDG_DATA_HOME/ranksight`, else `~/.local/share/ranksight`."""
    xdg = os.environ.get(ENV["xdg_data_home"], "")
    # The XDG spec says a relative value is invalid and must be ignored.
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "ranksight"


class Settings(BaseSettings):
    """Where ranksight finds Kafka, ClickHouse and the registry, and where it keeps local state."""

    model_config = SettingsConfigDict(env_prefix="RANKSIGHT_", frozen=True, extra="ignore")

    kafka_bootstrap: str | None = Field(
        default=None, validation_alias=AliasChoices("KAFKA_BOOTSTRAP", "RANKSIGHT_KAFKA_BOOTSTRAP")
    )
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_ca_location: Path | None = Field(
        default=None,
        description="PEM file of the CA that signed the brokers' certificates (SSL, SASL_SSL); "
        "default: the system's trust store.",
    )
    clickhouse_url: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("CLICKHOUSE_URL", "RANKSIGHT_CLICKHOUSE_URL")
    )
    schema_registry_url: str | None = Field(
        default=None, validation_alias=AliasChoices("SCHEMA_REGISTRY_URL", "RANKSIGHT_SCHEMA_REGISTRY_URL")
    )
    schema_registry_basic_auth: SecretStr | None = None
    home: Path = Field(
        default_factory=default_home,
        description="Local state: chDB data, the local broker, spools (default: the XDG data dir).",
    )
    cluster: str = "local"
    ttl_days: int = Field(default=30, ge=1, description="Retention of raw tables in ClickHouse, days.")
    topic_prefix: str = ""
    alertmanager_url: str | None = Field(
        default=None,
        description="Alertmanager base URL (RANKSIGHT_ALERTMANAGER_URL): pages show its silences "
        "(streams.alerting.alertmanager.read_silences).",
    )

    @property
    def chdb_path(self) -> Path:
        """The chDB directory used when no ClickHouse server URL is set."""
        return self.home / "chdb"

    @property
    def kafka_state_dir(self) -> Path:
        """Where `ranksight kafka up` keeps the local broker."""
        return self.home / "kafka"

    @property
    def demo_chdb_path(self) -> Path:
        """The chDB directory of the last `ranksight demo` (read by `ranksight sql --demo`)."""
        return self.home / "demo" / "chdb"

    @property
    def spool_root(self) -> Path:
        """Where producers spool events while Kafka is unreachable, one folder per producer."""
        return self.home / "spool"

    def clickhouse_dsn(self) -> str:
        """`CLICKHOUSE_URL` when set, else `chdb:///<home>/chdb`."""
        if self.clickhouse_url is not None:
            return self.clickhouse_url.get_secret_value()
        return f"chdb://{self.chdb_path.resolve()}"

    def kafka_config(self) -> dict[str, Any]:
        """librdkafka client settings for the configured cluster (bootstrap must be set)."""
        if not self.kafka_bootstrap:
            raise ValueError("no Kafka bootstrap: set KAFKA_BOOTSTRAP (or resolve it with ranksight.broker)")
        conf: dict[str, Any] = {
            "bootstrap.servers": self.kafka_bootstrap,
            "security.protocol": self.kafka_security_protocol,
        }
        if self.kafka_sasl_mechanism:
            conf["sasl.mechanism"] = self.kafka_sasl_mechanism
            conf["sasl.username"] = self.kafka_sasl_username or ""
            conf["sasl.password"] = (
                self.kafka_sasl_password.get_secret_value() if self.kafka_sasl_password else ""
            )
        if self.kafka_ssl_ca_location is not None and self.kafka_security_protocol in _TLS:
            conf["ssl.ca.location"] = str(self.kafka_ssl_ca_location)
        return conf

    def kafka_ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for Python clients (aiokafka, Faust): None unless the protocol uses TLS."""
        if self.kafka_security_protocol not in _TLS:
            return None
        cafile = str(self.kafka_ssl_ca_location) if self.kafka_ssl_ca_location is not None else None
        return ssl.create_default_context(cafile=cafile)

    def as_dict(self) -> dict[str, Any]:
        """Settings for logs, secrets hidden."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            out[name] = "***" if isinstance(value, SecretStr) else value
        return out


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment, with explicit overrides (CLI flags) on top."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
