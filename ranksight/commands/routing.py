"""`ranksight routing explain`: which route (or ownership key) sends an alert where, and why."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from ranksight.console import console, fail, literal, user_errors

__all__ = ["register"]

routing_app = typer.Typer(help="Alert routing and ownership: explain where an alert goes.")


def _alerts(source: str) -> list[dict[str, Any]]:
    """Alert objects from a JSON file, `-` (stdin) or a literal JSON object; JSON Lines give several."""
    if source == "-":
        text = sys.stdin.read()
    elif source.lstrip().startswith("{"):
        text = source
    else:
        path = Path(source)
        if not path.is_file():
            fail(f"{source}: no such file (pass a file, '-' for stdin, or the alert as a JSON object)")
        text = path.read_text(encoding="utf-8")
    text = text.strip()
    try:
        data = json.loads(text)
        records = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        try:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            fail(f"{source}: not JSON ({exc.msg} at line {exc.lineno}); give one alert object per line")
    if not records or not all(isinstance(r, dict) for r in records):
        fail(f"{source}: expected an alert as a JSON object (as `ranksight alerts tail --json` prints)")
    # `alerts tail --json` prints {"type": "Alert", ...fields}: the type tag is not a field.
    return [{k: v for k, v in r.items() if k != "type"} for r in records]


@routing_app.command("explain")
def explain(
    alert: str = typer.Argument(
        ..., help="Alert JSON: a file (one object, or JSON Lines), '-' for stdin, or the object itself."
    ),
    routing: Path | None = typer.Option(
        None, "--routing", help="Routing YAML (default: the shipped streams/alerting/routing.yaml)."
    ),
    job_team: str | None = typer.Option(
        None,
        "--job-team",
        help="The job's team. An alert as published carries the team it was routed to; routing reads "
        "`team` as the job's own team (as the engine does before routing).",
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per alert instead of text."),
) -> None:
    """Print which route matched each alert, which team and receiver it reaches, and why."""
    from streams.alerting.routing import DEFAULT_ROUTING_PATH, load_router

    with user_errors():
        router = load_router(routing)
    records = _alerts(alert)
    for record in records:
        if job_team is not None:
            record["team"] = job_team
        deliveries = router.explain(record)
        if as_json:
            print(
                json.dumps(
                    {
                        "rule": record.get("rule"),
                        "deliveries": [
                            {"team": d.team, "receiver": d.receiver, "kind": d.kind, "why": d.why}
                            for d in deliveries
                        ],
                    }
                )
            )
            continue
        where = " ".join(
            f"{name}={literal(record[name])}"
            for name in ("job_id", "cluster", "node", "rank")
            if record.get(name)
        )
        console.print(
            f"[bold]{literal(record.get('rule', '?'))}[/] ({literal(record.get('category', 'platform'))}, "
            f"{literal(record.get('severity', 'warning'))}) job team={literal(record.get('team') or '-')} {where}",
            highlight=False,
            soft_wrap=True,
        )
        if not deliveries:
            console.print("  reaches nobody: inhibited, and the routing file says drop_inhibited: true")
        for i, d in enumerate(deliveries, 1):
            label = {"page": "pages", "inform": "informs", "route": "routes to"}[d.kind]
            console.print(
                f"  {i}. {label} [bold]{literal(d.team)}[/] at receiver [bold]{literal(d.receiver)}[/]\n"
                f"     why: {literal(d.why)}",
                highlight=False,
                soft_wrap=True,
            )
    if not as_json:
        source = routing or DEFAULT_ROUTING_PATH
        owned = f"; ownership: {router.ownership.source}" if router.ownership is not None else ""
        console.print(f"[dim]routing: {source}{owned}[/]", highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add the `routing` group."""
    app.add_typer(routing_app, name="routing")
