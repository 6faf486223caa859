"""`ranksight ui`: the job-health web UI over ClickHouse (CLICKHOUSE_URL or the chDB store)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ranksight.console import console, fail, user_errors

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "ALLOWED_HOST_HELP",
    "AUTH_HEADER_HELP",
    "AUTH_TOKEN_HELP",
    "open_store",
    "receiver_kinds",
    "register",
    "silence_creator",
    "silence_reader",
]

HOST_HELP = "Address to listen on (127.0.0.1: this machine only; 0.0.0.0 exposes the UI to the network)."
ALLOWED_HOST_HELP = (
    "A host name browsers use to reach the UI (repeatable). Requests naming any other host are refused "
    "(DNS rebinding); IP addresses, localhost and this machine's names are always answered."
)


def open_store(migrate_schema: bool = True) -> Client:
    """The ClickHouse client of the configured store; one sentence and exit when chDB is held elsewhere."""
    from ranksight.settings import load_settings
    from sinks.clickhouse import chdb_path, connect
    from sinks.ddl import MIGRATIONS, applied_versions, migrate
    from sinks.errors import ClickHouseLockedError

    settings = load_settings()
    dsn = settings.clickhouse_dsn()
    try:
        client = connect(dsn)
    except ClickHouseLockedError:
        fail(
            f"the chDB store {chdb_path(dsn)} is open in another process (a sink?): chDB allows one process "
            "per store, so run `ranksight serve` (sink and UI in one process) or set CLICKHOUSE_URL to a server",
            code=2,
        )
    # A viewer creates missing tables (a fresh store) but never changes an existing store's
    # retention: `migrate` would bring the TTL to this process's setting and drop old rows.
    if migrate_schema and {m.version for m in MIGRATIONS} - applied_versions(client):
        migrate(client, settings.ttl_days)
    return client


def receiver_kinds(routing: Path | None = None) -> dict[str, str]:
    """Receiver -> page, inform or escalate, from the ownership file the routing file names (pages say
    which routed copy of an alert paged a team and which only informed it)."""
    from streams.alerting.routing import load_router

    ownership = load_router(routing).ownership
    if ownership is None:
        return {}
    specs = [*ownership.teams.values(), ownership.other_teams]
    kinds: dict[str, str] = {}
    for kind in ("inform", "escalate", "page"):  # a receiver that pages anyone is a paging receiver
        kinds.update({getattr(spec, kind): kind for spec in specs if getattr(spec, kind)})
    return kinds


AUTH_TOKEN_HELP = (
    "A token that allows silencing alerts from the UI (sent as Authorization: Bearer; default "
    "RANKSIGHT_UI_TOKEN). Without it or --auth-header, only a UI on 127.0.0.1 may silence."
)
AUTH_HEADER_HELP = "A header your authenticating reverse proxy sets to the user's name (e.g. X-Forwarded-User): who silences."


def silence_creator(url: str | None) -> Callable[[dict[str, Any]], str] | None:
    """Creates a silence in the Alertmanager at `url` (its v2 body) and returns its id; None without a URL."""
    if not url:
        return None
    import httpx

    from ui.errors import UiError
    from ui.guard import redact_credentials

    where = redact_credentials(url.rstrip("/"))

    def create(spec: dict[str, Any]) -> str:
        try:
            response = httpx.post(f"{url.rstrip('/')}/api/v2/silences", json=spec, timeout=10)
        except httpx.HTTPError as exc:
            raise UiError(f"cannot reach Alertmanager at {where}: {redact_credentials(str(exc))}") from None
        if response.status_code != 200:
            raise UiError(
                f"Alertmanager at {where} refused the silence ({response.status_code}): {response.text[:200]}"
            )
        return str(response.json().get("silenceID", ""))

    return create


def silence_reader(url: str | None) -> Callable[[], dict[str, Any]] | None:
    """Reads Alertmanager's active silences and what they mute, for the fleet page; None without a URL."""
    if not url:
        return None
    from streams.alerting.alertmanager import read_silences

    def read() -> dict[str, Any]:
        report = read_silences(url)
        return {
            "silences": [s.as_dict() for s in report.active()],
            "silenced": [
                {"fingerprint": fp, "team": team, "silences": list(ids)}
                for (fp, team), ids in sorted(report.silenced.items())
            ],
        }

    return read


def ui(
    host: str = typer.Option("127.0.0.1", "--host", help=HOST_HELP),
    port: int = typer.Option(8088, "--port", min=0, max=65535, help="Port to listen on (0: any free port)."),
    allowed_host: list[str] = typer.Option([], "--allowed-host", help=ALLOWED_HOST_HELP),
    auth_token: str | None = typer.Option(
        None, "--auth-token", envvar="RANKSIGHT_UI_TOKEN", help=AUTH_TOKEN_HELP
    ),
    auth_header: str | None = typer.Option(None, "--auth-header", help=AUTH_HEADER_HELP),
    price: list[str] = typer.Option(
        [],
        "--price",
        help="GPU-hour price by class for the job pages' cost, CLASS=USD (repeatable; default=USD).",
    ),
    prices: Path | None = typer.Option(None, "--prices", help="YAML: GPU class -> price per GPU-hour."),
    max_queries: int = typer.Option(
        4,
        "--max-queries",
        min=1,
        help="Requests querying the store at once; twice as many more wait, the rest get 503 + Retry-After.",
    ),
    queue_wait: float = typer.Option(
        5.0, "--queue-wait", min=0.1, help="Seconds a request may wait for its turn before it gets 503."
    ),
    runbooks: Path | None = typer.Option(
        None,
        "--runbooks",
        help="Folder of runbook pages served at /runbooks/<rule> (default: the pages shipped with ranksight).",
    ),
    routing: Path | None = typer.Option(
        None,
        "--routing",
        help="Routing YAML whose ownership file names paging and informing receivers (default: shipped).",
    ),
) -> None:
    """Serve the web UI: fleet, job pages on one time axis, alert pages. Ctrl-C to stop."""
    import faulthandler
    import signal

    from ranksight.signals import stop_signals
    from sinks.clickhouse import describe_dsn
    from sinks.efficiency import PriceList
    from ui.server import UiServer

    # `kill -USR1 <pid>` prints every thread's stack to stderr: for a UI that does not answer or stop.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    with user_errors():
        from ranksight.settings import load_settings

        price_list = PriceList.parse(price, PriceList.load(prices) if prices else None)
        kinds = receiver_kinds(routing)
        client = open_store()
        server = UiServer(
            client,
            host,
            port,
            prices=price_list,
            max_queries=max_queries,
            queue_wait_s=queue_wait,
            runbooks=runbooks,
            receivers=kinds,
            silences=silence_reader(load_settings().alertmanager_url),
            allowed_hosts=allowed_host,
            silence=silence_creator(load_settings().alertmanager_url),
            auth_token=auth_token,
            auth_header=auth_header,
        )

        dsn = describe_dsn(load_settings().clickhouse_dsn())
        # Its own SIGINT/SIGTERM handlers: started by `cmd &` or nohup, a process inherits SIGINT
        # ignored and would never see Ctrl-C; SIGTERM would kill it outright.
        with stop_signals(on_stop=lambda: server.stop(timeout=0), name="ui"):
            server.serve_forever(
                lambda url: console.print(
                    f"ranksight UI on {url} (reading {dsn}); Ctrl-C to stop", highlight=False
                )
            )
        console.print("UI stopped")


def register(app: typer.Typer) -> None:
    """Add the `ui` command."""
    app.command("ui")(ui)
