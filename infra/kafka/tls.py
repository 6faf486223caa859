"""A private certificate authority and a broker keystore for a local SASL_SSL Kafka, made with openssl.

For development and tests only: `make_pki(folder)` writes a CA (`ca.pem`), a broker certificate
for 127.0.0.1/localhost signed by it, and the broker's PKCS12 keystore (what Kafka's
`ssl.keystore.location` reads). Clients trust the broker through `ca.pem`
(RANKSIGHT_KAFKA_SSL_CA_LOCATION); a second `make_pki` gives a CA they must not trust.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from infra.errors import KafkaSetupError

__all__ = ["Pki", "make_pki"]

_DAYS = "30"


@dataclass(frozen=True)
class Pki:
    """What `make_pki` wrote: the CA certificate clients trust, the broker's keystore and its password."""

    ca_pem: Path
    keystore: Path
    keystore_password: str = field(repr=False)


def _openssl(*args: str, cwd: Path, env: dict[str, str] | None = None) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise KafkaSetupError("`openssl` not found on PATH: install it (e.g. `apt-get install openssl`)")
    done = subprocess.run(
        [openssl, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )
    if done.returncode != 0:
        raise KafkaSetupError(
            f"openssl {args[0]} failed (exit {done.returncode})", log_tail=done.stderr[-2000:]
        )


def make_pki(folder: Path, *, name: str = "ranksight-local") -> Pki:
    """A CA and a broker certificate (SAN 127.0.0.1, localhost) in `folder`, the key in a PKCS12 keystore."""
    folder.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(18)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", _DAYS, "-subj", f"/CN={name} CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=folder,
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
        "-subj", f"/CN={name} broker",
        cwd=folder,
    )  # fmt: skip
    (folder / "broker.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
    )
    _openssl(
        "x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "broker.pem", "-days", _DAYS, "-extfile", "broker.ext",
        cwd=folder,
    )  # fmt: skip
    _openssl(
        "pkcs12", "-export", "-in", "broker.pem", "-inkey", "broker.key", "-certfile", "ca.pem",
        "-name", "broker", "-out", "broker.p12", "-passout", "env:RANKSIGHT_KEYSTORE_PASSWORD",
        cwd=folder, env={"RANKSIGHT_KEYSTORE_PASSWORD": password},  # not on a command line (ps)
    )  # fmt: skip
    for private in ("ca.key", "broker.key", "broker.p12"):
        (folder / private).chmod(0o600)
    return Pki(folder / "ca.pem", folder / "broker.p12", password)
