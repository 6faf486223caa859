"""Small things a new user trips over in the first hour: each one a sentence or a fast, honest output."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import fastavro
import pytest
from typer.testing import CliRunner

from ranksight.cli import app
from ranksight.commands.alerts import alert_json
from sinks.samples import sample_event

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[3]


def test_replay_of_a_foreign_avro_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "foreign.avro"
    with path.open("wb") as fh:
        fastavro.writer(
            fh, {"type": "record", "name": "Foo", "fields": [{"name": "x", "type": "int"}]}, [{"x": 1}]
        )
    result = runner.invoke(app, ["replay", str(path), "--alerts-out", str(tmp_path / "a.jsonl"), "-q"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {path}: not a file of ranksight events")


def test_events_load_of_a_non_utf8_file_is_one_error_naming_the_file(tmp_path: Path) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_bytes(b'{"type": "RankBound", "job_id": "\xff"}\n')
    result = runner.invoke(app, ["events", "load", str(src), "-o", str(tmp_path / "out.avro")])
    assert result.exit_code == 1
    assert "Traceback" not in result.output and "UnicodeDecodeError" not in result.output
    assert f"{src}: 1 invalid line(s)" in result.output
    assert "not UTF-8 text: byte 0xff" in result.output


def test_events_load_says_a_timestamp_looks_like_seconds(tmp_path: Path) -> None:
    src = tmp_path / "secs.jsonl"
    src.write_text(
        '{"type": "RankBound", "ts": 1764486000, "job_id": "j", "rank": 0, "node": "n", "pid": 1}\n'
    )
    result = runner.invoke(app, ["events", "load", str(src), "-o", str(tmp_path / "out.avro")])
    assert result.exit_code == 1
    assert "looks like seconds" in result.output


def test_alerts_as_json_carry_iso_timestamps_like_every_other_json_output() -> None:
    record = sample_event("Alert", 0, 1_764_486_000_123).record
    line = json.loads(alert_json(record))
    assert line["type"] == "Alert"
    assert line["ts"] == "2025-11-30T07:00:00.123Z"
    assert not any(isinstance(v, int) and v > 10**12 for v in line.values())


def test_help_and_light_commands_import_no_heavy_library() -> None:
    """`ranksight --help` used to import ClickHouse, Kafka, Avro, pydantic and the detectors (~1.2 s+)."""
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from ranksight.cli import app\n"
        "assert CliRunner().invoke(app, ['--help']).exit_code == 0\n"
        "heavy = ('clickhouse_connect', 'chdb', 'confluent_kafka', 'fastavro', 'faust', 'pydantic_settings',\n"
        "         'streams', 'sinks', 'producers')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in heavy}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_lists_unit_and_integration() -> None:
    out = subprocess.run(["make", "-s", "help"], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    targets = {line.split()[1] for line in out.splitlines() if line.startswith("make ")}
    assert {"unit", "integration", "test", "demo"} <= targets


def test_piped_tables_are_not_cut_to_80_columns() -> None:
    """Without a terminal the console prints at natural width (CliRunner's output is not a TTY)."""
    from rich.table import Table

    from ranksight.console import console

    table = Table("name", "value")
    table.add_row("a-long-column-value-" * 6, "x" * 150)
    with console.capture() as captured:
        console.print(table)
    assert "x" * 150 in captured.get()
    assert "a-long-column-value-" * 6 in captured.get()


class _OldClickHouse(BaseHTTPRequestHandler):
    """Answers like Debian's ClickHouse 18.16: version() works, clickhouse-connect's start-up query does not."""

    def do_GET(self) -> None:
        self._answer(parse_qs(urlparse(self.path).query).get("query", [""])[0])

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode(errors="replace")
        self._answer(parse_qs(urlparse(self.path).query).get("query", [""])[0] + body)

    def _answer(self, query: str) -> None:
        if "version()" in query and "readonly" not in query:
            status, text = 200, ("18.16.1\tUTC\n" if "timezone()" in query else "18.16.1\n")
        else:
            status, text = 404, "Code: 47, e.displayText() = DB::Exception: Unknown identifier: readonly\n"
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def old_clickhouse() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _OldClickHouse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_old_clickhouse_server_is_named_too_old(old_clickhouse: str) -> None:
    from sinks.clickhouse import connect
    from sinks.errors import ClickHouseError

    with pytest.raises(ClickHouseError) as caught:
        connect(old_clickhouse)
    message = str(caught.value)
    assert "is version 18.16.1, too old: ranksight needs ClickHouse 22.8 or newer" in message
    assert "readonly" not in message


def test_sql_against_an_old_server_is_one_sentence(
    old_clickhouse: str, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLICKHOUSE_URL", old_clickhouse)
    result = runner.invoke(app, ["sql", "SELECT 1"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"error: the ClickHouse server at {old_clickhouse} is version 18.16.1, too old: "
        "ranksight needs ClickHouse 22.8 or newer"
    ]
