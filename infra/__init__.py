"""ranksight: infra."""
