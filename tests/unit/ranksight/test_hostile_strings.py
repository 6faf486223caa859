"""Every command prints record strings as literal text: Rich markup in a job id, node, rule or summary
neither crashes the command nor styles its output, and control characters and ANSI escape sequences
reach the operator's terminal as visible escapes, never as actions."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from ranksight.cli import app

# Each would crash Rich (`[/]` closes nothing), style the line, clear the screen or rewrite the line.
HOSTILE = ("[/]", "[bold red]x", "\x1b[2J", "a\rb", "ok\u202eevil")
JOB = "".join(HOSTILE)


def _shown(text: str) -> None:
    """The hostile job id is on the line as typed, with its controls escaped and nothing acted on."""
    assert "[/][bold red]x\\x1b[2Ja\\x0dbok\\u202eevil" in text, text
    assert "\x1b[2J" not in text and "\r" not in text and "\u202e" not in text


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """The commands' console as a colour terminal, its output captured."""
    out = io.StringIO()
    fake = Console(file=out, force_terminal=True, color_system="truecolor", width=400)
    import ranksight.commands.remediate
    import ranksight.commands.status
    import ranksight.console

    for module in (ranksight.console, ranksight.commands.remediate, ranksight.commands.status):
        monkeypatch.setattr(module, "console", fake)
    import ranksight.commands.alerts

    monkeypatch.setattr(ranksight.commands.alerts, "console", fake)
    yield out


def _plain(out: io.StringIO) -> str:
    """What the terminal shows: the captured output without the styling sequences Rich itself wrote."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())


def _alert(**over: Any) -> dict[str, Any]:
    return {
        "ts": 1_767_225_660_000,
        "rule": JOB,
        "status": "firing",
        "severity": "critical",
        "team": JOB,
        "job_id": JOB,
        "node": JOB,
        "rank": 3,
        "summary": JOB,
        **over,
    }


def test_literal_escapes_markup_and_controls_and_keeps_plain_text_plain() -> None:
    from ranksight.console import literal

    assert literal("[/]") == "\\[/]"
    assert literal("\x1b[2J", markup=False) == "\\x1b[2J"
    assert literal("a\rb\n\x07\x9b", markup=False) == "a\\x0db\\x0a\\x07\\x9b"
    assert literal("ok\u202eevil") == "ok\\u202eevil"
    assert literal("job-7 ü 日本", markup=False) == "job-7 ü 日本"  # printable text is left alone


def test_alerts_tail_shows_a_hostile_alert_literally(terminal: io.StringIO) -> None:
    import ranksight.commands.alerts as alerts
    from ranksight.commands.alerts import alert_line

    alerts.console.print(alert_line(_alert()), highlight=False, soft_wrap=True)
    shown = _plain(terminal)
    _shown(shown)
    assert shown.count("[/][bold red]x") == 5  # rule, team, job, node, summary: none taken as markup


def test_status_lists_a_hostile_firing_alert_literally(terminal: io.StringIO) -> None:
    """`status` prints its firing alerts with the same line as `alerts tail`."""
    import ranksight.commands.status as status

    status.print_firing([_alert()])
    _shown(_plain(terminal))


def test_remediate_shows_a_hostile_decision_literally(terminal: io.StringIO) -> None:
    from ranksight.commands.remediate import decision_line

    record = {"decision": "skipped", "rule": JOB, "job_id": JOB, "action": JOB, "reason": JOB}
    import ranksight.commands.remediate as remediate

    remediate.console.print(decision_line(record), highlight=False, soft_wrap=True)
    shown = _plain(terminal)
    _shown(shown)
    assert shown.count("[/][bold red]x") == 4


@pytest.mark.parametrize("terminal_table", [True, False], ids=["terminal", "pipe"])
def test_jobs_and_efficiency_tables_show_a_hostile_job_id_literally(
    terminal: io.StringIO, capsys: pytest.CaptureFixture[str], terminal_table: bool
) -> None:
    """`jobs` and `efficiency` print their rows through one table printer, on a terminal and on a pipe."""
    from ranksight.console import print_rows

    print_rows(["job", "team"], [[JOB, "nlp"]], "jobs", terminal=terminal_table)
    shown = _plain(terminal) if terminal_table else capsys.readouterr().out
    _shown(shown)


def test_jobs_and_efficiency_show_a_hostile_job_id_of_a_real_store_literally(
    chdb: Any, chdb_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job id as a training job may publish it, stored by the real sink in chDB, read by the commands."""
    from sinks.clickhouse import close
    from tests.integration.sinks.test_progress_chdb import T, started, steps, store

    store(chdb, [started(JOB, "r0", T, target_steps=100), *steps(JOB, "r0", 0, 20, T, step_s=1.0)])
    close(chdb_dsn)  # chDB: one engine per process; the command opens it again
    monkeypatch.setenv("CLICKHOUSE_URL", chdb_dsn)
    for command in (["jobs"], ["efficiency", "--job", JOB]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 0, (command, result.output)
        _shown(result.output)


def test_sql_shows_a_hostile_cell_literally(home: Path) -> None:
    """A cell (and a column name) holding markup and escapes, from a real chDB store."""
    statement = "SELECT concat('[/]', '[bold red]x', char(27), '[2J', char(13)) AS `[/]job`"
    result = CliRunner().invoke(app, ["sql", statement])
    assert result.exit_code == 0, result.output
    assert "[/][bold red]x\\x1b[2J\\x0d" in result.output and "[/]job" in result.output
    assert "\x1b" not in result.output and "\r" not in result.output


def test_an_error_quoting_a_record_is_shown_literally(capsys: pytest.CaptureFixture[str]) -> None:
    """`fail` (every command's one-sentence error) escapes what it quotes."""
    import typer

    from ranksight.console import fail

    with pytest.raises(typer.Exit):
        fail(f"no job {JOB}")
    err = capsys.readouterr().err
    assert "[/][bold red]x\\x1b[2J" in err and "\x1b[2J" not in err
