"""The control-plane JSON API: aiohttp on a unix socket (mode 0600).

Errors are JSON `{"error": {"code", "message", "hint"}}` with a 4xx/5xx status and never
a traceback (keelway.api.http). This module serves what reads and the small
mutations; the streaming operations with idempotency keys live in keelway.api.operations.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from keelway import __version__
from keelway.api import app_logs, bodies
from keelway.api.apps import AppsApi
from keelway.api.certs import CertsApi
from keelway.api.doctor import diagnose
from keelway.api.domains import DomainsApi
from keelway.api.http import (
    app_name,
    encoded_response,
    errors_middleware,
    read_body,
    routes_of,
    send_line,
)
from keelway.api.instances import InstancesApi
from keelway.api.jobs import JobsApi
from keelway.api.operations import Operations
from keelway.api.parking import ParkingApi
from keelway.api.plans import plan_response
from keelway.api.replicas import ReplicasApi
from keelway.api.run_server import RunPlanApi
from keelway.api.seed import SeedApi
from keelway.api.snapshots import SnapshotsApi
from keelway.api.status import Page, status_json
from keelway.api.views import (
    event_view,
    isolation_view,
    operation_view,
    releases_view,
    router_view,
    unreleased_failures,
)
from keelway.deploy.apps import Apps
from keelway.deploy.certify import Certifier
from keelway.deploy.deployer import Deployer
from keelway.deploy.domains import Domains
from keelway.deploy.errors import NotFoundError, OperationError, UserError
from keelway.deploy.freezing import Freezing
from keelway.deploy.instances import Instances
from keelway.deploy.jobs import Jobs
from keelway.deploy.operation import Plan
from keelway.deploy.parking import Parking
from keelway.deploy.passes import Passes
from keelway.deploy.replication import Replication
from keelway.deploy.restore import Restore
from keelway.deploy.runs import Runs
from keelway.deploy.seeding import Seeding
from keelway.deploy.snapshots import Snapshots
from keelway.home import Home
from keelway.runtime.limits import in_force
from keelway.runtime.logs import parse_log_name
from keelway.runtime.router import RouterRestartFailed, RouterStartFailed
from keelway.runtime.router_supervisor import RouterSupervisor
from keelway.store import Store
from keelway.store.records import Instance


class Api:
    def __init__(self, store: Store, home: Home, deployer: Deployer, passes: Passes,
                 http_port: int | None, on_shutdown: Callable[[bool], None],
                 router: RouterSupervisor | None = None,
                 parking: Parking | None = None, apps: Apps | None = None,
                 instances: Instances | None = None, domains: Domains | None = None,
                 seeding: Seeding | None = None, snapshots: Snapshots | None = None,
                 replication: Replication | None = None,
                 restore: Restore | None = None, runs: Runs | None = None,
                 jobs: Jobs | None = None, certifier: Certifier | None = None,
                 freezing: Freezing | None = None) -> None:
        self.router = router
        self.jobs = JobsApi(jobs) if jobs is not None else None
        self.certs = CertsApi(store, home, certifier)
        self.runs = RunPlanApi(runs) if runs is not None else None
        self.seeding = SeedApi(seeding) if seeding is not None else None
        self.snapshots = (SnapshotsApi(snapshots, restore)
                          if snapshots is not None and restore is not None else None)
        self.replicas = ReplicasApi(replication) if replication is not None else None
        self.parking = ParkingApi(parking, freezing) if parking is not None else None
        self.apps_api = AppsApi(store, apps) if apps is not None else None
        self.instances = (InstancesApi(store, instances, http_port, home.root)
                          if instances is not None else None)
        self.domains = DomainsApi(store, domains) if domains is not None else None
        self.store = store
        self.home = home
        self.deployer = deployer
        self.passes = passes
        self.http_port = http_port
        self.on_shutdown = on_shutdown
        self.operations = Operations(store, home, deployer, http_port, snapshots, restore)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[errors_middleware], client_max_size=1024 * 1024)
        app.add_routes([
            web.get("/v1/ping", self.ping),
            web.get("/v1/apps", self.apps),
            web.get("/v1/status", self.status),
            web.get("/v1/doctor", self.doctor),
            web.get("/v1/apps/{app}/logs", self.logs),
            web.get("/v1/apps/{app}/events", self.events),
            web.get("/v1/apps/{app}/ops", self.ops),
            web.get("/v1/apps/{app}/releases", self.releases),
            web.post("/v1/apps/{app}/stop", self.stop),
            web.post("/v1/apps/{app}/start", self.start),
            web.get("/v1/apps/{app}/config", self.config_get),
            web.post("/v1/reconcile", self.reconcile),
            web.post("/v1/shutdown", self.shutdown),
            web.post("/v1/router/restart", self.router_restart),
            *routes_of(self.operations, self.parking, self.apps_api, self.instances,
                       self.domains, self.seeding, self.snapshots, self.replicas, self.runs,
                       self.jobs, self.certs),
        ])
        return app

    async def ping(self, _request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "pid": os.getpid(), "version": __version__,
                                  "http_port": self.http_port})

    async def config_get(self, request: web.Request) -> web.Response:
        name = app_name(self.store, request)
        app = self.store.apps.get_app(name)
        return web.json_response({"app": name, "config": app.config if app else {}})

    async def reconcile(self, request: web.Request) -> web.Response:
        body: bodies.DryRunBody = await read_body(request, bodies.DryRunBody)
        report = await self.passes.reconcile_all(body.dry_run)
        return web.json_response({"dry_run": body.dry_run, "instances": report})

    async def apps(self, _request: web.Request) -> web.Response:
        out = []
        for app in self.store.apps.list_apps():
            releases = self.store.builds.list_releases(app.name)
            out.append({
                "name": app.name,
                "release": releases[0].label if releases else None,
                "instances": [i.host for i in self.store.instances.list_instances(app.name)],
            })
        return web.json_response({"apps": out})

    async def status(self, request: web.Request) -> web.Response:
        """Every instance of APP (or of every app) whole; with `page` (and `per_page`),
        that page of each app's instances and those that need attention, after a
        summary that counts them all (keelway/api/status.py)."""
        app = request.query.get("app")
        if app is not None and self.store.apps.get_app(app) is None:
            raise NotFoundError(f"no app named {app}", hint="see `keelway apps`")
        page = Page.parse(request.query.get("page"), request.query.get("per_page"))
        # Read apart from the loop that commits every journal write: a thousand
        # instances' status neither waits behind a rollout's writes nor holds them.
        supervisor = self.deployer.supervisor
        extra: dict[str, object] = {
            "isolation": isolation_view(supervisor.identities),
            # What each tenant tree runs under where its service sets nothing, and what
            # enforces each limit here (None: this box cannot).
            "limits": in_force(supervisor.limits, supervisor.trees.enforces(),
                               supervisor.identities.in_force)}
        if self.router is not None:
            extra["router"] = router_view(self.router.health())
        # Read, and encoded, in a process of its own (Store.read_aside): a thousand
        # instances' status neither waits behind a rollout's work on this loop nor
        # holds it, and the encoding is not the loop's either.
        return encoded_response(await self.store.read_aside(
            status_json, self.http_port, app, set(self.deployer.locks.live_ops), extra,
            self.home.root, page))

    async def doctor(self, _request: web.Request) -> web.Response:
        """Every check with its severity and what to do (keelway/api/doctor.py)."""
        on = self.certs.certifier is not None and self.certs.certifier.on
        return web.json_response({"checks": await diagnose(
            self.store, self.home, self.deployer.supervisor, self.router, on,
            self.passes.reconciler.replicate, set(self.deployer.locks.live_ops),
            status_json)})

    async def releases(self, request: web.Request) -> web.Response:
        name = app_name(self.store, request)
        return web.json_response({"releases": releases_view(self.store, name),
                                  "unreleased_failures": unreleased_failures(self.store, name)})

    async def ops(self, request: web.Request) -> web.Response:
        name = app_name(self.store, request)
        limit = _count(request, "limit", 50)
        ops = self.store.ops.list_operations(name, request.query.get("instance"), limit)
        return web.json_response({"operations": [operation_view(op) for op in ops]})

    async def events(self, request: web.Request) -> web.Response:
        """The app's newest `limit` events after event `after`, oldest first. With
        `wait` (seconds, at most 30), an answer with none waits for one that long: a
        follower's long poll."""
        name = app_name(self.store, request)
        limit, after = _count(request, "limit", 100), _count(request, "after", 0)
        deadline = asyncio.get_running_loop().time() + min(_count(request, "wait", 0), 30)
        while True:
            # `last` is read first: an event written meanwhile is in `found`, never
            # skipped by a follower that goes on from `last`.
            newest = self.store.ops.list_events(name, 1)
            found = self.store.ops.list_events(name, limit, after)
            if found or asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(0.2)
        return web.json_response({"events": [event_view(e) for e in found],
                                  "last": newest[0].id if newest else after})

    def _log_files(self, app: str, instance: str | None, service: str | None,
                   per_service: int = 3) -> list[tuple[str, str, int, Path]]:
        return log_files(self.store, self.home, app, instance, service, per_service)

    def _log_sources(self, app: str, instance: str | None,
                     service: str | None) -> list[app_logs.Source]:
        files = ([] if service == app_logs.ROUTER_SERVICE else
                 [app_logs.Source(host, svc, gen_id, path)
                  for host, svc, gen_id, path in self._log_files(app, instance, service)])
        return files + app_logs.access_sources(self.store, self.home, app, instance, service)

    async def logs(self, request: web.Request) -> web.StreamResponse:
        """The app's newest `lines` log lines (at or after `since`, unix seconds), of
        every instance and service and the router's access log, merged in time order
        (keelway/api/app_logs.py says how exact); with follow, new lines as they come."""
        name = app_name(self.store, request)
        instance = request.query.get("instance")
        service = request.query.get("service")
        lines = _count(request, "lines", 100)
        follow = request.query.get("follow") == "1"
        since_text = request.query.get("since")
        try:
            since = None if since_text is None else float(since_text)
        except ValueError:
            raise UserError(f"since must be unix seconds, not {since_text!r}") from None
        sources = self._log_sources(name, instance, service)
        found, offsets = await asyncio.to_thread(app_logs.merged, sources, lines, since)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        for line in found:
            await send_line(response, line.view())
        while follow:
            await asyncio.sleep(0.2)
            if request.transport is None or request.transport.is_closing():
                break  # the reader hung up; nothing else would tell us while logs are quiet
            fresh: list[app_logs.Line] = []
            for source in self._log_sources(name, instance, service):
                new, offsets[source.path] = app_logs.read_new(source,
                                                              offsets.get(source.path, 0))
                fresh += new
            fresh.sort(key=lambda line: line.at)
            for line in fresh:
                await send_line(response, line.view())
        await response.write_eof()
        return response

    async def stop(self, request: web.Request) -> web.Response:
        return await self._each_instance(request, "stopped", self.deployer.dry_stop,
                                         self.deployer.stop_instance)

    async def start(self, request: web.Request) -> web.Response:
        return await self._each_instance(request, "started", self.deployer.dry_start,
                                         self.deployer.start_instance)

    async def _each_instance(self, request: web.Request, done: str,
                             plan: Callable[[Instance], Plan],
                             act: Callable[[Instance], Awaitable[None]]) -> web.Response:
        """Stop and start alike: the app's instances (or the one the body names), each
        planned for a dry run, else acted on one after another; answered `{done: hosts}`."""
        name = app_name(self.store, request)
        body: bodies.InstanceBody = await read_body(request, bodies.InstanceBody)
        instances = self.deployer.instances_of(name, body.instance)
        if body.dry_run:
            return plan_response(*[plan(inst) for inst in instances])
        for inst in instances:
            await act(inst)
        return web.json_response({done: [i.host for i in instances]})

    async def router_restart(self, _request: web.Request) -> web.Response:
        if self.router is None:
            raise UserError("this control plane cannot restart the router")
        try:
            result = await self.router.restart()
        except (RouterRestartFailed, RouterStartFailed) as exc:
            raise OperationError(str(exc), hint="see $KEELWAY_HOME/logs/router.log") from exc
        return web.json_response(result)

    async def shutdown(self, request: web.Request) -> web.Response:
        body: bodies.ShutdownBody = await read_body(request, bodies.ShutdownBody)
        asyncio.get_running_loop().call_soon(self.on_shutdown, body.keep_apps)
        return web.json_response({"ok": True, "keep_apps": body.keep_apps})


def _count(request: web.Request, name: str, default: int) -> int:
    """A whole number >= 0 from the query, or a 400 that names it."""
    text = request.query.get(name)
    if text is None:
        return default
    if not text.isdigit():
        raise UserError(f"{name} must be a whole number, not {text!r}")
    return int(text)


def log_files(store: Store, home: Home, app: str, instance: str | None, service: str | None,
              per_service: int = 3) -> list[tuple[str, str, int, Path]]:
    """The newest log files of each instance and service of `app`, oldest generation
    first: (host, service, gen, path). `logs` and the dashboard's log tail read these."""
    files: list[tuple[str, str, int, Path]] = []
    for inst in store.instances.list_instances(app):
        if instance is not None and inst.host != instance:
            continue
        found: dict[str, list[tuple[int, Path]]] = {}
        log_dir = home.log_dir(inst.host)
        # Only this instance's generations: a host removed and added again keeps
        # the log dir of the one before, whose generations went with its records.
        ours = store.generations.generation_ids(inst.host)
        for path in log_dir.glob("*.log") if log_dir.exists() else []:
            parsed = parse_log_name(path)
            if parsed and parsed[1] in ours and (service is None or parsed[0] == service):
                found.setdefault(parsed[0], []).append((parsed[1], path))
        for svc, gens in found.items():
            for gen_id, path in sorted(gens)[-per_service:]:
                files.append((inst.host, svc, gen_id, path))
    return sorted(files, key=lambda f: f[2])
