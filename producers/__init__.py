"""ranksight: producers."""
