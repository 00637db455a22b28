"""The control-plane JSON API: aiohttp on a unix socket (mode 0600).

Errors are JSON `{"error": {"code", "message", "hint"}}` with a 4xx/5xx status and never
a traceback. Long operations (deploy) stream NDJSON: `{"event": "progress", ...}` lines
and one final `{"event": "result" | "error", ...}` line, so the CLI can show progress.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from keelway import __version__
from keelway.api import bodies
from keelway.api.router_process import RouterRestartFailed
from keelway.api.views import operation_view, status_view
from keelway.builds import gc as builds_gc
from keelway.builds.errors import BuildError
from keelway.builds.manifest import Mode
from keelway.builds.stage import stage
from keelway.deploy.deployer import Deployer, InstanceResult
from keelway.deploy.errors import NotFoundError, OperationError, UserError
from keelway.home import Home, valid_app_name
from keelway.runtime.logs import parse_log_name, read_from, tail_lines
from keelway.store import Store
from keelway.store.lifecycle import RequestState

log = logging.getLogger("keelway.api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


_CONFIG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
Progress = Callable[[str], None]
Work = Callable[[Progress], Coroutine[Any, Any, dict[str, Any]]]


def _mode(value: str | None) -> Mode | None:
    if value is None:
        return None
    try:
        return Mode(value)
    except ValueError:
        raise UserError(f"unknown mode {value!r}", hint="use overlap or hold") from None


def _digest(kind: str, body: msgspec.Struct) -> str:
    """What a key names: the request without its key, canonically encoded."""
    fields = {f: getattr(body, f) for f in body.__struct_fields__ if f != "key"}
    encoded = msgspec.json.encode({"kind": kind, **fields}, order="sorted")
    return hashlib.sha256(encoded).hexdigest()


def _final_event(task: asyncio.Task[dict[str, Any]]) -> dict[str, Any]:
    try:
        result = task.result()
    except BuildError as exc:
        return {"event": "error", "error": {
            "code": "build-failed", "message": str(exc),
            "hint": "fix the app and deploy again; nothing was changed"}}
    except OperationError as exc:
        return {"event": "error", "error": {
            "code": exc.code, "message": exc.message, "hint": exc.hint}}
    except Exception:
        log.exception("operation failed")
        return {"event": "error", "error": {
            "code": "internal", "message": "internal error during the operation",
            "hint": "see $KEELWAY_HOME/logs/keelway.log"}}
    return {"event": "result", "result": result}


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
    except OperationError as exc:
        return error_response(500, exc.code, exc.message, exc.hint)
    except msgspec.ValidationError as exc:
        return error_response(400, "bad-request", f"invalid request body: {exc}")
    except msgspec.DecodeError as exc:
        return error_response(400, "bad-request", f"request body is not JSON: {exc}")
    except Exception:
        # Protects the API loop: one failing request must not take the control plane down.
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(500, "internal", "internal error",
                              "see the control plane log: $KEELWAY_HOME/logs/keelway.log")


async def _body(request: web.Request, kind: type[Any]) -> Any:
    raw = await request.read()
    return msgspec.json.decode(raw or b"{}", type=kind)


class Api:
    def __init__(self, store: Store, home: Home, deployer: Deployer, http_port: int | None,
                 on_shutdown: Callable[[bool], None],
                 restart_router: Callable[[], Awaitable[dict[str, int]]] | None = None,
                 ) -> None:
        self.restart_router = restart_router
        self.store = store
        self.home = home
        self.deployer = deployer
        self.http_port = http_port
        self.on_shutdown = on_shutdown
        # gc must never remove a build that a deploy is staging or about to run. A deploy
        # registers its app under this lock before staging; gc computes what is pinned
        # and collects under the same lock, treating every build of such an app as pinned.
        self._gc_lock = asyncio.Lock()
        self._deploying: dict[str, int] = {}

    def app(self) -> web.Application:
        app = web.Application(middlewares=[errors_middleware], client_max_size=1024 * 1024)
        app.add_routes([
            web.get("/v1/ping", self.ping),
            web.post("/v1/deploy", self.deploy),
            web.get("/v1/apps", self.apps),
            web.get("/v1/status", self.status),
            web.get("/v1/apps/{app}/logs", self.logs),
            web.get("/v1/apps/{app}/events", self.events),
            web.get("/v1/apps/{app}/ops", self.ops),
            web.get("/v1/apps/{app}/releases", self.releases),
            web.post("/v1/apps/{app}/stop", self.stop),
            web.post("/v1/apps/{app}/start", self.start),
            web.post("/v1/apps/{app}/restart", self.restart),
            web.get("/v1/apps/{app}/config", self.config_get),
            web.post("/v1/apps/{app}/config", self.config_set),
            web.post("/v1/apps/{app}/rollback", self.rollback),
            web.post("/v1/reconcile", self.reconcile),
            web.post("/v1/gc", self.gc),
            web.post("/v1/shutdown", self.shutdown),
            web.post("/v1/router/restart", self.router_restart),
        ])
        return app

    async def ping(self, _request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "pid": os.getpid(), "version": __version__,
                                  "http_port": self.http_port})

    def _app_name(self, request: web.Request) -> str:
        name = request.match_info["app"]
        if self.store.get_app(name) is None:
            raise NotFoundError(f"no app named {name}", hint="see `keelway apps`")
        return name

    async def deploy(self, request: web.Request) -> web.StreamResponse:
        body: bodies.DeployBody = await _body(request, bodies.DeployBody)
        if not valid_app_name(body.app):
            raise UserError(f"{body.app!r} is not a valid app name",
                            hint="start with a letter; use lowercase letters, digits and dashes")
        mode = _mode(body.mode)
        source = Path(body.source)
        if not source.is_absolute():
            raise UserError("the source path must be absolute (the CLI resolves it)")
        if not source.exists():
            raise UserError(f"{source} does not exist",
                            hint="give a directory, a tarball or a git repository")
        self.deployer.validate_hosts(body.app, body.hosts)

        async def work(progress: Progress) -> dict[str, Any]:
            progress(f"staging {source}")
            staged = await asyncio.to_thread(
                stage, source, builds_dir=self.home.builds_dir, app=body.app, ref=body.ref,
                git=body.git, progress=progress,
            )
            progress(f"build {staged.digest[:12]} " + ("reused" if staged.reused else "staged"))
            results = await self.deployer.deploy(body.app, staged.digest, staged.path,
                                                 body.hosts, progress, key=body.key,
                                                 request_digest=digest, mode=mode)
            return {"app": body.app, "build": staged.digest,
                    "instances": self._instances_view(results)}

        digest = _digest("deploy", body)
        async with self._gc_lock:
            self._deploying[body.app] = self._deploying.get(body.app, 0) + 1
        try:
            return await self._operation(request, body.app, "deploy", body.key, digest, work)
        finally:
            self._deploying[body.app] -= 1
            if not self._deploying[body.app]:
                del self._deploying[body.app]

    async def restart(self, request: web.Request) -> web.StreamResponse:
        name = self._app_name(request)
        body: bodies.RestartBody = await _body(request, bodies.RestartBody)
        self.deployer.instances_of(name, body.instance)
        digest = _digest(f"restart {name}", body)

        async def work(progress: Progress) -> dict[str, Any]:
            results = await self.deployer.restart(name, body.instance, progress, body.key,
                                                  digest)
            return {"app": name, "instances": self._instances_view(results)}

        return await self._operation(request, name, "restart", body.key, digest, work)

    async def config_set(self, request: web.Request) -> web.StreamResponse:
        name = self._app_name(request)
        body: bodies.ConfigBody = await _body(request, bodies.ConfigBody)
        changes: dict[str, str | None] = {k: None for k in body.unset}
        changes.update(body.set)
        bad = [k for k in changes if not _CONFIG_NAME.match(k)]
        if bad:
            raise UserError(f"not a config var name: {', '.join(bad)}",
                            hint="use letters, digits and underscores, not starting with a digit")
        if not changes:
            raise UserError("nothing to change", hint="give K=V to set or K to unset")
        reserved = [k for k in changes if k.startswith("KEELWAY_") or k == "PORT"]
        if reserved:
            raise UserError(f"{', '.join(reserved)} is set by keelway itself")
        digest = _digest(f"config {name}", body)

        async def work(progress: Progress) -> dict[str, Any]:
            results = await self.deployer.set_config(name, changes, progress, body.key, digest)
            return {"app": name, "changed": sorted(changes),
                    "instances": self._instances_view(results)}

        return await self._operation(request, name, "config", body.key, digest, work)

    async def config_get(self, request: web.Request) -> web.Response:
        name = self._app_name(request)
        app = self.store.get_app(name)
        return web.json_response({"app": name, "config": app.config if app else {}})

    async def rollback(self, request: web.Request) -> web.StreamResponse:
        name = self._app_name(request)
        body: bodies.RollbackBody = await _body(request, bodies.RollbackBody)
        digest = _digest(f"rollback {name}", body)

        async def work(progress: Progress) -> dict[str, Any]:
            results = await self.deployer.rollback(name, body.to, progress, body.key, digest)
            return {"app": name, "instances": self._instances_view(results)}

        return await self._operation(request, name, "rollback", body.key, digest, work)

    async def reconcile(self, request: web.Request) -> web.Response:
        body: bodies.ReconcileBody = await _body(request, bodies.ReconcileBody)
        report = await self.deployer.reconcile_all(body.dry_run)
        return web.json_response({"dry_run": body.dry_run, "instances": report})

    def _instances_view(self, results: list[InstanceResult]) -> list[dict[str, Any]]:
        port = self.http_port
        return [{"host": r.host, "release": f"v{r.release}", "outcome": r.outcome,
                 "url": f"http://{r.host}:{port}/" if port else f"http://{r.host}/"}
                for r in results]

    async def _operation(self, request: web.Request, app: str, kind: str, key: str | None,
                         digest: str, work: Work) -> web.StreamResponse:
        """Run `work` streaming its progress as NDJSON, under an idempotency key if given.

        A key names one request: a repeat replays the recorded outcome, success or
        failure; the same key with another request, or while it is in flight, is a
        conflict (409) and runs nothing.
        """
        if key is not None:
            claimed, fresh = self.store.begin_request(key, app, kind, digest,
                                                      self.deployer.owner)
            if not fresh:
                if claimed.digest != digest:
                    return error_response(409, "key-conflict",
                                          f"the key {key!r} names another request",
                                          "use a new key for a new request")
                if claimed.state is RequestState.RUNNING:
                    return error_response(409, "key-in-flight",
                                          f"the request with key {key!r} is still running",
                                          "wait for it, then repeat to see its outcome")
                return await self._replay(request, claimed.result)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str] = asyncio.Queue()

        def progress(message: str) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, message)

        task = loop.create_task(work(progress))
        try:
            final = await self._stream(response, task, queue)
        finally:
            # A client that hangs up does not cancel the operation; its key stays
            # claimed until the operation is really over.
            if not task.done():
                await asyncio.wait({task})
            if key is not None:
                final = _final_event(task)
                state = (RequestState.SUCCEEDED if final["event"] == "result"
                         else RequestState.FAILED)
                self.store.finish_request(key, state, msgspec.json.encode(final).decode())
        await response.write_eof()
        return response

    async def _replay(self, request: web.Request, recorded: str | None) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        final: dict[str, Any] = json.loads(recorded) if recorded else {}
        if "event" not in final:
            final = {"event": "error", "error": {
                "code": "interrupted", "message": "the request was interrupted by a "
                "control-plane crash; its operations were reconciled",
                "hint": "see `keelway ops`"}}
        final["replayed"] = True
        await _send(response, final)
        await response.write_eof()
        return response

    async def _stream(self, response: web.StreamResponse, task: asyncio.Task[dict[str, Any]],
                      queue: asyncio.Queue[str]) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        while not task.done() or not queue.empty():
            getter = loop.create_task(queue.get())
            await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                await _send(response, {"event": "progress", "message": getter.result()})
            else:
                getter.cancel()
        final = _final_event(task)
        await _send(response, final)
        return final

    async def apps(self, _request: web.Request) -> web.Response:
        out = []
        for app in self.store.list_apps():
            releases = self.store.list_releases(app.name)
            out.append({
                "name": app.name,
                "release": releases[0].label if releases else None,
                "instances": [i.host for i in self.store.list_instances(app.name)],
            })
        return web.json_response({"apps": out})

    async def status(self, request: web.Request) -> web.Response:
        app = request.query.get("app")
        if app is not None and self.store.get_app(app) is None:
            raise NotFoundError(f"no app named {app}", hint="see `keelway apps`")
        return web.json_response(status_view(self.store, self.http_port, app,
                                             self.deployer.live_ops))

    async def releases(self, request: web.Request) -> web.Response:
        name = self._app_name(request)
        return web.json_response({"releases": [
            {"version": r.label, "build": r.build_digest[:12], "description": r.description,
             "created_at": r.created_at} for r in self.store.list_releases(name)]})

    async def ops(self, request: web.Request) -> web.Response:
        name = self._app_name(request)
        ops = self.store.list_operations(name, request.query.get("instance"))
        return web.json_response({"operations": [operation_view(op) for op in ops]})

    async def events(self, request: web.Request) -> web.Response:
        name = self._app_name(request)
        return web.json_response({"events": [
            {"at": e.at, "instance": e.instance, "kind": e.kind, "message": e.message}
            for e in self.store.list_events(name)]})

    def _log_files(self, app: str, instance: str | None, service: str | None,
                   per_service: int = 3) -> list[tuple[str, str, int, Path]]:
        """The newest log files of each instance and service: (host, service, gen, path)."""
        files: list[tuple[str, str, int, Path]] = []
        for inst in self.store.list_instances(app):
            if instance is not None and inst.host != instance:
                continue
            found: dict[str, list[tuple[int, Path]]] = {}
            log_dir = self.home.log_dir(inst.host)
            for path in log_dir.glob("*.log") if log_dir.exists() else []:
                parsed = parse_log_name(path)
                if parsed and (service is None or parsed[0] == service):
                    found.setdefault(parsed[0], []).append((parsed[1], path))
            for svc, gens in found.items():
                for gen_id, path in sorted(gens)[-per_service:]:
                    files.append((inst.host, svc, gen_id, path))
        return sorted(files, key=lambda f: f[2])

    async def logs(self, request: web.Request) -> web.StreamResponse:
        name = self._app_name(request)
        instance = request.query.get("instance")
        service = request.query.get("service")
        try:
            lines = int(request.query.get("lines", "100"))
        except ValueError as exc:
            raise UserError("lines must be a number") from exc
        follow = request.query.get("follow") == "1"
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        offsets: dict[Path, int] = {}
        for host, svc, gen_id, path in self._log_files(name, instance, service):
            text, offsets[path] = tail_lines(path, lines)
            for line in text:
                await _send(response, {"instance": host, "service": svc, "generation": gen_id,
                                       "line": line})
        while follow:
            await asyncio.sleep(0.2)
            if request.transport is None or request.transport.is_closing():
                break  # the reader hung up; nothing else would tell us while logs are quiet
            for host, svc, gen_id, path in self._log_files(name, instance, service):
                text, offsets[path] = read_from(path, offsets.get(path, 0))
                for line in text:
                    await _send(response, {"instance": host, "service": svc,
                                           "generation": gen_id, "line": line})
        await response.write_eof()
        return response

    async def _instances(self, request: web.Request) -> list[Any]:
        name = self._app_name(request)
        body: bodies.InstanceBody = await _body(request, bodies.InstanceBody)
        return self.deployer.instances_of(name, body.instance)

    async def stop(self, request: web.Request) -> web.Response:
        instances = await self._instances(request)
        for inst in instances:
            await self.deployer.stop_instance(inst)
        return web.json_response({"stopped": [i.host for i in instances]})

    async def start(self, request: web.Request) -> web.Response:
        instances = await self._instances(request)
        for inst in instances:
            await self.deployer.start_instance(inst)
        return web.json_response({"started": [i.host for i in instances]})

    async def gc(self, request: web.Request) -> web.Response:
        body: bodies.GcBody = await _body(request, bodies.GcBody)
        async with self._gc_lock:
            pinned = self.store.pinned_builds() | {
                (app, digest) for app, digest in builds_gc.staged_builds(self.home.builds_dir)
                if app in self._deploying
            }
            removed = await asyncio.to_thread(builds_gc.collect, self.home.builds_dir, pinned,
                                              dry_run=body.dry_run)
            if not body.dry_run:
                for app, digest in removed:
                    self.store.forget_build(app, digest)
        return web.json_response({"removed": [{"app": a, "digest": d} for a, d in removed],
                                  "dry_run": body.dry_run})

    async def router_restart(self, _request: web.Request) -> web.Response:
        if self.restart_router is None:
            raise UserError("this control plane cannot restart the router")
        try:
            result = await self.restart_router()
        except RouterRestartFailed as exc:
            raise OperationError(str(exc), hint="see $KEELWAY_HOME/logs/router.log") from exc
        return web.json_response(result)

    async def shutdown(self, request: web.Request) -> web.Response:
        body: bodies.ShutdownBody = await _body(request, bodies.ShutdownBody)
        asyncio.get_running_loop().call_soon(self.on_shutdown, body.keep_apps)
        return web.json_response({"ok": True, "keep_apps": body.keep_apps})


async def _send(response: web.StreamResponse, item: dict[str, Any]) -> None:
    await response.write(msgspec.json.encode(item) + b"\n")
