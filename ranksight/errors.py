"""Errors of the `ranksight` command line itself (each prints as one sentence)."""

from __future__ import annotations

from schemas.errors import RanksightError

__all__ = ["KafkaNotFoundError", "KafkaSecurityError", "KafkaUnreachableError"]


class KafkaNotFoundError(RanksightError):
    """Neither KAFKA_BOOTSTRAP nor a running local broker says where Kafka is."""


class KafkaUnreachableError(RanksightError):
    """The resolved Kafka address does not answer a metadata request."""

    def __init__(self, bootstrap: str, source: str, reason: str) -> None:
        self.bootstrap = bootstrap
        self.source = source
        self.reason = reason
        if source == "local":
            hint = "the local broker's process runs but does not answer; see `ranksight kafka status`"
        else:
            hint = "check the address in KAFKA_BOOTSTRAP and that the broker runs"
        super().__init__(f"Kafka at {bootstrap} does not answer ({reason}): {hint}")


class KafkaSecurityError(RanksightError):
    """Kafka answers but refuses this client: wrong credentials, an untrusted certificate, the wrong
    security protocol. The sentence names the setting to fix; it never contains a secret."""

    def __init__(self, bootstrap: str, message: str) -> None:
        self.bootstrap = bootstrap
        super().__init__(message)
