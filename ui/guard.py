"""What the UI checks before it answers and scrubs before it shows: the Host a request names, and
credentials embedded in URLs.

DNS rebinding: a page on `evil.example` whose name later resolves to 127.0.0.1 reaches a UI bound
to loopback with `Host: evil.example`; the browser treats the answers as that page's own. The UI
answers only requests naming it: an IP literal (a rebinding page cannot be served from one),
`localhost`, this machine's names, or a name the operator configured (`--allowed-host`).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from typing import Any

__all__ = ["HostCheck", "redact_credentials", "redacted"]

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
