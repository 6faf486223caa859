"""The provisioned Grafana dashboards: valid JSON on the provisioned data source, every SQL query runs on chDB.

Grafana cannot run here, so its macros are replaced by the concrete SQL the ClickHouse plugin
would send, and template variables by values their own queries return from the store.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml

from tests.integration.ui.conftest import STRAGGLER_JOB, UiStore

GRAFANA = Path(__file__).parents[3] / "infra" / "grafana" / "provisioning"
DASHBOARDS = sorted((GRAFANA / "dashboards" / "ranksight").glob("*.json"))
# Panels that may be empty on the test scenario (nothing of that kind happened in it).
MAY_BE_EMPTY = {"Checkpoints and evaluations", "XID, ECC and throttling events"}


def _datasource() -> dict[str, Any]:
    provisioned = yaml.safe_load((GRAFANA / "datasources" / "clickhouse.yaml").read_text())
    (source,) = provisioned["datasources"]
    return source


def _ch_time(ms: int) -> str:
    return f"toDateTime64('{datetime.fromtimestamp(ms / 1000, UTC):%Y-%m-%d %H:%M:%S}', 3, 'UTC')"


def _percent_encode(value: str) -> str:
    """Grafana's `percentencode` format: encodeURIComponent plus `!'()*` (RFC 3986 unreserved kept)."""
    return quote(value, safe="-_.~")


def _expand(
    sql: str, values: dict[str, list[str]], t0: int, t1: int, multi: frozenset[str] = frozenset()
) -> str:
    """The SQL the ClickHouse plugin would send: macros and variables replaced.

    `multi`: the multi-value variables (Grafana formats their list as `{a,b}` before encoding it).
    """
    sql = re.sub(
        r"\$__timeFilter\(([^)]+)\)",
        lambda m: f"({m[1]} >= {_ch_time(t0)} AND {m[1]} <= {_ch_time(t1)})",
        sql,
    )
    sql = re.sub(
        r"\$__timeInterval\(([^)]+)\)", lambda m: f"toStartOfInterval({m[1]}, INTERVAL 60 second)", sql
    )
    sql = (
        sql.replace("$__interval_s", "60")
        .replace("$__fromTime", _ch_time(t0))
        .replace("$__toTime", _ch_time(t1))
    )
    for name, vals in values.items():
        text = "{" + ",".join(vals) + "}" if name in multi else (vals[0] if vals else "")
        sql = sql.replace(f"${{{name}:percentencode}}", _percent_encode(text))
    assert "$" not in sql, f"unexpanded macro or variable in: {sql}"
    return sql


def test_the_data_source_reads_the_database_clickhouse_url_documents() -> None:
    """The provisioned data source reads `default`, where CLICKHOUSE_URL's documented DSN writes."""
    source = _datasource()
    assert source["type"] == "grafana-clickhouse-datasource"
    assert source["jsonData"]["defaultDatabase"] == "default"
    provider = yaml.safe_load((GRAFANA / "dashboards" / "ranksight.yaml").read_text())["providers"][0]
    assert provider["options"]["path"].endswith("/dashboards/ranksight")


def test_the_four_dashboards_are_valid_and_use_the_provisioned_source() -> None:
    """Fleet, job, GPU and pipeline dashboards: unique uids, panels laid out, every query on the data source."""
    uid = _datasource()["uid"]
    boards = [json.loads(path.read_text()) for path in DASHBOARDS]
    assert {b["uid"] for b in boards} == {
        "ranksight-fleet",
        "ranksight-job",
        "ranksight-gpu",
        "ranksight-pipeline",
    }
    for board in boards:
        assert board["title"] and board["panels"]
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), board["uid"]
        for var in board["templating"]["list"]:
            assert var["datasource"]["uid"] == uid and var["query"].lstrip().upper().startswith("SELECT")
        for panel in board["panels"]:
            assert (
                set(panel["gridPos"]) == {"x", "y", "w", "h"}
                and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
            )
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == uid and target["rawSql"].strip()


def _multi(board: dict[str, Any]) -> frozenset[str]:
    return frozenset(v["name"] for v in board["templating"]["list"] if v.get("multi"))


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_query_of_a_dashboard_runs_on_the_store(path: Path, ui_store: UiStore) -> None:
    """Each variable and panel query runs on chDB over the simulated incident; panels show data."""
    board = json.loads(path.read_text())
    client = ui_store.client
    t0, t1 = ui_store.start_ms - 3600_000, ui_store.start_ms + 24 * 3600_000
    values: dict[str, list[str]] = {}
    for var in board["templating"]["list"]:
        found = [
            str(r[0]) for r in client.query(_expand(var["query"], values, t0, t1, _multi(board))).result_rows
        ]
        assert found, f"variable {var['name']} has no values"
        values[var["name"]] = [STRAGGLER_JOB] if var["name"] == "job" else found
    for panel in board["panels"]:
        rows = 0
        for target in panel["targets"]:
            rows += len(client.query(_expand(target["rawSql"], values, t0, t1, _multi(board))).result_rows)
        if panel["title"] not in MAY_BE_EMPTY:
            assert rows > 0, f"{path.stem}: panel {panel['title']!r} is empty"


# A job id, team, cluster or node is whatever a record carried: quotes, backslashes, SQL, commas.
HOSTILE = 'j\'); DROP TABLE steps; --\\ "x" ,{}'


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_a_hostile_variable_value_breaks_no_query(path: Path, ui_store: UiStore) -> None:
    """Every variable set to a value with quotes and a backslash: each query still parses and runs, and finds
    the rows of that very value (a job stored under the hostile id shows in the job dashboard)."""
    board = json.loads(path.read_text())
    # Only the percent-encoded form reaches SQL text (`singlequote` leaves a backslash that escapes the quote).
    assert not re.findall(r"\$\{\w+(?::(?!percentencode\})[^}]*)?\}", path.read_text())
    names = [v["name"] for v in board["templating"]["list"]]
    values = {name: [HOSTILE] for name in names}
    t0, t1 = ui_store.start_ms - 3600_000, ui_store.start_ms + 24 * 3600_000
    for var in board["templating"]["list"]:
        ui_store.client.query(_expand(var["query"], values, t0, t1, _multi(board)))
    for panel in board["panels"]:
        for target in panel["targets"]:
            ui_store.client.query(_expand(target["rawSql"], values, t0, t1, _multi(board)))
    if "job" in names:
        # The value reaches ClickHouse unchanged: it matches a job stored under exactly that id.
        sql = next(
            t["rawSql"] for p in board["panels"] for t in p["targets"] if "FROM steps WHERE" in t["rawSql"]
        )
        probe = _expand(sql.split(" WHERE ")[1].split(" AND ")[0], values, t0, t1)
        matched = ui_store.client.query(
            f"SELECT {probe} FROM (SELECT {{v:String}} AS job_id)", parameters={"v": HOSTILE}
        )
        assert matched.result_rows == [(True,)]
