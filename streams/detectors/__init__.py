"""ranksight: streams/detectors."""
