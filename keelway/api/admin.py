"""The admin listener (`keelway up --admin ADDR`): /metrics and the dashboard over TCP.

Owns the listener's setting, its start and stop, and what every answer carries.

Rules:
- Read-only: GET only (and the POST of /login, which sets the browser's cookie and
  nothing else); no handler here changes a record, a process or a file of the fleet.
- Who may read is keelway/admin_access.py's rule: off loopback it does not start
  without KEELWAY_ADMIN_TOKEN, and then every request but the sign-in page carries the
  token (a Bearer header, or the cookie /login sets), compared in constant time. The
  token never reaches a log line or an answer.
- Every answer, refusals and errors included, carries the headers a browser needs:
  a Content-Security-Policy that allows only this listener's own script and style
  (nothing inline), no framing, no sniffing, no Referer.
- The address is kept in the home (`Home.admin_setting`) like `--https`: a later `up`
  without the flag serves where the last one asked; `--admin off` forgets it.
- Its own AppRunner beside the API's: the unix-socket API never shares a middleware,
  a route or a failure with a listener others may reach.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from keelway import admin_access, metrics
from keelway.api.dashboard import Dashboard
from keelway.api.dashboard_assets import DASHBOARD_CSS, DASHBOARD_JS, INDEX_HTML, LOGIN_HTML
from keelway.api.http import errors_middleware
from keelway.api.scrape import Scraper
from keelway.durable import write_atomic
from keelway.home import Home
from keelway.runtime import router as router_process

log = logging.getLogger("keelway.admin")

SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Fleet state is never kept by a browser or a proxy between polls.
    "Cache-Control": "no-store",
}
# What a browser may fetch before it has signed in: the form and its style.
OPEN_PATHS: Final = frozenset({"/login", "/dashboard.css"})
COOKIE_MAX_AGE_S: Final = 12 * 3600
OFF: Final = "off"


@dataclass(frozen=True)
class AdminSettings:
    """Where the listener binds, the token it requires (None: none) and whether
    /metrics names each instance."""

    host: str
    port: int
    token: str | None
    per_instance: bool = False

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"


def admin_settings(home: Home, asked: str | None, environ: dict[str, str],
                   per_instance: bool = False) -> AdminSettings | None:
    """The listener this `up` starts: where asked (kept in the home for the next `up`;
    `off`: none, and forgotten), else where the last `up` asked, else none.
    ValueError: not HOST:PORT; admin_access.AdminAccessError: off loopback without a
    token. Nothing is kept unless it can be served."""
    if asked == OFF:
        home.admin_setting.unlink(missing_ok=True)
        return None
    addr = asked
    if addr is None:
        try:
            addr = home.admin_setting.read_text().strip() or None
        except FileNotFoundError:
            return None
    if addr is None:
        return None
    host, port = router_process.parse_addr(addr)
    token = admin_access.required_token(host, environ)
    if asked is not None:
        write_atomic(home.admin_setting, asked.encode())
    return AdminSettings(host, port, token, per_instance)


@web.middleware
async def security_headers(request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                           ) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.headers.update(SECURITY_HEADERS)
        raise
    response.headers.update(SECURITY_HEADERS)
    return response


def token_middleware(token: str | None) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def require_token(request: web.Request,
                            handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                            ) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        access = admin_access.decide(token, request.headers.get("Authorization"),
                                     request.cookies.get(admin_access.COOKIE))
        if access is admin_access.Access.ALLOWED:
            return await handler(request)
        if request.path == "/" and "text/html" in request.headers.get("Accept", ""):
            raise web.HTTPSeeOther("/login")
        # The same answer for no token and a wrong one; the offer is never logged.
        raise web.HTTPUnauthorized(text="401: the admin token is required\n",
                                   headers={"WWW-Authenticate": 'Bearer realm="keelway"'})
    return require_token


class AdminListener:
    """The listener of one control plane: `start` binds it, `close` stops it."""

    def __init__(self, settings: AdminSettings, scraper: Scraper,
                 dashboard: Dashboard) -> None:
        self.settings = settings
        self.scraper = scraper
        self.dashboard = dashboard
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[security_headers,
                                           token_middleware(self.settings.token),
                                           errors_middleware],
                              client_max_size=4096)
        app.add_routes([
            web.get("/", self.index),
            web.get("/dashboard.js", self.script),
            web.get("/dashboard.css", self.style),
            web.get("/metrics", self.metrics),
            web.get("/login", self.login_form),
            web.post("/login", self.login),
            *self.dashboard.routes(),
        ])
        return app

    async def start(self) -> None:
        """Serve on the settings' address; OSError when it cannot be bound (nothing is
        left listening then)."""
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False,
                               shutdown_timeout=1.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.settings.host, self.settings.port).start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def index(self, _request: web.Request) -> web.Response:
        return web.Response(text=INDEX_HTML, content_type="text/html", charset="utf-8")

    async def script(self, _request: web.Request) -> web.Response:
        return web.Response(text=DASHBOARD_JS, content_type="text/javascript",
                            charset="utf-8")

    async def style(self, _request: web.Request) -> web.Response:
        return web.Response(text=DASHBOARD_CSS, content_type="text/css", charset="utf-8")

    async def metrics(self, _request: web.Request) -> web.Response:
        body = metrics.exposition(await self.scraper.scrape())
        return web.Response(body=body, headers={"Content-Type": metrics.CONTENT_TYPE})

    async def login_form(self, _request: web.Request) -> web.Response:
        return web.Response(text=LOGIN_HTML, content_type="text/html", charset="utf-8")

    async def login(self, request: web.Request) -> web.Response:
        """The form's token as a cookie, if it is the token: the browser then sends it
        with each poll. A wrong one is refused as any request without it is."""
        offered = str((await request.post()).get("token", ""))
        token = self.settings.token
        if admin_access.decide(token, None, offered) is not admin_access.Access.ALLOWED:
            raise web.HTTPUnauthorized(text="401: wrong token\n")
        response = web.HTTPSeeOther("/")
        if token is not None:
            # HttpOnly: no script reads it; Strict: no other site's page sends it.
            response.set_cookie(admin_access.COOKIE, offered, max_age=COOKIE_MAX_AGE_S,
                                httponly=True, samesite="Strict", path="/")
        raise response

