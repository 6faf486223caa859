"""Build guard: a wheel or sdist without the UI's charting library would serve pages with no charts.

Everything else is declared in pyproject.toml. `make dist` fetches the library first
(`make ui-assets`); an editable install (`pip install -e .`, `make test`) does not need it here.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ECHARTS = Path("ui/static/vendor/echarts.min.js")


class BuildPy(build_py):
    """`build_py` that refuses to package the UI without its charting library."""

    def run(self) -> None:
        if not getattr(self, "editable_mode", False) and not ECHARTS.is_file():
            raise SystemExit(f"error: {ECHARTS} is missing: run `make ui-assets` (npm, once) before building")
        super().run()


setup(cmdclass={"build_py": BuildPy})
