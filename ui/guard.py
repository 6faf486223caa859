"""What the UI checks before it answers and scrubs before it shows: the Host a request names, and
credentials embedded in URLs.

DNS rebinding: a page on `evil.example` whose name later resolves to 127.0.0.1 reaches a UI bound
to loopback with `Host: evil.example`; the browser treats the answers as that page's own. The UI
answers only requests naming it: an IP literal (a rebinding page cannot be served from one),
`localhost`, this machine's names, or a name the operator configured (`--allowed-host`).
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["HostCheck", "WriteAuth", "WriteRefused", "redact_credentials", "redacted"]

# `scheme://user:password@` or `scheme://token@`: what comes before the `@` of a URL's authority.
_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/\s@?#]*@")


def redact_credentials(text: str) -> str:
    """`text` with the credentials of every URL in it replaced by `***` (`http://***@am:9093`)."""
    return _CREDENTIALS.sub(r"\1***@", text)


def redacted(value: Any) -> Any:
    """A JSON-like value with `redact_credentials` applied to every string in it (keys included)."""
    if isinstance(value, str):
        return redact_credentials(value)
    if isinstance(value, dict):
        return {redacted(k): redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redacted(v) for v in value]
    return value


def _host_name(header: str) -> str | None:
    """The name of a Host header without its port, lower case; None when it is not a host[:port]."""
    header = header.strip().lower()
    if header.startswith("["):  # [v6]:port
        end = header.find("]")
        return header[1:end] if end > 0 else None
    name, _, port = header.partition(":")
    if port and not port.isdigit():
        return None
    return name.rstrip(".") or None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostCheck:
    """Which Host headers the UI answers: IP literals, localhost, this machine's names and `names`."""

    def __init__(self, names: Iterable[str] = (), *, machine_names: bool = True) -> None:
        allowed = {"localhost", *(n.strip().lower().rstrip(".") for n in names if n.strip())}
        if machine_names:
            for name in (socket.gethostname(), socket.getfqdn()):
                if name:
                    allowed.add(name.lower().rstrip("."))
        self.names = frozenset(allowed)

    def allows(self, header: str | None) -> bool:
        """Whether a request with this Host header is for this UI (no header: an HTTP/1.0 client, allowed)."""
        if header is None or header == "":
            return True
        name = _host_name(header)
        if name is None:
            return False
        return _is_ip(name) or name in self.names or name.endswith(".localhost")


class WriteRefused(Exception):
    """A write (a silence) the UI's authentication does not allow; its message says what to do."""


@dataclass(frozen=True)
class WriteAuth:
    """Who may create silences from the UI, the one write it does.

    `user_header`: a reverse proxy in front authenticates and names the user in this header (the
    silence's author is that name). `token`: a shared secret sent as `Authorization: Bearer ...`.
    With neither, writes are allowed only while the UI listens on loopback (`loopback`): anyone who
    can reach a UI bound beyond the machine could otherwise mute pages.
    """

    token: str | None = None
    user_header: str | None = None
    loopback: bool = True

    @property
    def required(self) -> str:
        """What a request must carry: `header`, `token` or `` (nothing, on loopback)."""
        return "header" if self.user_header else "token" if self.token else ""

    def identity(self, headers: Mapping[str, str]) -> str:
        """The authenticated user ('' when none is needed); WriteRefused when the request may not write."""
        if self.user_header:
            user = (headers.get(self.user_header) or "").strip()
            if not user:
                raise WriteRefused(f"silencing needs the {self.user_header} header your proxy sets")
            return user[:200]
        if self.token:
            given = headers.get("Authorization") or ""
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                raise WriteRefused("silencing needs the UI's token: paste it into the form")
            return ""
        if not self.loopback:
            raise WriteRefused(
                "silencing from a UI that listens beyond this machine needs --auth-token or --auth-header"
            )
        return ""
