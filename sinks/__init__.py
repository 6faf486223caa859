"""ranksight: sinks."""
