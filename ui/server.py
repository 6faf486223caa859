"""The UI's HTTP server (aiohttp, which comes with Faust): pages, one JSON endpoint per page, static assets.

`ROUTES` is the table of every URL and the handler that answers it; the handlers ask the page
modules (`ui.pages.<page>`) for their JSON through one query gate and the finished-job cache.

Queries are blocking clickhouse-connect calls, run in a worker thread so the event loop keeps
serving. `UiServer` runs either in the foreground (`ranksight ui`) or on a background thread next
to the sink (`ranksight serve`, `ranksight demo`): chDB lets one process open a store, so the
UI shares the sink's client.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError as _DriverError

from schemas.errors import RanksightError
from sinks.efficiency import PriceList
from ui.errors import NotFoundError, UiError
from ui.guard import HostCheck, WriteAuth, WriteRefused, redacted
from ui.limits import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_MAX_QUERIES,
    DEFAULT_QUEUE_WAIT_S,
    Overloaded,
    PageCache,
    QueryGate,
)
from ui.pages import alert, common, compare, efficiency, fleet, history, job
from ui.runbooks import RUNBOOK_PARAMETERS, default_runbooks_dir, render_runbook
from ui.shell import ASSETS, CONTENT_SECURITY_POLICY, asset_text, page_html, report_html

__all__ = ["GATE", "PAGES", "ROUTES", "UiServer", "make_app"]

log = logging.getLogger(__name__)

# The efficiency views scan every step row (seconds on a big store): their answers are kept this long.
EFFICIENCY_CACHE_S = 60.0
# Alertmanager's silences are read at most this often (every open fleet page polls).
SILENCES_CACHE_S = 15.0
# Request lines and headers may be long: a job id may be 10 kB of anything (aiohttp's default is 8 kB).
MAX_LINE_BYTES = 64 * 1024

_CONTENT_TYPES = {".js": "application/javascript", ".css": "text/css"}
_SHUTDOWN_TIMEOUT_S = 5.0  # how long a stopping server waits for requests in flight
# Every response, pages and API alike (docs/security.md).
_SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
_STORE_FAILED = "the store could not answer this request (the UI's log has the details)"


# The app's query gate and page cache, for operators' introspection and the load tests.
GATE = web.AppKey("gate", QueryGate)
PAGES = web.AppKey("pages", PageCache)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        text=data if isinstance(data, str) else common.to_json(data),
        status=status,
        content_type="application/json",
        headers={"Cache-Control": "no-store", **(headers or {})},
    )


def _int_param(request: web.Request, name: str) -> int | None:
    value = request.query.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} must be UTC milliseconds") from None


async def _secure(request: web.BaseRequest, response: web.StreamResponse) -> None:
    for name, value in _SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


def _host_guard(hosts: HostCheck) -> Any:
    # A request naming another host (DNS rebinding) is refused before any handler reads the store.
    @web.middleware
    async def guard(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if not hosts.allows(request.headers.get("Host")):
            return web.Response(
                status=421,
                text="this UI does not answer for that host name: open it by its address, or start it "
                "with --allowed-host NAME",
            )
        return await handler(request)

    return guard


# The route table: (method, path, handler of `_Handlers`). Ids are anything a record carried: the
# `[^/]+` patterns also match `{` and `}` (aiohttp's default pattern excludes them), and `/` arrives
# percent-encoded.
ROUTES: tuple[tuple[str, str, str], ...] = (
    ("GET", "/", "fleet_page"),
    ("GET", "/jobs/{job_id:[^/]+}", "job_page"),
    ("GET", "/alerts/{alert_id:[^/]+}", "alert_page"),
    ("GET", "/api/fleet", "api_fleet"),
    ("GET", "/api/fleet/goodput", "api_fleet_goodput"),
    ("GET", "/api/fleet/silences", "api_fleet_silences"),
    ("GET", "/api/jobs/{job_id:[^/]+}", "api_job"),
    ("GET", "/api/jobs/{job_id:[^/]+}/efficiency", "api_job_efficiency"),
    ("GET", "/api/jobs/{job_id:[^/]+}/details", "api_job_details"),
    ("GET", "/api/alerts/{alert_id:[^/]+}", "api_alert"),
    ("POST", "/api/alerts/{alert_id:[^/]+}/silence", "api_silence"),
    ("GET", "/api/version", "api_version"),
    ("GET", "/history", "history_page"),
    ("GET", "/api/history", "api_history"),
    ("GET", "/compare", "compare_page"),
    ("GET", "/api/compare", "api_compare"),
    ("GET", "/reports/{kind}/{key:[^/]+}", "report"),
    ("GET", "/runbooks/", "runbook"),
    ("GET", "/runbooks/{rule:[^/]+}", "runbook"),
    ("GET", "/static/{name}", "static"),
    ("GET", "/favicon.ico", "no_content"),
)


def make_app(
    client: Client,
    prices: PriceList | None = None,
    *,
    max_queries: int = DEFAULT_MAX_QUERIES,
    queue_wait_s: float = DEFAULT_QUEUE_WAIT_S,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    runbooks: Path | None = None,
    receivers: Mapping[str, str] | None = None,
    silences: Callable[[], Mapping[str, Any]] | None = None,
    hosts: HostCheck | None = None,
    silence: Callable[[dict[str, Any]], str] | None = None,
    auth: WriteAuth | None = None,
) -> web.Application:
    """The aiohttp application of the UI over a ClickHouse client (GPU-hours priced by `prices`).

    At most `max_queries` requests query the store at once; `2 * max_queries` more wait up to
    `queue_wait_s` for a turn and the rest are answered 503 with Retry-After (`ui.limits`). A
    finished job's answers are cached (`cache_bytes`). Runbooks are served from `runbooks`.
    `receivers` (receiver -> page, inform or escalate, from the ownership file) says which routed
    copies of an alert paged a team; `silences` reads Alertmanager's silences for the fleet page
    (`{"silences": [...], "silenced": [{"fingerprint", "team", "silences"}]}`; the CLI wires
    `streams.alerting.alertmanager.read_silences` when an Alertmanager URL is configured); credentials
    in any URL it answers are redacted. Requests whose Host header `hosts` does not allow get 421.
    `silence` creates an Alertmanager silence (its v2 body) and returns its id: the one write the UI
    does, behind `auth` (`ui.guard.WriteAuth`), from an alert page's form.
    """
    gate = QueryGate(max_queries, wait_s=queue_wait_s)
    pages = PageCache(cache_bytes)
    handlers = _Handlers(
        client,
        prices,
        gate,
        pages,
        runbooks=runbooks if runbooks is not None else default_runbooks_dir(),
        receivers=receivers,
        silences=silences,
        silence=silence,
        auth=auth if auth is not None else WriteAuth(),
    )
    app = web.Application(middlewares=[_host_guard(hosts if hosts is not None else HostCheck())])
    app.on_response_prepare.append(_secure)
    app[GATE] = gate
    app[PAGES] = pages
    app.add_routes([web.route(method, path, getattr(handlers, name)) for method, path, name in ROUTES])
    return app


class _Handlers:
    """The UI's request handlers over one store: each page's HTML shell and its JSON, through one gate."""

    def __init__(
        self,
        client: Client,
        prices: PriceList | None,
        gate: QueryGate,
        pages: PageCache,
        *,
        runbooks: Path,
        receivers: Mapping[str, str] | None,
        silences: Callable[[], Mapping[str, Any]] | None,
        silence: Callable[[dict[str, Any]], str] | None,
        auth: WriteAuth,
    ) -> None:
        self.client = client
        self.prices = prices
        self.gate = gate
        self.pages = pages
        self.runbooks = runbooks
        self.receivers = receivers
        self.silences = silences
        self.silence = silence
        self.auth = auth
        self.timed: dict[tuple[str, ...], tuple[float, Any]] = {}
        self.silenced: list[tuple[float, dict[str, Any]]] = []

    # -- how an answer is computed: cached for a while, cached while a job stays finished, gated

    def cached(self, key: tuple[str, ...], fn: Callable[..., Any], *args: Any) -> Callable[..., Any]:
        """`fn(client, *args)`, computed at most every `EFFICIENCY_CACHE_S`."""

        def answer(client: Client) -> Any:
            now = time.monotonic()
            hit = self.timed.get(key)
            if hit is None or now - hit[0] > EFFICIENCY_CACHE_S:
                hit = (now, fn(client, *args))
                self.timed[key] = hit
            return hit[1]

        return answer

    def finished(
        self, key: tuple[Any, ...], job_id: Callable[[], str | None], fn: Callable[..., Any]
    ) -> Callable[[Client], tuple[str, str]]:
        """`fn`'s JSON; a finished job's answer is immutable until its fingerprint moves: served from `pages`."""

        def answer(client: Client) -> tuple[str, str]:
            job_ = job_id()
            fingerprint = job.finished_fingerprint(client, job_) if job_ else None
            if fingerprint is not None:
                text = self.pages.get(key, fingerprint)
                if text is not None:
                    return text, "hit"
            text = common.to_json(fn(client))
            if fingerprint is not None:
                self.pages.put(key, fingerprint, text)
                return text, "miss"
            return text, "none"

        return answer

    async def answer(self, work: Callable[[Client], tuple[str, str]]) -> web.Response:
        """`work`'s JSON text, run on a worker thread when the gate gives a turn; errors as one sentence."""
        try:
            async with self.gate.turn():
                # Encoded on the worker thread too: a big page must not hold the event loop.
                text, cache = await asyncio.to_thread(work, self.client)
        except Overloaded as exc:
            return _json({"error": str(exc)}, 503, {"Retry-After": str(exc.retry_after_s)})
        except NotFoundError as exc:
            return _json({"error": str(exc)}, status=404)
        except _DriverError as exc:
            # The driver's message quotes the SQL: it goes to the log, never to the browser.
            log.warning("query failed: %s", exc)
            return _json({"error": _STORE_FAILED}, status=503)
        except UiError as exc:
            return _json({"error": str(exc)}, status=503)
        except Exception:
            log.exception("request failed")
            return _json(
                {"error": "the UI failed to answer this request (the UI's log has the details)"}, 500
            )
        return _json(text, headers={"X-Ranksight-Cache": cache})

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> web.Response:
        """`fn(client, *args, **kwargs)` as JSON, uncached."""
        return await self.answer(lambda client: (common.to_json(fn(client, *args, **kwargs)), "none"))

    # -- the pages' HTML shells

    async def fleet_page(self, request: web.Request) -> web.Response:
        return _html_page("fleet", None, "fleet")

    async def job_page(self, request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        return _html_page("job", job_id, f"job {job_id}")

    async def alert_page(self, request: web.Request) -> web.Response:
        alert_id = request.match_info["alert_id"]
        return _html_page("alert", alert_id, f"alert {alert_id}")

    async def history_page(self, request: web.Request) -> web.Response:
        return _html_page("history", None, "alert history")

    async def compare_page(self, request: web.Request) -> web.Response:
        return _html_page("compare", None, "compare runs")

    # -- fleet

    async def api_fleet(self, request: web.Request) -> web.Response:
        return await self.run(fleet.fleet, goodput=False, kinds=self.receivers)

    async def api_fleet_goodput(self, request: web.Request) -> web.Response:
        return await self.run(self.cached(("goodput",), efficiency.fleet_goodput))

    def read_silences(self) -> dict[str, Any]:
        """Alertmanager's silences, read at most every `SILENCES_CACHE_S`; a failure is one sentence."""
        assert self.silences is not None
        now = time.monotonic()
        if self.silenced and now - self.silenced[0][0] <= SILENCES_CACHE_S:
            return self.silenced[0][1]
        try:
            found = self.silences()
            answer: dict[str, Any] = {
                "configured": True,
                "error": None,
                "silences": list(found.get("silences") or []),
                # fingerprint -> the silences muting any routed copy of that alert
                "silenced": _by_fingerprint(found.get("silenced") or []),
            }
        except RanksightError as exc:
            answer = {"configured": True, "error": str(exc), "silences": [], "silenced": {}}
        except Exception as exc:  # a reader's bug must not take the fleet page down
            log.warning("reading Alertmanager's silences failed: %r", exc)
            answer = {
                "configured": True,
                "error": "Alertmanager's silences could not be read (the UI's log has the details)",
                "silences": [],
                "silenced": {},
            }
        # A URL with credentials (`http://admin:pw@alertmanager`) may be quoted in any of it.
        answer = redacted(answer)
        self.silenced[:] = [(now, answer)]
        return answer

    async def api_fleet_silences(self, request: web.Request) -> web.Response:
        if self.silences is None:
            return _json({"configured": False, "error": None, "silences": [], "silenced": {}})
        return _json(await asyncio.to_thread(self.read_silences))

    # -- job

    async def api_job(self, request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        t0, t1 = _int_param(request, "from"), _int_param(request, "to")
        # ?node=<name> (repeatable): a big job's page drilled down to those nodes' ranks.
        nodes = tuple(sorted(set(request.query.getall("node", []))))
        return await self.answer(
            self.finished(
                ("job", job_id, t0, t1, *nodes),
                lambda: job_id,
                lambda client: job.job_page(
                    client,
                    job_id,
                    t0,
                    t1,
                    with_efficiency=False,
                    nodes=nodes,
                    kinds=self.receivers,
                    defer_details=True,
                ),
            )
        )

    async def api_job_details(self, request: web.Request) -> web.Response:
        # A big job's GPU, host and loader panels, over the range its page answered (?from=&to=).
        job_id = request.match_info["job_id"]
        t0, t1 = _int_param(request, "from"), _int_param(request, "to")
        if t0 is None or t1 is None:
            return _json({"error": "give the page's range: ?from=<ms>&to=<ms>"}, status=400)
        nodes = tuple(sorted(set(request.query.getall("node", []))))
        return await self.answer(
            self.finished(
                ("details", job_id, t0, t1, *nodes),
                lambda: job_id,
                lambda client: job.job_details(client, job_id, t0, t1, nodes),
            )
        )

    async def api_job_efficiency(self, request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        return await self.answer(
            self.finished(
                ("efficiency", job_id),
                lambda: job_id,
                self.cached(("efficiency", job_id), efficiency.efficiency, job_id, self.prices),
            )
        )

    # -- alert

    async def api_alert(self, request: web.Request) -> web.Response:
        alert_id = request.match_info["alert_id"]
        return await self.answer(
            self.finished(
                ("alert", alert_id),
                lambda: alert.alert_job(self.client, alert_id),
                lambda client: alert.alert_page(client, alert_id, kinds=self.receivers, defer_details=True),
            )
        )

    async def api_silence(self, request: web.Request) -> web.Response:
        # A custom header: a form or image on another site cannot send it (no CORS is answered).
        if request.headers.get("X-Ranksight-Action") != "silence":
            return _json({"error": "send the header X-Ranksight-Action: silence (the alert page does)"}, 403)
        try:
            identity = self.auth.identity(request.headers)
        except WriteRefused as exc:
            return _json({"error": str(exc)}, 401)
        if self.silence is None:
            return _json({"error": "no Alertmanager configured: set RANKSIGHT_ALERTMANAGER_URL"}, 503)
        try:
            body = await request.json()
            minutes = int(body.get("minutes", 60))
            author = identity or str(body.get("author") or "").strip()
            comment = str(body.get("comment") or "").strip()
        except (ValueError, TypeError, AttributeError):
            return _json({"error": "send JSON: {author, comment, minutes}"}, 400)
        if not author or not comment or not 1 <= minutes <= 7 * 24 * 60:
            return _json({"error": "a silence needs an author, a comment and 1 to 10080 minutes"}, 400)
        alert_id = request.match_info["alert_id"]
        try:
            fingerprint, rule = await asyncio.to_thread(alert.alert_identity, self.client, alert_id)
        except NotFoundError as exc:
            return _json({"error": str(exc)}, 404)
        now = datetime.now(UTC)
        spec = {
            "matchers": [
                {"name": "alertname", "value": rule, "isRegex": False, "isEqual": True},
                {"name": "fingerprint", "value": fingerprint, "isRegex": False, "isEqual": True},
            ],
            "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(minutes=minutes)).isoformat(),
            "createdBy": author[:200],
            "comment": comment[:2000],
        }
        try:
            silence_id = await asyncio.to_thread(self.silence, spec)
        except RanksightError as exc:
            return _json({"error": redacted(str(exc))}, 502)
        self.silenced.clear()  # the fleet's next read shows it
        log.warning("silence %s created by %s for %s: %s", silence_id, author, fingerprint, comment)
        return _json({"silence_id": silence_id, "ends_at": spec["endsAt"], "author": author}, 201)

    # -- history, compare, version

    async def api_history(self, request: web.Request) -> web.Response:
        # ?job= &node= &rule= &team= &from= &to= (UTC ms): alerts that started in the range, newest first.
        q = request.query
        return await self.run(
            history.alert_history,
            job=q.get("job") or None,
            node=q.get("node") or None,
            rule=q.get("rule") or None,
            team=q.get("team") or None,
            t0=_int_param(request, "from"),
            t1=_int_param(request, "to"),
            kinds=self.receivers,
        )

    async def api_compare(self, request: web.Request) -> web.Response:
        # ?job=J (its runs and its workload family's newest), or several ?job= / ?run= (exactly those).
        jobs, run_ids = request.query.getall("job", []), request.query.getall("run", [])
        if not jobs and not run_ids:
            return _json({"error": "name a job (?job=...) or runs (?run=...) to compare"}, status=400)
        # Goodput comes from the efficiency views (seconds on a big store): the answer is kept 60 s.
        key = ("compare", "\x00".join(jobs), "\x00".join(run_ids))
        return await self.run(self.cached(key, compare.compare, jobs, run_ids))

    async def api_version(self, request: web.Request) -> web.Response:
        return await self.run(common.latest_version)

    # -- reports, runbooks, assets

    def _job_report(self, client: Client, key: str) -> dict[str, Any]:
        page = job.job_page(client, key, prices=self.prices, kinds=self.receivers)
        page["compare"] = compare.compare_of_job(client, page["job"]["job_id"])
        return page

    async def report(self, request: web.Request) -> web.Response:
        # The same self-contained file `ranksight report` writes, for a store only this process may open.
        kind, key = request.match_info["kind"], request.match_info["key"]
        fns: dict[str, Callable[[Client, str], dict[str, Any]]] = {
            "jobs": self._job_report,
            "alerts": lambda client, key: alert.alert_page(client, key, kinds=self.receivers),
        }
        fn = fns.get(kind)
        if fn is None:
            raise web.HTTPNotFound()
        page = "job" if kind == "jobs" else "alert"

        def work(client: Client) -> tuple[str, str]:
            generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
            return report_html(page, key, f"{page} {key}", fn(client, key), generated), "none"

        response = await self.answer(work)
        if response.status != 200:
            return response
        # A file name from a record: only safe characters survive, the rest become `_`.
        name = "ranksight-" + page + "-" + re.sub(r"[^A-Za-z0-9._-]", "_", key)[:100] + ".html"
        return web.Response(
            body=response.body,
            content_type="text/html",
            charset="utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )

    async def runbook(self, request: web.Request) -> web.Response:
        rule = request.match_info.get("rule", "") or "README"
        try:
            text = render_runbook(
                self.runbooks, rule, {k: request.query[k] for k in RUNBOOK_PARAMETERS if k in request.query}
            )
        except NotFoundError:
            raise web.HTTPNotFound(text="no runbook of that name: the index is /runbooks/") from None
        except UiError as exc:
            raise web.HTTPServiceUnavailable(text=str(exc)) from None
        return web.Response(text=text, content_type="text/html")

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in ASSETS:
            raise web.HTTPNotFound()
        try:
            text = asset_text(name)
        except UiError as exc:
            return web.Response(text=f"/* {exc} */", status=503, content_type="application/javascript")
        suffix = name[name.rfind(".") :]
        return web.Response(
            text=text, content_type=_CONTENT_TYPES[suffix], headers={"Cache-Control": "max-age=3600"}
        )

    async def no_content(self, request: web.Request) -> web.Response:
        return web.Response(status=204)


def _html_page(kind: str, key: str | None, title: str) -> web.Response:
    return web.Response(text=page_html(kind, key, title), content_type="text/html")


def _by_fingerprint(copies: list[Mapping[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for copy in copies:
        ids = out.setdefault(str(copy.get("fingerprint", "")), [])
        ids.extend(str(i) for i in copy.get("silences") or () if str(i) not in ids)
    return out


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class UiServer:
    """The UI served on host:port, in the foreground or on a background thread."""

    def __init__(
        self,
        client: Client,
        host: str = "127.0.0.1",
        port: int = 8088,
        prices: PriceList | None = None,
        *,
        max_queries: int = DEFAULT_MAX_QUERIES,
        queue_wait_s: float = DEFAULT_QUEUE_WAIT_S,
        runbooks: Path | None = None,
        receivers: Mapping[str, str] | None = None,
        silences: Callable[[], Mapping[str, Any]] | None = None,
        allowed_hosts: Sequence[str] = (),
        silence: Callable[[dict[str, Any]], str] | None = None,
        auth_token: str | None = None,
        auth_header: str | None = None,
    ) -> None:
        self.client = client
        self.prices = prices
        self.host = host
        self.port = port
        self.app = make_app(
            client,
            prices,
            max_queries=max_queries,
            queue_wait_s=queue_wait_s,
            runbooks=runbooks,
            receivers=receivers,
            silences=silences,
            hosts=HostCheck([*allowed_hosts, *([] if host in ("0.0.0.0", "::", "") else [host])]),
            silence=silence,
            auth=WriteAuth(token=auth_token, user_header=auth_header, loopback=_is_loopback(host)),
        )
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop serving requests (None before `start()`): where the gate lives."""
        return self._loop

    @property
    def url(self) -> str:
        """The address to open in a browser."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/"

    async def _start(self) -> None:
        # Ctrl-C gives requests in flight (and idle keep-alive connections) 5 s, not aiohttp's 60.
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            shutdown_timeout=_SHUTDOWN_TIMEOUT_S,
            max_line_size=MAX_LINE_BYTES,
            max_field_size=MAX_LINE_BYTES,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise UiError(
                f"cannot listen on {self.host}:{self.port} ({exc.strerror or exc}): choose another --port"
            ) from exc
        server = site._server
        if server is not None and self.port == 0:
            sockets = getattr(server, "sockets", None) or []
            self.port = int(sockets[0].getsockname()[1])

    async def _serve(self, ready: Callable[[], Awaitable[None] | None] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        await self._start()
        if ready is not None:
            result = ready()
            if result is not None:
                await result
        try:
            await self._stopped.wait()
        finally:
            if self._runner is not None:
                await self._runner.cleanup()

    def serve_forever(self, on_ready: Callable[[str], None] | None = None) -> None:
        """Serve in this thread until Ctrl-C (KeyboardInterrupt) or `stop()`."""

        def ready() -> None:
            if on_ready is not None:
                on_ready(self.url)

        asyncio.run(self._serve(ready))

    def start(self, timeout: float = 30.0) -> str:
        """Serve on a background thread; returns the URL once the socket listens."""
        started = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve(started.set))
            except BaseException as exc:  # reported to the starting thread
                failure.append(exc)
                started.set()
            finally:
                loop.close()

        self._thread = threading.Thread(target=main, name="ranksight-ui", daemon=True)
        self._thread.start()
        if not started.wait(timeout):
            raise UiError(f"the UI did not start listening within {timeout:.0f} s")
        if failure:
            raise failure[0]
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        """Stop a server started with `start()` (or serving in another thread)."""
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stopped.set)
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
