"""ranksight: streams."""
