"""What every API handler shares: JSON errors, body decoding, NDJSON lines.

Errors are JSON `{"error": {"code", "message", "hint"}}` with a 4xx/5xx status and never
a traceback; a failure nobody expected is logged and answered 500.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from keelway.deploy.errors import Fenced, NotFoundError, OperationError, UserError
from keelway.durable import DISK_FULL_HINT, disk_full, disk_full_message
from keelway.names import InvalidName
from keelway.store import Store

log = logging.getLogger("keelway.api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_Method = TypeVar("_Method", bound=Callable[..., Awaitable[web.StreamResponse]])

# Each handler's route, written beside the handler (`route`) and collected once per API
# object (`routes_of`), so an API lists no table of its own handlers a second time.
_ROUTES: dict[object, tuple[str, str]] = {}


def route(method: str, path: str) -> Callable[[_Method], _Method]:
    """Mark a handler method as the one answering `method path`."""
    def mark(handler: _Method) -> _Method:
        _ROUTES[handler] = (method, path)
        return handler
    return mark


def routes_of(*apis: object | None) -> list[web.RouteDef]:
    """The routes of every marked handler of each API object (None: that part is not
    wired on this control plane), in the order each class defines them."""
    found: list[web.RouteDef] = []
    for api in apis:
        if api is None:
            continue
        for name, member in vars(type(api)).items():
            if callable(member) and (marked := _ROUTES.get(member)) is not None:
                found.append(web.route(marked[0], marked[1], getattr(api, name)))
    return found


def encoded_response(body: bytes, status: int = 200) -> web.Response:
    """A JSON body encoded already (`msgspec.json.encode`): a big view (the `status` of
    a thousand instances) is encoded where it was read, away from the loop, in a
    fraction of the stdlib encoder's time."""
    return web.Response(body=body, status=status, content_type="application/json")


def error_response(status: int, code: str, message: str, hint: str | None = None) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message, "hint": hint}},
                             status=status)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except NotFoundError as exc:
        return error_response(404, exc.code, exc.message, exc.hint)
    except UserError as exc:
        return error_response(400, exc.code, exc.message, exc.hint)
    except InvalidName as exc:
        return error_response(400, "bad-request", exc.message, exc.hint)
    except Fenced as exc:
        return error_response(409, exc.code, exc.message, exc.hint)
    except OperationError as exc:
        return error_response(500, exc.code, exc.message, exc.hint)
    except msgspec.ValidationError as exc:
        return error_response(400, "bad-request", f"invalid request body: {exc}")
    except msgspec.DecodeError as exc:
        return error_response(400, "bad-request", f"request body is not JSON: {exc}")
    except Exception as exc:
        if disk_full(exc):
            log.warning("%s %s: %s", request.method, request.path, disk_full_message(exc))
            return error_response(507, "disk-full", disk_full_message(exc), DISK_FULL_HINT)
        # Protects the API loop: one failing request must not take the control plane down.
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(500, "internal", "internal error",
                              "see the control plane log: $KEELWAY_HOME/logs/keelway.log")
async def read_body(request: web.Request, kind: type[Any]) -> Any:
    raw = await request.read()
    return msgspec.json.decode(raw or b"{}", type=kind)


async def send_line(response: web.StreamResponse, item: dict[str, Any]) -> None:
    await response.write(msgspec.json.encode(item) + b"\n")


def app_name(store: Store, request: web.Request) -> str:
    """The {app} of the path, which must name an app."""
    name = request.match_info["app"]
    if store.apps.get_app(name) is None:
        raise NotFoundError(f"no app named {name}", hint="see `keelway apps`")
    return name
