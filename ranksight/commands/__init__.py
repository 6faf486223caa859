"""CLI command groups; each module exposes `register(app)` and is discovered by `ranksight.cli`."""
