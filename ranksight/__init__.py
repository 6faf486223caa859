"""ranksight: streaming health checks for distributed GPU training jobs."""

# The one place the version is written: pyproject.toml reads it (`dynamic`), `ranksight --version`
# prints it, and CHANGELOG.md's newest entry must name it (tests/unit/cli/test_version.py).
__version__ = "0.2.0"
