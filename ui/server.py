"""The UI's HTTP server (aiohttp, which comes with Faust): pages, one JSON endpoint per page, static assets.

Queries are blocking clickhouse-connect calls, run in a worker thread so the event loop keeps
serving. `UiServer` runs either in the foreground (`ranksight ui`) or on a background thread next
to the sink (`ranksight serve`, `ranksight demo`): chDB lets one process open a store, so the
UI shares the sink's client.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError as _DriverError

from sinks.efficiency import PriceList
from ui import queries
from ui.errors import NotFoundError, UiError
from ui.pages import ASSETS, asset_text, page_html

__all__ = ["UiServer", "make_app"]

log = logging.getLogger(__name__)

# The efficiency views scan every step row (seconds on a big store): their answers are kept this long.
EFFICIENCY_CACHE_S = 60.0

_CONTENT_TYPES = {".js": "application/javascript", ".css": "text/css"}
_SHUTDOWN_TIMEOUT_S = 5.0  # how long a stopping server waits for requests in flight


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=data if isinstance(data, str) else queries.to_json(data),
        status=status,
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


async def _no_content(request: web.Request) -> web.Response:
    return web.Response(status=204)


def _int_param(request: web.Request, name: str) -> int | None:
    value = request.query.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} must be UTC milliseconds") from None


def make_app(client: Client, prices: PriceList | None = None) -> web.Application:
    """The aiohttp application of the UI over a ClickHouse client (GPU-hours priced by `prices`)."""

    cache: dict[tuple[str, ...], tuple[float, Any]] = {}

    def cached(key: tuple[str, ...], fn: Callable[..., Any], *args: Any) -> Callable[..., Any]:
        def answer(client: Client) -> Any:
            now = time.monotonic()
            hit = cache.get(key)
            if hit is None or now - hit[0] > EFFICIENCY_CACHE_S:
                hit = (now, fn(client, *args))
                cache[key] = hit
            return hit[1]

        return answer

    async def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> web.Response:
        try:
            # Encoded on the worker thread too: a big page must not hold the event loop.
            return _json(await asyncio.to_thread(lambda: queries.to_json(fn(client, *args, **kwargs))))
        except NotFoundError as exc:
            return _json({"error": str(exc)}, status=404)
        except (_DriverError, UiError) as exc:
            log.warning("query failed: %s", exc)
            return _json({"error": f"the store could not answer: {str(exc).splitlines()[0]}"}, status=503)

    async def fleet_page(request: web.Request) -> web.Response:
        return web.Response(text=page_html("fleet", None, "fleet"), content_type="text/html")

    async def job_page(request: web.Request) -> web.Response:
        job = request.match_info["job_id"]
        return web.Response(text=page_html("job", job, f"job {job}"), content_type="text/html")

    async def alert_page(request: web.Request) -> web.Response:
        alert = request.match_info["alert_id"]
        return web.Response(text=page_html("alert", alert, f"alert {alert}"), content_type="text/html")

    async def api_fleet(request: web.Request) -> web.Response:
        return await run(queries.fleet, goodput=False)

    async def api_fleet_goodput(request: web.Request) -> web.Response:
        return await run(cached(("goodput",), queries.fleet_goodput))

    async def api_job_efficiency(request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        return await run(cached(("efficiency", job_id), queries.efficiency, job_id, prices))

    async def api_job(request: web.Request) -> web.Response:
        return await run(
            queries.job_page,
            request.match_info["job_id"],
            _int_param(request, "from"),
            _int_param(request, "to"),
            with_efficiency=False,
        )

    async def api_alert(request: web.Request) -> web.Response:
        return await run(queries.alert_page, request.match_info["alert_id"])

    async def api_version(request: web.Request) -> web.Response:
        return await run(queries.latest_version)

    async def report(request: web.Request) -> web.Response:
        # The same self-contained file `ranksight report` writes, for a store only this process may open.
        from ui.pages import report_html

        kind, key = request.match_info["kind"], request.match_info["key"]
        fns: dict[str, Callable[..., dict[str, Any]]] = {
            "jobs": lambda client, key: queries.job_page(client, key, prices=prices),
            "alerts": queries.alert_page,
        }
        fn = fns.get(kind)
        if fn is None:
            raise web.HTTPNotFound()
        try:
            data: dict[str, Any] = await asyncio.to_thread(fn, client, key)
        except NotFoundError as exc:
            raise web.HTTPNotFound(text=str(exc)) from None
        generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        page = "job" if kind == "jobs" else "alert"
        text = report_html(page, key, f"{page} {key}", data, generated)
        name = f"ranksight-{page}-{key}.html".replace("/", "_")
        return web.Response(
            text=text,
            content_type="text/html",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )

    async def static(request: web.Request) -> web.Response:
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

    app = web.Application()
    app.add_routes(
        [
            web.get("/", fleet_page),
            web.get("/jobs/{job_id}", job_page),
            web.get("/alerts/{alert_id}", alert_page),
            web.get("/api/fleet", api_fleet),
            web.get("/api/fleet/goodput", api_fleet_goodput),
            web.get("/api/jobs/{job_id}", api_job),
            web.get("/api/jobs/{job_id}/efficiency", api_job_efficiency),
            web.get("/api/alerts/{alert_id}", api_alert),
            web.get("/api/version", api_version),
            web.get("/reports/{kind}/{key}", report),
            web.get("/static/{name}", static),
            web.get("/favicon.ico", _no_content),
        ]
    )
    return app


class UiServer:
    """The UI served on host:port, in the foreground or on a background thread."""

    def __init__(
        self, client: Client, host: str = "127.0.0.1", port: int = 8088, prices: PriceList | None = None
    ) -> None:
        self.client = client
        self.prices = prices
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    @property
    def url(self) -> str:
        """The address to open in a browser."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/"

    async def _start(self) -> None:
        # Ctrl-C gives requests in flight (and idle keep-alive connections) 5 s, not aiohttp's 60.
        self._runner = web.AppRunner(
            make_app(self.client, self.prices), access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S
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
