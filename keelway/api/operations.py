"""The API's operations: deploy, restart, config, rollback, gc.

Each streams NDJSON: `{"event": "progress", ...}` lines and one final
`{"event": "result" | "error", ...}` line, so the CLI can show progress. A request may
carry an idempotency key: a repeat replays the recorded outcome; the same key with
another request, or while the first runs, is a 409 conflict and runs nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from keelway.api import bodies
from keelway.api.http import app_name, error_response, log, read_body, route, send_line
from keelway.api.plans import deploy_plan_response, plan_response
from keelway.builds import cache as deps_cache
from keelway.builds import gc as builds_gc
from keelway.builds.errors import BuildCommandError, BuildError, BuildLimitError
from keelway.builds.manifest import Manifest, Mode
from keelway.builds.preview import preview
from keelway.builds.stage import StagedBuild, stage
from keelway.deploy.deployer import Deployer, InstanceResult, rollout_spec
from keelway.deploy.errors import OperationError, UserError
from keelway.deploy.outcome import Progress
from keelway.deploy.restore import Restore
from keelway.deploy.snapshots import Snapshots
from keelway.durable import DISK_FULL_HINT, disk_full, disk_full_message
from keelway.home import Home
from keelway.names import InvalidName
from keelway.store import Store
from keelway.store.lifecycle import RequestState
from keelway.store.rollouts import RolloutJournal

# A request's work: it reports progress lines and returns the JSON body of its answer.
RequestWork = Callable[[Progress], Coroutine[Any, Any, dict[str, Any]]]


def _mode(value: str | None) -> Mode | None:
    if value is None:
        return None
    try:
        return Mode(value)
    except ValueError:
        raise UserError(f"unknown mode {value!r}", hint="use overlap or hold") from None


def _source_of(source: Path, staged: StagedBuild, ref: str | None) -> dict[str, str]:
    """Where a build came from, as `keelway releases` shows it: a git commit (and the
    ref asked for), a tarball's sha256, or a directory's content digest (the build's)."""
    if staged.commit is not None:
        return {"kind": "git", "path": str(source), "commit": staged.commit,
                "ref": ref or "HEAD"}
    if source.is_file():
        digest = hashlib.sha256()
        try:
            with source.open("rb") as tarball:
                while chunk := tarball.read(1 << 20):
                    digest.update(chunk)
        except OSError:  # gone since it was staged: the build is whole all the same
            return {"kind": "tarball", "path": str(source)}
        return {"kind": "tarball", "path": str(source), "sha256": digest.hexdigest()}
    return {"kind": "directory", "path": str(source), "digest": staged.digest}


def _digest(kind: str, body: msgspec.Struct) -> str:
    """What a key names: the request without its key, canonically encoded."""
    fields = {f: getattr(body, f) for f in body.__struct_fields__
              if f not in ("key", "dry_run")}
    encoded = msgspec.json.encode({"kind": kind, **fields}, order="sorted")
    return hashlib.sha256(encoded).hexdigest()


def _final_event(task: asyncio.Task[dict[str, Any]]) -> dict[str, Any]:
    failure = task.exception()
    if failure is not None and disk_full(failure):
        # whatever layer met it (staging, the store, a log): the same answer
        return {"event": "error", "error": {
            "code": "disk-full", "message": disk_full_message(failure), "hint": DISK_FULL_HINT}}
    try:
        result = task.result()
    except BuildError as exc:
        return {"event": "error", "error": _build_failed(exc)}
    except OperationError as exc:
        return {"event": "error", "error": {
            "code": exc.code, "message": exc.message, "hint": exc.hint}}
    except InvalidName as exc:
        return {"event": "error", "error": {
            "code": "bad-request", "message": exc.message, "hint": exc.hint}}
    except Exception:
        log.exception("operation failed")
        return {"event": "error", "error": {
            "code": "internal", "message": "internal error during the operation",
            "hint": "see $KEELWAY_HOME/logs/keelway.log"}}
    return {"event": "result", "result": result}


def _build_failed(exc: BuildError) -> dict[str, str]:
    """A build that failed or was refused, as a deploy answers it (its dry run too)."""
    # `message` carries the failed step's last lines for a client that did not show the
    # progress; `summary` is the line alone, for one that streamed them.
    summary = exc.summary if isinstance(exc, BuildCommandError) else str(exc)
    hint = "fix the app and deploy again; nothing was changed"
    if isinstance(exc, BuildLimitError):
        hint = (f"make the build use less, or raise [build] {exc.limit} in keelway.toml (up to "
                "this box's limit: `keelway doctor`); nothing was changed")
    return {"code": "build-failed", "message": str(exc), "summary": summary, "hint": hint}


@dataclass(eq=False)
class Operations:
    store: Store
    home: Home
    deployer: Deployer
    http_port: int | None
    snapshots: Snapshots | None = None
    restore: Restore | None = None

    def __post_init__(self) -> None:
        # gc must never remove a build that a deploy is staging or about to run. A deploy
        # registers its app under this lock before staging; gc computes what is pinned
        # and collects under the same lock, treating every build of such an app as pinned.
        self._gc_lock = asyncio.Lock()
        self._deploying: dict[str, int] = {}


    @route("POST", "/v1/deploy")
    async def deploy(self, request: web.Request) -> web.StreamResponse:
        body: bodies.DeployBody = await read_body(request, bodies.DeployBody)
        body.check()
        _check_rollout(body.rollout)
        mode = _mode(body.mode)
        source = Path(body.source)
        if not source.is_absolute():
            raise UserError("the source path must be absolute (the CLI resolves it)")
        if not source.exists():
            raise UserError(f"{source} does not exist",
                            hint="give a directory, a tarball or a git repository")
        self.deployer.validate_hosts(body.app, body.hosts)
        if body.dry_run:
            return await self._dry_deploy(body, source, mode)

        async def work(progress: Progress) -> dict[str, Any]:
            progress(f"staging {source}")
            staged = await asyncio.to_thread(
                stage, source, builds_dir=self.home.builds_dir, app=body.app, ref=body.ref,
                git=body.git, progress=progress,
                builder=self.deployer.supervisor.identities.builder(body.app),
                cache=deps_cache.for_home(self.home.root),
                limits=self.deployer.supervisor.build_limits,
                confine=self.deployer.supervisor.build_cells(),
            )
            progress(f"build {staged.digest[:12]} " + ("reused" if staged.reused else "staged"))
            origin = await asyncio.to_thread(_source_of, source, staged, body.ref)
            results = await self.deployer.deploy(body.app, staged.digest, staged.path,
                                                 body.hosts, progress, key=body.key,
                                                 request_digest=digest, mode=mode,
                                                 source=origin, rollout=body.rollout)
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

    async def _dry_deploy(self, body: bodies.DeployBody, source: Path,
                          mode: Mode | None) -> web.Response:
        """The deploy's plan, its build previewed rather than staged: nothing is built,
        recorded or journaled (keelway/builds/preview.py)."""
        try:
            build = await asyncio.to_thread(
                preview, source, builds_dir=self.home.builds_dir, app=body.app,
                ref=body.ref, git=body.git,
                tenants_reach=self.deployer.supervisor.identities.in_force)
        except BuildError as exc:
            failed = _build_failed(exc)
            return error_response(400, failed["code"], failed["message"], failed["hint"])
        return deploy_plan_response(self.deployer.dry_deploy(body.app, build, body.hosts,
                                                             mode))

    @route("POST", "/v1/apps/{app}/restart")
    async def restart(self, request: web.Request) -> web.StreamResponse:
        name = app_name(self.store, request)
        body: bodies.RestartBody = await read_body(request, bodies.RestartBody)
        self.deployer.instances_of(name, body.instance)
        if body.dry_run:
            return plan_response(*self.deployer.dry_restart(name, body.instance))
        digest = _digest(f"restart {name}", body)

        async def work(progress: Progress) -> dict[str, Any]:
            results = await self.deployer.restart(name, body.instance, progress, body.key,
                                                  digest)
            return {"app": name, "instances": self._instances_view(results)}

        return await self._operation(request, name, "restart", body.key, digest, work)

    @route("POST", "/v1/apps/{app}/config")
    async def config_set(self, request: web.Request) -> web.StreamResponse:
        name = app_name(self.store, request)
        body: bodies.ConfigBody = await read_body(request, bodies.ConfigBody)
        changes = body.changes()
        _check_rollout(body.rollout)
        if not changes:
            raise UserError("nothing to change", hint="give K=V to set or K to unset")
        # The whole resulting config, checked before the answer starts streaming, so a
        # refusal is a 400 that changed nothing; set_config checks it again at its start.
        self.deployer.new_config(name, changes)
        if body.dry_run:
            return plan_response(*self.deployer.dry_config(name, changes))
        digest = _digest(f"config {name}", body)

        async def work(progress: Progress) -> dict[str, Any]:
            results = await self.deployer.set_config(name, changes, progress, body.key, digest,
                                                     body.rollout)
            return {"app": name, "changed": sorted(changes),
                    "instances": self._instances_view(results)}

        return await self._operation(request, name, "config", body.key, digest, work)

    @route("POST", "/v1/apps/{app}/rollback")
    async def rollback(self, request: web.Request) -> web.StreamResponse:
        name = app_name(self.store, request)
        body: bodies.RollbackBody = await read_body(request, bodies.RollbackBody)
        _check_rollout(body.rollout)
        if body.dry_run:
            return plan_response(*self.deployer.dry_rollback(name, body.to))
        digest = _digest(f"rollback {name}", body)

        async def work(progress: Progress) -> dict[str, Any]:
            results = await self.deployer.rollback(name, body.to, progress, body.key, digest,
                                                   body.rollout)
            return {"app": name, "instances": self._instances_view(results)}

        return await self._operation(request, name, "rollback", body.key, digest, work)

    @route("GET", "/v1/apps/{app}/rollout")
    async def rollout_status(self, request: web.Request) -> web.Response:
        journal = self.deployer.rollout_of(request.match_info["app"])
        return web.json_response({"rollout": rollout_view(journal) if journal else None})

    @route("POST", "/v1/apps/{app}/rollout/pause")
    async def rollout_pause(self, request: web.Request) -> web.Response:
        journal = self.deployer.pause_rollout(request.match_info["app"])
        return web.json_response({"rollout": rollout_view(journal)})

    @route("POST", "/v1/apps/{app}/rollout/resume")
    async def rollout_resume(self, request: web.Request) -> web.StreamResponse:
        return await self._rollout_op(request, "resume", self.deployer.resume_rollout)

    @route("POST", "/v1/apps/{app}/rollout/abort")
    async def rollout_abort(self, request: web.Request) -> web.StreamResponse:
        return await self._rollout_op(request, "abort", self.deployer.abort_rollout)

    async def _rollout_op(self, request: web.Request, verb: str,
                          run: Callable[[str, Progress], Coroutine[Any, Any,
                                                                   list[InstanceResult]]],
                          ) -> web.StreamResponse:
        name = app_name(self.store, request)
        body: bodies.KeyBody = await read_body(request, bodies.KeyBody)
        digest = _digest(f"rollout {verb} {name}", body)

        async def work(progress: Progress) -> dict[str, Any]:
            results = await run(name, progress)
            journal = self.deployer.rollout_of(name)
            return {"app": name, "instances": self._instances_view(results),
                    "rollout": rollout_view(journal) if journal else None}

        return await self._operation(request, name, f"rollout-{verb}", body.key, digest,
                                     work)

    def _instances_view(self, results: list[InstanceResult]) -> list[dict[str, Any]]:
        port = self.http_port
        return [{"host": r.host, "release": f"v{r.release}", "outcome": r.outcome,
                 "url": f"http://{r.host}:{port}/" if port else f"http://{r.host}/"}
                for r in results]

    async def _operation(self, request: web.Request, app: str, kind: str, key: str | None,
                         digest: str, work: RequestWork) -> web.StreamResponse:
        """Run `work` streaming its progress as NDJSON, under an idempotency key if given.

        A key names one request: a repeat replays the recorded outcome, success or
        failure; the same key with another request, or while it is in flight, is a
        conflict (409) and runs nothing.
        """
        if key is not None:
            claimed, fresh = self.store.ops.begin_request(key, app, kind, digest,
                                                          self.deployer.runner.owner)
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
                self.store.ops.finish_request(key, state, msgspec.json.encode(final).decode())
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
        await send_line(response, final)
        await response.write_eof()
        return response

    async def _stream(self, response: web.StreamResponse, task: asyncio.Task[dict[str, Any]],
                      queue: asyncio.Queue[str]) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        while not task.done() or not queue.empty():
            getter = loop.create_task(queue.get())
            await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                await send_line(response, {"event": "progress", "message": getter.result()})
            else:
                getter.cancel()
        final = _final_event(task)
        await send_line(response, final)
        return final

    @route("POST", "/v1/gc")
    async def gc(self, request: web.Request) -> web.Response:
        body: bodies.DryRunBody = await read_body(request, bodies.DryRunBody)
        # each app's [releases] keep, from its newest release's build
        paths = {(b.app, b.digest): Path(b.path) for b in self.store.builds.list_builds()}
        newest: dict[str, Path | None] = {}
        for record in self.store.apps.list_apps():
            releases = self.store.builds.list_releases(record.name)
            if releases:
                newest[record.name] = paths.get((record.name, releases[0].build_digest))
        keep = await asyncio.to_thread(builds_gc.releases_keep, newest)
        async with self._gc_lock:
            pinned = self.store.builds.pinned_builds(keep) | {
                (app, digest) for app, digest in builds_gc.staged_builds(self.home.builds_dir)
                if app in self._deploying
            }
            doomed = [build for build in builds_gc.staged_builds(self.home.builds_dir)
                      if build not in pinned]
            sizes = await asyncio.to_thread(builds_gc.freed_bytes, self.home.builds_dir,
                                            doomed)
            removed = await asyncio.to_thread(builds_gc.collect, self.home.builds_dir, pinned,
                                              dry_run=body.dry_run)
            if not body.dry_run:
                for app, digest in removed:
                    self.store.builds.forget_build(app, digest)
            # after the builds: an entry is unused once no build links its files
            cached = await asyncio.to_thread(builds_gc.collect_cache,
                                             deps_cache.for_home(self.home.root),
                                             dry_run=body.dry_run)
        # Snapshots beyond each instance's `[data] keep` (keelway/deploy/snapshots.py).
        pruned = await self.snapshots.prune_all(body.dry_run) if self.snapshots else []
        # Copies restores kept, past their retention (keelway/data/kept.py).
        aged = await self.restore.prune_kept(body.dry_run) if self.restore else []
        freed = sum(sizes.get(build, 0) for build in removed) + sum(b for _k, b in cached)
        return web.json_response({"removed": [{"app": a, "digest": d,
                                               "freed_bytes": sizes.get((a, d), 0)}
                                              for a, d in removed],
                                  "cache_removed": [{"key": k, "freed_bytes": b}
                                                    for k, b in cached],
                                  "freed_bytes": freed,
                                  "snapshots_removed": [{"instance": h, "id": i}
                                                        for h, i in pruned],
                                  "kept_removed": [{"instance": h, "id": i} for h, i in aged],
                                  "dry_run": body.dry_run})


def _check_rollout(pairs: dict[str, str]) -> None:
    """A request's `--rollout` keys, checked before anything begins (a 400 that changed
    nothing); the release's own manifest is laid under them once it is known."""
    if pairs:
        rollout_spec(Manifest({}), pairs)


def rollout_view(journal: RolloutJournal) -> dict[str, Any]:
    """A rollout as `rollout status` shows it: where it stands, each instance's place,
    and the figures its last judged cohort was judged on."""
    figures = msgspec.to_builtins(journal.figures) if journal.figures else None
    return {"id": journal.id, "app": journal.app, "release": f"v{journal.release}",
            "previous": f"v{journal.previous}" if journal.previous is not None else None,
            "kind": journal.kind.value, "state": journal.state.value,
            "cohort": journal.cohort + 1, "cohorts": len(journal.cohorts),
            "reason": journal.reason, "figures": figures,
            "overrides": dict(journal.overrides),
            "created_at": journal.created_at, "updated_at": journal.updated_at,
            "instances": [{"host": h.host, "cohort": h.cohort + 1, "state": h.state.value,
                           "reason": h.reason, "judged": journal.cohorts[h.cohort].judged}
                          for h in journal.hosts]}
