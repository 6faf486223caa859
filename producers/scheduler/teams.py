"""Who owns a scheduler job: team from a YAML mapping of Slurm users and accounts (or namespaces).

The file:

    users: {alice: vision}          # a user's team wins...
    accounts: {research: nlp}       # ...over the account's (Slurm account or Kubernetes namespace)
    default: platform               # optional: team of everything else
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from producers.scheduler.errors import TeamMapError

__all__ = ["TeamMap"]

_KEYS = {"users", "accounts", "default"}


@dataclass(frozen=True)
class TeamMap:
    """user -> team and account -> team, with an optional default team."""

    users: dict[str, str] = field(default_factory=dict)
    accounts: dict[str, str] = field(default_factory=dict)
    default: str | None = None

    def team_for(self, user: str | None, account: str | None) -> str | None:
        """The team of a job: its user's team, else its account's, else the default (None: unknown)."""
        if user and user in self.users:
            return self.users[user]
        if account and account in self.accounts:
            return self.accounts[account]
        return self.default

    @classmethod
    def from_dict(cls, data: Any, source: str = "team map") -> TeamMap:
        """Validate a parsed mapping; a wrong shape is a `TeamMapError` naming the key."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise TeamMapError(f"{source} must be a mapping with `users`, `accounts` and `default`")
        unknown = set(data) - _KEYS
        if unknown:
            raise TeamMapError(
                f"{source}: unknown key(s) {', '.join(sorted(unknown))}; known: users, accounts, default"
            )
        maps: dict[str, dict[str, str]] = {}
        for key in ("users", "accounts"):
            value = data.get(key) or {}
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise TeamMapError(f"{source}: `{key}` must map names to team names")
            maps[key] = {str(k): v for k, v in value.items()}
        default = data.get("default")
        if default is not None and not isinstance(default, str):
            raise TeamMapError(f"{source}: `default` must be a team name")
        return cls(users=maps["users"], accounts=maps["accounts"], default=default)

    @classmethod
    def load(cls, path: Path) -> TeamMap:
        """Read a team mapping YAML file."""
        try:
            text = path.read_text()
        except OSError as exc:
            raise TeamMapError(f"cannot read the team map {path}: {exc.strerror}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise TeamMapError(f"team map {path} is not valid YAML: {exc}") from None
        return cls.from_dict(data, f"team map {path}")
