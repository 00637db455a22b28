"""Operations on instances: deploy, config, rollback, restart, stop, start, and recovery.

Every operation runs under its instance's lock, after reconciliation (a failed-closed
instance refuses it), as a journaled operation whose steps are written before their
effects. A rollout (deploy, config, rollback) first bumps the schedule revision of
every instance it targets, so an older attempt still in flight stands down at its next
check; then it goes instance by instance, the first one being the canary, and halts at
the first instance that does not end DONE, leaving the rest on what they run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from keelway import failpoints
from keelway.builds.manifest import Mode, ServiceKind
from keelway.clock import Clock
from keelway.deploy import targets
from keelway.deploy.attempt import Attempt, Cause, Outcome, Result
from keelway.deploy.errors import AppFailed, NotFoundError, OperationError, UserError
from keelway.deploy.instances import StartFailed, Target, start_generation
from keelway.deploy.publisher import Publisher
from keelway.home import Home, valid_host
from keelway.reconcile.apply import FailedClosed, Reconciler
from keelway.reconcile.plan import Mode as Pass
from keelway.runtime.backoff import Backoff
from keelway.runtime.environment import ensure_instance_key
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.lifecycle import (
    GenState,
    InstanceState,
    OpState,
    RequestState,
    RouteState,
    StepState,
)
from keelway.store.records import Generation, Instance, Operation

log = logging.getLogger("keelway.deployer")

failpoints.declare("key.before", "key.after", "finish.before", "release.before")

PERIODIC_S = 5.0
Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


@dataclass
class InstanceResult:
    host: str
    release: int
    outcome: str
    generations: dict[str, int] = field(default_factory=dict)


class Deployer:
    def __init__(self, store: Store, home: Home, supervisor: Supervisor, publisher: Publisher,
                 clock: Clock, owner: str) -> None:
        self.store = store
        self.home = home
        self.supervisor = supervisor
        self.publisher = publisher
        self.clock = clock
        self.owner = owner
        self.reconciler = Reconciler(store, supervisor, home, self._restart_active_locked)
        self.live_ops: set[int] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        self._app_locks: dict[str, asyncio.Lock] = {}
        self._backoff: dict[tuple[str, str], Backoff] = {}
        self._restarts: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.closing = False

    def lock(self, host: str) -> asyncio.Lock:
        return self._locks.setdefault(host, asyncio.Lock())

    # -- validation ------------------------------------------------------------------

    def validate_hosts(self, app: str, hosts: list[str]) -> None:
        """Refuse bad or foreign hostnames before anything is staged or written."""
        for host in hosts:
            if not valid_host(host):
                raise UserError(f"{host!r} is not a valid hostname",
                                hint="use lowercase letters, digits, dots and dashes")
            owner = self.store.get_instance(host)
            if owner is not None and owner.app != app:
                raise UserError(f"{host} already belongs to app {owner.app}",
                                hint=f"pick another host, or remove it from {owner.app}")

    def instances_of(self, app: str, host: str | None) -> list[Instance]:
        if self.store.get_app(app) is None:
            raise NotFoundError(f"no app named {app}", hint="see `keelway apps`")
        instances = self.store.list_instances(app)
        if host is not None:
            instances = [i for i in instances if i.host == host]
            if not instances:
                raise NotFoundError(f"{app} has no instance {host}",
                                    hint=f"see `keelway status {app}`")
        return instances

    # -- rollouts --------------------------------------------------------------------

    async def deploy(self, app: str, build_digest: str, build_path: Path, hosts: list[str],
                     progress: Progress = _quiet, key: str | None = None,
                     request_digest: str | None = None,
                     mode: Mode | None = None) -> list[InstanceResult]:
        """Release a staged build to every instance of `app` (and to new `hosts`)."""
        self.validate_hosts(app, hosts)
        self.store.ensure_app(app)
        known = [i.host for i in self.store.list_instances(app)]
        targets = known + [h for h in hosts if h not in known] or [f"{app}.localhost"]
        for host in targets:
            self.store.ensure_instance(host, app)
        self.store.record_build(app, build_digest, str(build_path))
        app_record = self.store.get_app(app)
        config = dict(app_record.config) if app_record else {}
        return await self._rollout(app, "deploy", Cause.RELEASE, build_digest, build_path,
                                   config, f"Deploy {build_digest[:12]}", targets, progress,
                                   key, request_digest, mode)

    async def set_config(self, app: str, changes: dict[str, str | None],
                         progress: Progress = _quiet, key: str | None = None,
                         request_digest: str | None = None) -> list[InstanceResult]:
        """A new release with changed config vars (None unsets); restarts per mode."""
        app_record = self.store.get_app(app)
        if app_record is None:
            raise NotFoundError(f"no app named {app}", hint="see `keelway apps`")
        current = targets.current_release(self.store, app)
        config = dict(app_record.config)
        for name, value in changes.items():
            if value is None:
                config.pop(name, None)
            else:
                config[name] = value
        names = ", ".join(sorted(changes))
        verb = "Set" if all(v is not None for v in changes.values()) else "Update"
        return await self._rollout(app, "config", Cause.CONFIG, current.build_digest,
                                   current.build_path, config, f"{verb} {names}",
                                   [i.host for i in self.store.list_instances(app)], progress,
                                   key, request_digest)

    async def rollback(self, app: str, to: int | None, progress: Progress = _quiet,
                       key: str | None = None,
                       request_digest: str | None = None) -> list[InstanceResult]:
        """A new release with the build and config of an older one (default: the one
        before the latest)."""
        releases = self.store.list_releases(app)
        if self.store.get_app(app) is None:
            raise NotFoundError(f"no app named {app}", hint="see `keelway apps`")
        if to is None:
            if len(releases) < 2:
                raise UserError(f"{app} has no earlier release to roll back to",
                                hint=f"see `keelway releases {app}`")
            to = releases[1].number
        chosen = self.store.get_release(app, to)
        if chosen is None:
            raise NotFoundError(f"{app} has no release v{to}",
                                hint=f"see `keelway releases {app}`")
        build = targets.build_path(self.store, app, chosen.build_digest)
        if build is None:
            raise UserError(f"the build of v{to} is no longer staged",
                            hint="deploy its source again")
        return await self._rollout(app, "rollback", Cause.RELEASE, chosen.build_digest, build,
                                   dict(chosen.config), f"Rollback to v{to}",
                                   [i.host for i in self.store.list_instances(app)], progress,
                                   key, request_digest)

    async def _rollout(self, app: str, kind: str, cause: Cause, build_digest: str,
                       build_path: Path, config: dict[str, str], description: str,
                       hosts: list[str], progress: Progress, key: str | None,
                       request_digest: str | None,
                       mode: Mode | None = None) -> list[InstanceResult]:
        # Scheduling comes first and outside every lock: a newer intent is what makes an
        # older attempt, still running, stand down at its next check.
        revs = {host: self.store.bump_schedule(host) for host in hosts}
        async with self._app_locks.setdefault(app, asyncio.Lock()):
            number = self.store.next_release_number(app)
            target = Target.load(app, number, build_digest, build_path, config, mode)
            fallback = (targets.last_good(self.store, app, build_digest)
                        if cause is Cause.RELEASE else None)
            released = False

            def write_release() -> None:
                failpoints.hit("release.before")
                self.store.create_release(app, build_digest, config, description)
                app_record = self.store.get_app(app)
                if app_record is not None and app_record.config != config:
                    self.store.set_app_config(app_record, config)

            results: list[InstanceResult] = []
            for host in hosts:
                # A release falls back to the last good build; config and restart
                # respawn what they replaced.
                if cause is not Cause.RELEASE:
                    fallback = targets.running_target(self.store, host)
                result = await self._attempt_on(
                    host, kind, cause, target, fallback,
                    revs[host], None if released else write_release, progress, key,
                    request_digest)
                released = released or result.released
                results.append(InstanceResult(host, number, result.outcome.value,
                                              result.generations))
                if result.outcome is not Outcome.DONE:
                    raise AppFailed(
                        f"{host}: {result.reason}" + ("" if host == hosts[-1] else
                                                      "; the rollout halted here"),
                        hint=f"see `keelway logs {app} --instance {host}` and "
                             f"`keelway ops {app}`")
            return results

    async def restart(self, app: str, host: str | None, progress: Progress = _quiet,
                      key: str | None = None,
                      request_digest: str | None = None) -> list[InstanceResult]:
        """New generations of what each instance runs now (overlap or hold per service)."""
        results = []
        for inst in self.instances_of(app, host):
            target = targets.running_target(self.store, inst.host)
            if target is None:
                raise UserError(f"{inst.host} runs nothing to restart",
                                hint=f"deploy {app} first, or `keelway start {app}`")
            rev = self.store.bump_schedule(inst.host)
            result = await self._attempt_on(inst.host, "restart", Cause.RESTART, target, target,
                                            rev, None, progress, key, request_digest)
            results.append(InstanceResult(inst.host, target.release, result.outcome.value,
                                          result.generations))
            if result.outcome is not Outcome.DONE:
                raise AppFailed(f"{inst.host}: {result.reason}",
                                hint=f"see `keelway logs {app} --instance {inst.host}`")
        return results

    async def _attempt_on(self, host: str, kind: str, cause: Cause, target: Target,
                          fallback: Target | None, rev: int,
                          write_release: Callable[[], None] | None, progress: Progress,
                          key: str | None, request_digest: str | None) -> Result:
        async with self.lock(host):
            await self._reconcile_locked(host, Pass.MUTATION)
            inst = self.store.get_instance(host)
            if inst is None or inst.schedule_rev != rev:
                return Result(Outcome.SUPERSEDED, "superseded before it started")
            op = self.store.begin_operation(target.app, host, kind, self.owner, key=key,
                                            request_digest=request_digest, schedule_rev=rev)
            self.live_ops.add(op.id)
            try:
                self._mint_key(op, host)
                result = await Attempt(
                    self.store, self.home, self.supervisor, self.publisher, op, host, cause,
                    target, fallback, rev, write_release, progress).run()
            except OperationError as exc:
                result = Result(Outcome.FAILED, exc.message)
            finally:
                self.live_ops.discard(op.id)
            self._finish(op, result)
            await self._reconcile_locked(host, Pass.MUTATION)
            targets.link_current(self.store, self.home, host)
            return result

    def _finish(self, op: Operation, result: Result) -> None:
        failpoints.hit("finish.before")
        latest = self.store.get_operation(op.id) or op
        if not latest.terminal:
            if result.outcome is Outcome.DONE:
                self.store.finish_operation(latest, OpState.SUCCEEDED)
            else:
                self.store.finish_operation(latest, OpState.FAILED, error=result.reason)
        message = f"{op.kind} {'succeeded' if result.outcome is Outcome.DONE else 'failed'}"
        if result.reason:
            message += f": {result.reason}"
        self.store.add_event("op", message, app=op.app, instance=op.instance)

    async def _reconcile_locked(self, host: str, mode: Pass) -> None:
        try:
            outcome = await self.reconciler.reconcile(host, mode, self.live_ops)
        except FailedClosed as exc:
            raise OperationError(
                f"{host} is failed closed: {exc.leftover}",
                hint="the process must go before anything else runs here: stop it, then "
                     "`keelway reconcile`; `keelway status` shows it") from exc
        if outcome.republish and mode is not Pass.MUTATION:
            await self.publisher.publish()

    async def _journaled(self, app: str, host: str, kind: str,
                         work: Callable[[Operation], Awaitable[None]]) -> Result:
        """Run `work` as one journaled operation owned by this control plane: the
        operation is live (the reconciler leaves it to us) until its outcome is written.
        A crash inside `work` leaves it unfinished, for the reconciler to converge."""
        op = self.store.begin_operation(app, host, kind, self.owner)
        self.live_ops.add(op.id)
        try:
            await work(op)
            result = Result(Outcome.DONE)
        except StartFailed as exc:
            result = Result(Outcome.FAILED, str(exc))
        except OperationError as exc:
            result = Result(Outcome.FAILED, exc.message)
        finally:
            self.live_ops.discard(op.id)
        self._finish(op, result)
        return result

    # -- stop / start ----------------------------------------------------------------

    async def stop_instance(self, inst: Instance) -> None:
        """Gate the route, then stop every generation; ACTIVE stays so start can respawn."""
        async with self.lock(inst.host):
            await self._reconcile_locked(inst.host, Pass.MUTATION)
            inst = self.store.get_instance(inst.host) or inst

            async def stop(_op: Operation) -> None:
                current = self.store.get_instance(inst.host) or inst
                if current.state is not InstanceState.STOPPED:
                    self.store.set_instance_state(current, InstanceState.STOPPED)
                if self.store.get_route(inst.host) is not None:
                    self.store.set_route(inst.host, inst.host, RouteState.GATED, None, None)
                    await self.publisher.publish()
                for gen in self.store.live_generations(inst.host):
                    if not await self.supervisor.stop(gen, self._grace(gen)):
                        raise OperationError(f"generation {gen.id} (pid {gen.pid}) did not stop")

            result = await self._journaled(inst.app, inst.host, "stop", stop)
            if result.outcome is not Outcome.DONE:
                raise OperationError(result.reason or "stop failed")

    async def start_instance(self, inst: Instance) -> None:
        async with self.lock(inst.host):
            await self._reconcile_locked(inst.host, Pass.MUTATION)
            inst = self.store.get_instance(inst.host) or inst

            async def start(op: Operation) -> None:
                current = self.store.get_instance(inst.host) or inst
                if current.state is not InstanceState.RUNNING:
                    current = self.store.set_instance_state(current, InstanceState.RUNNING)
                await self._respawn_active(op, current)

            result = await self._journaled(inst.app, inst.host, "start", start)
            await self._reconcile_locked(inst.host, Pass.MUTATION)
            targets.link_current(self.store, self.home, inst.host)
            if result.outcome is not Outcome.DONE:
                raise AppFailed(f"{inst.host}: {result.reason}",
                                hint=f"see `keelway logs {inst.app} --instance {inst.host}`")

    async def _respawn_active(self, op: Operation, inst: Instance) -> None:
        """Bring every ACTIVE service back (the verified start path), keeping live ones,
        then publish the route of the ACTIVE web."""
        fresh: dict[str, Generation] = {}
        for active in self.store.list_active(inst.host):
            gen = self.store.get_generation(active.generation_id)
            if gen is None:
                continue
            if gen.state is not GenState.GONE and (
                    self.supervisor.is_watched(gen.id) or self.supervisor.adopt(gen)):
                continue
            if gen.state is not GenState.GONE:
                self.store.record_gone(gen.id, None)
            target = targets.target_of(self.store, gen)
            spec = target.manifest.services.get(gen.service) if target else None
            if target is None or spec is None:
                continue
            fresh[gen.service] = await start_generation(
                store=self.store, home=self.home, supervisor=self.supervisor, op_id=op.id,
                instance=inst.host, target=target, spec=spec, before_gen=gen.id)
            self._backoff.setdefault((inst.host, gen.service), Backoff()).started(
                self.clock.monotonic())
        with self.store.tx():
            for service, gen in fresh.items():
                self.store.set_active(inst.host, service, gen.id)
            web_active = self.store.get_active(inst.host, "web")
            web = self.store.get_generation(web_active.generation_id) if web_active else None
            if web is not None and web.state is not GenState.GONE:
                self.store.set_route(inst.host, inst.host, RouteState.SERVING, web.port, web.id)
        await self.publisher.publish()

    async def _restart_active_locked(self, host: str) -> None:
        """The reconciler's RESTART_ACTIVE, run under the instance lock it already holds."""
        inst = self.store.get_instance(host)
        if inst is None or inst.state is not InstanceState.RUNNING:
            return
        if any(h == host and not t.done() for (h, _s), t in self._restarts.items()):
            return  # a crash restart is already waiting out its backoff
        await self._journaled(inst.app, host, "recover",
                              lambda op: self._respawn_active(op, inst))

    # -- crashes, boot, periodic -------------------------------------------------------

    async def on_exit(self, gen: Generation, code: int | None) -> None:
        """A watched generation exited on its own: restart it (with backoff) if published.

        A worker that exits 0 has completed (a one-shot) and is not restarted; web is.
        """
        active = self.store.get_active(gen.instance, gen.service)
        inst = self.store.get_instance(gen.instance)
        self.store.add_event("exit", f"{gen.service} generation {gen.id} exited (code {code})",
                             app=gen.app, instance=gen.instance)
        if (self.closing or active is None or active.generation_id != gen.id or inst is None
                or inst.state is not InstanceState.RUNNING):
            return
        if gen.op_id in self.live_ops:
            return  # it died while its own operation watches it settle: that op decides
        target = targets.target_of(self.store, gen)
        spec = target.manifest.services.get(gen.service) if target else None
        if code == 0 and spec is not None and spec.kind is ServiceKind.WORKER:
            return
        backoff = self._backoff.setdefault((gen.instance, gen.service), Backoff())
        delay = backoff.delay_after_crash(self.clock.monotonic())
        self._restarts[(gen.instance, gen.service)] = asyncio.get_running_loop().create_task(
            self._restart_later(gen, delay))

    async def _restart_later(self, gen: Generation, delay_s: float) -> None:
        await self.clock.sleep(delay_s)
        if self.closing:
            return
        async with self.lock(gen.instance):
            self._restarts.pop((gen.instance, gen.service), None)
            inst = self.store.get_instance(gen.instance)
            active = self.store.get_active(gen.instance, gen.service)
            if (inst is None or inst.state is not InstanceState.RUNNING or active is None
                    or active.generation_id != gen.id):
                return  # something newer took over while we waited
            result = await self._journaled(gen.app, gen.instance, "restart-crashed",
                                           lambda op: self._respawn_active(op, inst))
            try:
                await self._reconcile_locked(gen.instance, Pass.MUTATION)
            except OperationError as exc:
                log.warning("after a crash restart: %s", exc.message)
        if result.outcome is not Outcome.DONE:
            fresh = self.store.get_active(gen.instance, gen.service)
            latest = self.store.get_generation(fresh.generation_id) if fresh else None
            if latest is not None:
                await self.on_exit(latest, latest.exit_code)

    async def boot(self) -> None:
        """After a control-plane start: reconcile every instance (adopt survivors, remove
        candidates of interrupted operations, restart what should run), settle keyed
        requests that a crash interrupted, and publish the whole route table."""
        for inst in self.store.list_instances():
            async with self.lock(inst.host):
                try:
                    await self.reconciler.reconcile(inst.host, Pass.BOOT, self.live_ops)
                except FailedClosed as exc:
                    log.warning("%s", exc)
                targets.link_current(self.store, self.home, inst.host)
        for request in self.store.running_requests():
            self.settle_request_from_journal(request.key)
        await self.publisher.publish()

    def settle_request_from_journal(self, key: str) -> None:
        ops = [op for i in self.store.list_instances()
               if (op := self.store.find_operation_by_key(i.host, key)) is not None]
        ok = bool(ops) and all(op.state is OpState.SUCCEEDED for op in ops)
        self.store.finish_request(
            key, RequestState.SUCCEEDED if ok else RequestState.FAILED,
            '{"replayed": "journal", "ok": %s}' % ("true" if ok else "false"))

    async def reconcile_all(self, dry_run: bool) -> list[dict[str, object]]:
        """`keelway reconcile`: what boot does, on demand; --dry-run only plans."""
        report: list[dict[str, object]] = []
        republish = False
        for inst in self.store.list_instances():
            async with self.lock(inst.host):
                if dry_run:
                    actions = self.reconciler.plan_for(inst.host, Pass.BOOT, self.live_ops)
                    error = None
                else:
                    try:
                        outcome = await self.reconciler.reconcile(inst.host, Pass.BOOT,
                                                                  self.live_ops)
                        actions, error = outcome.actions, None
                        republish = republish or outcome.republish
                    except FailedClosed as exc:
                        actions, error = [], str(exc)
            shown = [a.describe() for a in actions if a.kind.value != "republish"]
            report.append({"instance": inst.host, "actions": shown, "error": error})
        if republish and not dry_run:
            await self.publisher.publish()
        return report

    async def periodic(self) -> None:
        """The background pass: only *tries* each lock, never waits behind an operation."""
        while not self.closing:
            await self.clock.sleep(PERIODIC_S)
            republish = False
            for inst in self.store.list_instances():
                lock = self.lock(inst.host)
                if lock.locked():
                    continue
                async with lock:
                    try:
                        outcome = await self.reconciler.reconcile(inst.host, Pass.PERIODIC,
                                                                  self.live_ops)
                        republish = republish or outcome.republish
                    except FailedClosed as exc:
                        log.warning("periodic pass: %s", exc)
                    except Exception:
                        # Protects the periodic loop: one bad instance must not stop it.
                        log.exception("periodic pass failed for %s", inst.host)
            if republish:
                try:
                    if not await self.publisher.in_sync():
                        await self.publisher.publish()
                except OperationError as exc:
                    log.warning("periodic republish: %s", exc.message)

    async def close(self) -> None:
        self.closing = True
        for task in list(self._restarts.values()):
            task.cancel()

    # -- records -----------------------------------------------------------------------

    def _mint_key(self, op: Operation, host: str) -> None:
        seq = self.store.begin_step(op.id, "instance key")
        failpoints.hit("key.before")
        minted = ensure_instance_key(self.home.env_file(host))
        failpoints.hit("key.after")
        self.store.finish_step(op.id, seq, StepState.SUCCEEDED,
                               detail="minted" if minted else "kept")

    def _grace(self, gen: Generation) -> float:
        target = targets.target_of(self.store, gen)
        spec = target.manifest.services.get(gen.service) if target else None
        return spec.stop_grace_s if spec else 10.0
