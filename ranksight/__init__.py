"""ranksight: ranksight."""
