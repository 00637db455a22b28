"""Operations on instances: deploy, stop, start, and restart after a crash.

Every operation runs under its instance's lock as a journaled operation: a row in
`operations`, then one step per effect, written `pending` before the effect and
finished after it, then a terminal outcome. A crash anywhere leaves a non-terminal
operation whose steps say which effects may have happened; boot recovery finishes it.

Overlap (web, default): start the candidate on a new port -> ready -> ACTIVE -> route ->
settle -> build good -> stop the old generation. Until the candidate has settled, the
old generation is still running, so a failure puts traffic back on it.
Hold (workers, default): stop the old generation and prove it gone, then start the
candidate, so two generations of a hold service never run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from keelway import failpoints
from keelway.builds.manifest import Mode, ServiceKind, ServiceSpec
from keelway.clock import Clock
from keelway.deploy.errors import AppFailed, NotFoundError, OperationError, UserError
from keelway.deploy.instances import StartFailed, Target, services_in_order, start_generation
from keelway.deploy.publisher import Publisher
from keelway.durable import symlink_atomic
from keelway.home import Home, valid_host
from keelway.runtime.backoff import Backoff
from keelway.runtime.environment import ensure_instance_key
from keelway.runtime.supervisor import SettleOutcome, Supervisor
from keelway.store import Store
from keelway.store.lifecycle import GenState, InstanceState, OpState, RouteState, StepState
from keelway.store.records import Generation, Instance, Operation

log = logging.getLogger("keelway.deployer")

failpoints.declare(
    "activate.before", "activate.after", "release.before", "release.after",
    "key.before", "key.after", "finish.before",
)

DRAIN_S = 0.5
Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


@dataclass
class InstanceResult:
    host: str
    release: int
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
        self._locks: dict[str, asyncio.Lock] = {}
        self._app_locks: dict[str, asyncio.Lock] = {}
        self._backoff: dict[tuple[str, str], Backoff] = {}
        self._restarts: set[asyncio.Task[None]] = set()
        self.closing = False

    def lock(self, host: str) -> asyncio.Lock:
        return self._locks.setdefault(host, asyncio.Lock())

    # -- deploy ----------------------------------------------------------------------

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

    async def deploy(self, app: str, build_digest: str, build_path: Path, hosts: list[str],
                     progress: Progress = _quiet) -> list[InstanceResult]:
        """Release a staged build to every instance of `app` (and to new `hosts`).

        The release row is written once the first instance runs it; an instance that
        fails keeps what it had, and the instances after it are not touched.
        """
        self.validate_hosts(app, hosts)
        async with self._app_locks.setdefault(app, asyncio.Lock()):
            self.store.ensure_app(app)
            known = [i.host for i in self.store.list_instances(app)]
            targets = known + [h for h in hosts if h not in known]
            if not targets:
                targets = [f"{app}.localhost"]
            number = self.store.next_release_number(app)
            app_record = self.store.get_app(app)
            config = app_record.config if app_record else {}
            self.store.record_build(app, build_digest, str(build_path))
            target = Target.load(app, number, build_digest, build_path, dict(config))
            results: list[InstanceResult] = []
            released = False
            for host in targets:
                inst = self.store.ensure_instance(host, app)
                async with self.lock(host):
                    result = await self._deploy_instance(inst, target, progress)
                results.append(result)
                if not released:
                    failpoints.hit("release.before")
                    self.store.create_release(app, build_digest, dict(config),
                                              f"Deploy {build_digest[:12]}")
                    failpoints.hit("release.after")
                    released = True
            return results

    async def _deploy_instance(self, inst: Instance, target: Target,
                               progress: Progress) -> InstanceResult:
        op = self.store.begin_operation(target.app, inst.host, "deploy", self.owner)
        self._mint_key(op, inst.host)
        prior = {a.service: self.store.get_generation(a.generation_id)
                 for a in self.store.list_active(inst.host)}
        candidates: dict[str, Generation] = {}
        stopped_for_hold: list[Generation] = []
        activated = False
        try:
            for spec in services_in_order(target.manifest):
                old = prior.get(spec.name)
                if spec.mode is Mode.HOLD and old is not None and old.state is not GenState.GONE:
                    progress(f"{inst.host}: stopping {spec.name} (hold mode)")
                    self.store.add_inhibition(old.id, "replacement-pending", op.id)
                    await self._stop(op, old, spec.stop_grace_s, f"stop {spec.name}")
                    stopped_for_hold.append(old)
                progress(f"{inst.host}: starting {spec.name}")
                gen = await start_generation(
                    store=self.store, home=self.home, supervisor=self.supervisor, op_id=op.id,
                    instance=inst.host, target=target, spec=spec,
                    before_gen=old.id if old else None,
                )
                candidates[spec.name] = gen
                progress(f"{inst.host}: {spec.name} ready (pid {gen.pid})")
            activated = True  # from here on ACTIVE may name the candidates
            await self._activate(op, inst.host, candidates)
            progress(f"{inst.host}: published")
            await self._settle(op, target, candidates, progress, inst.host)
        except (StartFailed, OperationError) as exc:
            await self._undo(op, inst.host, target, prior, candidates, stopped_for_hold,
                             activated)
            message = str(exc) if isinstance(exc, StartFailed) else exc.message
            self._fail(op, message)
            raise AppFailed(
                f"{inst.host}: {message}; kept the previous release",
                hint=f"see `keelway logs {target.app} --instance {inst.host}` and "
                     f"`keelway ops {target.app}`",
            ) from exc
        self.store.mark_build_good(target.app, target.build_digest)
        for service, old in prior.items():
            if old is None or old.state is GenState.GONE or old in stopped_for_hold:
                continue
            retiring = target.manifest.services.get(service)
            self.store.add_inhibition(old.id, "retirement-pending", op.id)
            await asyncio.sleep(DRAIN_S)  # in-flight requests to the old port finish
            await self._stop(op, old, retiring.stop_grace_s if retiring else 10.0,
                             f"retire {service}")
        self._succeed(op)
        return InstanceResult(inst.host, target.release,
                              {s: g.id for s, g in candidates.items()})

    async def _settle(self, op: Operation, target: Target, candidates: dict[str, Generation],
                      progress: Progress, host: str) -> None:
        window = max((target.manifest.services[s].settle_s for s in candidates), default=0.0)
        if window > 0:
            progress(f"{host}: settling for {window:g}s")
        seq = self.store.begin_step(op.id, "settle", detail=f"{window:g}s")
        outcomes = await asyncio.gather(*(
            self.supervisor.settle(gen, target.manifest.services[s].settle_s)
            for s, gen in candidates.items()
        ))
        crashed = [s for s, o in zip(candidates, outcomes, strict=True)
                   if o is SettleOutcome.CRASHED]
        if crashed:
            error = f"{', '.join(crashed)} exited during the settle window"
            self.store.finish_step(op.id, seq, StepState.FAILED, error=error)
            raise AppFailed(error)
        self.store.finish_step(op.id, seq, StepState.SUCCEEDED)

    async def _activate(self, op: Operation, host: str, candidates: dict[str, Generation]) -> None:
        """Write ACTIVE and the route in one transaction, then push the route table."""
        seq = self.store.begin_step(op.id, "activate",
                                    detail=", ".join(f"{s}={g.id}" for s, g in candidates.items()))
        failpoints.hit("activate.before")
        with self.store.tx():
            for service, gen in candidates.items():
                self.store.set_active(host, service, gen.id)
            web = candidates.get("web")
            if web is not None:
                self.store.set_route(host, host, RouteState.SERVING, web.port, web.id)
        failpoints.hit("activate.after")
        self.store.finish_step(op.id, seq, StepState.SUCCEEDED)
        self._link_current(host)
        seq = self.store.begin_step(op.id, "publish")
        await self.publisher.publish()
        self.store.finish_step(op.id, seq, StepState.SUCCEEDED)

    async def _undo(self, op: Operation, host: str, target: Target,
                    prior: dict[str, Generation | None], candidates: dict[str, Generation],
                    stopped_for_hold: list[Generation], activated: bool) -> None:
        """Put the instance back as it was: prior ACTIVE and route, candidates removed.

        Records the operation never changed are not rewritten, so a failure before
        activation leaves ACTIVE and the route exactly as they were.
        """
        if activated:
            with self.store.tx():
                for service, old in prior.items():
                    if old is not None:
                        self.store.set_active(host, service, old.id)
                old_web = prior.get("web")
                if old_web is not None and old_web.state is not GenState.GONE:
                    self.store.set_route(host, host, RouteState.SERVING, old_web.port,
                                         old_web.id)
                elif old_web is None and self.store.get_route(host) is not None:
                    self.store.set_route(host, host, RouteState.GATED, None, None)
            with contextlib.suppress(OperationError):
                await self.publisher.publish()
        for service, gen in candidates.items():
            spec = target.manifest.services[service]
            await self._stop(op, gen, spec.stop_grace_s, f"remove candidate {service}")
        # Any candidate whose start failed is not in `candidates`: find it by the journal.
        for gen in self.store.live_generations(host):
            if gen.op_id == op.id and gen.id not in {g.id for g in candidates.values()}:
                await self._stop(op, gen, 5.0, f"remove candidate {gen.service}")
        for old in stopped_for_hold:
            old_target = self._target_of(old)
            if old_target is None:
                continue
            old_spec = old_target.manifest.services.get(old.service)
            if old_spec is None:
                continue
            try:
                gen = await start_generation(
                    store=self.store, home=self.home, supervisor=self.supervisor,
                    op_id=op.id, instance=host, target=old_target, spec=old_spec,
                    before_gen=old.id,
                )
                self.store.set_active(host, old.service, gen.id)
            except StartFailed as exc:
                await self._stop(op, exc.generation, 5.0, f"remove respawn {old.service}")

    async def _stop(self, op: Operation, gen: Generation, grace_s: float, name: str) -> None:
        seq = self.store.begin_step(op.id, name, service=gen.service, before_gen=gen.id)
        latest = self.store.get_generation(gen.id) or gen
        if await self.supervisor.stop(latest, grace_s):
            self.store.finish_step(op.id, seq, StepState.SUCCEEDED)
            return
        error = f"generation {gen.id} (pid {gen.pid}) survived SIGKILL"
        self.store.finish_step(op.id, seq, StepState.FAILED, error=error)
        raise OperationError(error, hint="the process is stuck in the kernel; check `ps`")

    def _link_current(self, host: str) -> None:
        """Point the instance's `current` link at the build ACTIVE web (or any) runs.

        Derived from ACTIVE, so a crash that leaves it stale is repaired at boot.
        """
        actives = sorted(self.store.list_active(host), key=lambda a: a.service != "web")
        gen = self.store.get_generation(actives[0].generation_id) if actives else None
        build = next((b for b in self.store.list_builds(gen.app)
                      if b.digest == gen.build_digest), None) if gen else None
        if build is not None:
            symlink_atomic(self.home.current_link(host), Path(build.path))

    def _mint_key(self, op: Operation, host: str) -> None:
        path = self.home.env_file(host)
        seq = self.store.begin_step(op.id, "instance key")
        failpoints.hit("key.before")
        minted = ensure_instance_key(path)
        failpoints.hit("key.after")
        self.store.finish_step(op.id, seq, StepState.SUCCEEDED,
                               detail="minted" if minted else "kept")

    def _succeed(self, op: Operation) -> None:
        failpoints.hit("finish.before")
        latest = self.store.get_operation(op.id) or op
        self.store.finish_operation(latest, OpState.SUCCEEDED)
        self.store.add_event("op", f"{op.kind} succeeded", app=op.app, instance=op.instance)

    def _fail(self, op: Operation, error: str) -> None:
        latest = self.store.get_operation(op.id) or op
        if not latest.terminal:
            self.store.finish_operation(latest, OpState.FAILED, error=error)
        self.store.add_event("op", f"{op.kind} failed: {error}", app=op.app, instance=op.instance)

    def _target_of(self, gen: Generation) -> Target | None:
        build = next((b for b in self.store.list_builds(gen.app) if b.digest == gen.build_digest),
                     None)
        if build is None:
            return None
        release = self.store.get_release(gen.app, gen.release)
        app = self.store.get_app(gen.app)
        config = release.config if release else (app.config if app else {})
        return Target.load(gen.app, gen.release, gen.build_digest, Path(build.path), config)

    # -- stop / start ----------------------------------------------------------------

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

    async def stop_instance(self, inst: Instance) -> None:
        """Gate the route, then stop every generation; ACTIVE stays so start can respawn."""
        async with self.lock(inst.host):
            inst = self.store.get_instance(inst.host) or inst
            op = self.store.begin_operation(inst.app, inst.host, "stop", self.owner)
            if inst.state is not InstanceState.STOPPED:
                inst = self.store.set_instance_state(inst, InstanceState.STOPPED)
            route = self.store.get_route(inst.host)
            if route is not None:
                self.store.set_route(inst.host, inst.host, RouteState.GATED, None, None)
                seq = self.store.begin_step(op.id, "gate route")
                await self.publisher.publish()
                self.store.finish_step(op.id, seq, StepState.SUCCEEDED)
            try:
                for gen in self.store.live_generations(inst.host):
                    target = self._target_of(gen)
                    spec = target.manifest.services.get(gen.service) if target else None
                    await self._stop(op, gen, spec.stop_grace_s if spec else 10.0,
                                     f"stop {gen.service}")
            except OperationError as exc:
                self._fail(op, exc.message)
                raise
            self._succeed(op)

    async def start_instance(self, inst: Instance) -> None:
        async with self.lock(inst.host):
            inst = self.store.get_instance(inst.host) or inst
            op = self.store.begin_operation(inst.app, inst.host, "start", self.owner)
            if inst.state is not InstanceState.RUNNING:
                inst = self.store.set_instance_state(inst, InstanceState.RUNNING)
            try:
                await self._respawn_active(op, inst)
            except (StartFailed, OperationError) as exc:
                message = str(exc) if isinstance(exc, StartFailed) else exc.message
                if isinstance(exc, StartFailed):
                    await self._stop(op, exc.generation, 5.0, f"remove {exc.service}")
                self._fail(op, message)
                raise AppFailed(f"{inst.host}: {message}",
                                hint=f"see `keelway logs {inst.app} --instance {inst.host}`",
                                ) from exc
            self._succeed(op)

    async def _respawn_active(self, op: Operation, inst: Instance) -> None:
        """Bring every ACTIVE service of a running instance back, keeping live ones."""
        fresh: dict[str, Generation] = {}
        for active in self.store.list_active(inst.host):
            gen = self.store.get_generation(active.generation_id)
            if gen is None:
                continue
            if gen.state is not GenState.GONE and (
                self.supervisor.is_watched(gen.id) or self.supervisor.adopt(gen)
            ):
                continue
            if gen.state is not GenState.GONE:
                self.store.record_gone(gen.id, None)
            target = self._target_of(gen)
            spec: ServiceSpec | None = target.manifest.services.get(gen.service) if target else None
            if target is None or spec is None:
                continue
            fresh[gen.service] = await start_generation(
                store=self.store, home=self.home, supervisor=self.supervisor, op_id=op.id,
                instance=inst.host, target=target, spec=spec, before_gen=gen.id,
            )
            key = (inst.host, gen.service)
            self._backoff.setdefault(key, Backoff()).started(self.clock.monotonic())
        web_active = self.store.get_active(inst.host, "web")
        if fresh:
            await self._activate(op, inst.host, fresh)
        elif web_active is not None:
            web = self.store.get_generation(web_active.generation_id)
            if web is not None and web.state is not GenState.GONE:
                self.store.set_route(inst.host, inst.host, RouteState.SERVING, web.port, web.id)
                await self.publisher.publish()

    # -- crashes and boot ------------------------------------------------------------

    async def on_exit(self, gen: Generation, code: int | None) -> None:
        """A watched generation exited on its own: restart it if it is published."""
        active = self.store.get_active(gen.instance, gen.service)
        inst = self.store.get_instance(gen.instance)
        self.store.add_event("exit", f"{gen.service} generation {gen.id} exited (code {code})",
                             app=gen.app, instance=gen.instance)
        if (self.closing or active is None or active.generation_id != gen.id or inst is None
                or inst.state is not InstanceState.RUNNING):
            return
        backoff = self._backoff.setdefault((gen.instance, gen.service), Backoff())
        delay = backoff.delay_after_crash(self.clock.monotonic())
        task = asyncio.get_running_loop().create_task(self._restart_later(gen, delay))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart_later(self, gen: Generation, delay_s: float) -> None:
        await self.clock.sleep(delay_s)
        if self.closing:
            return
        async with self.lock(gen.instance):
            inst = self.store.get_instance(gen.instance)
            active = self.store.get_active(gen.instance, gen.service)
            if (inst is None or inst.state is not InstanceState.RUNNING or active is None
                    or active.generation_id != gen.id):
                return  # something newer took over while we waited
            op = self.store.begin_operation(gen.app, gen.instance, "restart-crashed", self.owner)
            try:
                await self._respawn_active(op, inst)
            except (StartFailed, OperationError) as exc:
                if isinstance(exc, StartFailed):
                    await self._stop(op, exc.generation, 5.0, f"remove {exc.service}")
                    # The new one crashed too: try again later, further backed off.
                    await self.on_exit(exc.generation, exc.generation.exit_code)
                self._fail(op, str(exc))
                return
            self._succeed(op)

    async def boot(self) -> None:
        """After a control-plane start: finish interrupted operations, adopt survivors,
        restart what should run, stop what no ACTIVE entry names, republish routes."""
        for inst in self.store.list_instances():
            async with self.lock(inst.host):
                await self._recover_instance(inst)
        await self.publisher.publish()

    async def _recover_instance(self, inst: Instance) -> None:
        """Converge one instance after a control-plane start.

        Survivors named by ACTIVE are adopted; anything else alive is removed (a
        candidate of an interrupted operation never serves); ACTIVE services with no
        live process are started again. An instance with nothing to do writes nothing.
        """
        latest = self.store.latest_operation(inst.host)
        if latest is not None and not latest.terminal:
            self._fail(latest, "interrupted by a control-plane restart")
        running = inst.state is InstanceState.RUNNING
        active_ids = {a.generation_id for a in self.store.list_active(inst.host)}
        strays: list[Generation] = []
        for gen in self.store.live_generations(inst.host):
            if running and gen.id in active_ids and self.supervisor.adopt(gen):
                continue
            strays.append(gen)
        missing = running and any(
            (g := self.store.get_generation(gid)) is not None
            and (g.state is GenState.GONE or g in strays)
            for gid in active_ids
        )
        if not strays and not missing:
            self._link_current(inst.host)
            return
        op = self.store.begin_operation(inst.app, inst.host, "recover", self.owner)
        try:
            for gen in strays:
                # _stop proves death by pid + start time; a row with no pid has no
                # process to find and is simply recorded gone.
                await self._stop(op, gen, 10.0, f"remove {gen.service} {gen.id}")
            if running:
                await self._respawn_active(op, inst)
        except (StartFailed, OperationError) as exc:
            self._fail(op, str(exc))
            return
        self._link_current(inst.host)
        self._succeed(op)

    async def close(self) -> None:
        self.closing = True
        for task in list(self._restarts):
            task.cancel()

    def serving_gens(self, instances: list[Instance]) -> list[Generation]:
        return [g for i in instances for g in self.store.live_generations(i.host)]


__all__ = ["Deployer", "InstanceResult", "ServiceKind"]
