"""ranksight: infra/kafka."""
