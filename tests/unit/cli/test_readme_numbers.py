"""The README's example numbers that a deterministic command produces are today's (issue 24.8).

Each is recomputed here from the same command's code path (the simulator with its seed, the
shipped scenario set) and compared with what the README prints; a change that moves one fails
until the README says the new number. The README keeps the demo's tables; the spool example and
the evaluation's scenario count moved with the reference to docs/producing.md and
docs/detection.md (issue 31.6) and are held there. The README itself stays a front page: under
250 lines, every relative link resolving.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from producers.simulator import builtin_scenarios, load_scenario, simulate
from sinks.ddl import table_for

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()
PRODUCING = (ROOT / "docs" / "producing.md").read_text()
DETECTION = (ROOT / "docs" / "detection.md").read_text()


def _int(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.fixture(scope="module")
def mixed() -> tuple[Counter[str], list[tuple[str, str, str]]]:
    """`make demo`'s scenario (mixed, seed 0): events per table, and the labelled faults."""
    sim = simulate(load_scenario("mixed"), 0)
    counts = Counter(table_for(e.type).name for e in sim.events())
    return counts, [(lab["fault"], lab["job_id"], lab["alert"]) for lab in sim.labels]


def test_the_demo_tables_published_counts(mixed: tuple[Counter[str], list[tuple[str, str, str]]]) -> None:
    rows = re.findall(r"│ (\w+) +│ +([\d,]+) │ +([\d,]+) │ ok │", README)
    assert len(rows) >= 3
    for table, published, stored in rows:
        assert _int(published) == mixed[0][table], table
        assert stored == published


def test_the_demo_tables_faults(mixed: tuple[Counter[str], list[tuple[str, str, str]]]) -> None:
    rows = re.findall(r"│ (\w+) +│ ([\w.-]+) +│ (\w+) +│ yes +│", README)
    assert rows == mixed[1]


def test_the_spool_example_is_a_one_minute_mixed_run() -> None:
    """`simulate -s mixed --duration 1m --to-kafka` with Kafka away spools every event it makes."""
    listed = re.search(r"ranksight spool list +# simulate: ([\d,]+) events", PRODUCING)
    drained = re.search(r"ranksight spool drain +# simulate: sent ([\d,]+) of ([\d,]+) events", PRODUCING)
    assert listed is not None and drained is not None
    made = sum(1 for _ in simulate(load_scenario("mixed").with_overrides(duration=60.0), 0).events())
    assert _int(listed[1]) == _int(drained[1]) == _int(drained[2]) == made


def test_the_evaluation_counts_the_shipped_scenarios() -> None:
    found = re.search(r"`ranksight evaluate` over the (\d+) shipped scenarios", DETECTION)
    assert found is not None
    assert int(found[1]) == len(builtin_scenarios())


def test_the_readme_is_a_front_page_whose_links_resolve() -> None:
    """Under 250 lines (the reference lives in docs/), and every relative link names a file that exists."""
    assert len(README.splitlines()) < 250
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert links
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert missing == []
