"""Tenants whole: apps created and destroyed, instances added and removed, and the
aliases (domains) of an instance. A part beside `Deployer`, wired in
keelway/api/daemon.py, on the same locks, journal and recovery.

Each operation here is journaled, its effects run through `Steps` with a failpoint
before and after each one, and each is rolled forward after a crash, from a durable
intent written before its first effect:
- `instances add`: the records of every new instance in one write, each marked
  `adding` (the intent); then one LAY_DOWN step lays every instance's files down (data
  dir, an empty WAL database at KEELWAY_DB, the env file with a minted key: each of
  them idempotent), then, if the app has a release, each instance is started on it; the
  mark is cleared last. Crash anywhere: boot (`resume`) lays down and starts what is
  still marked.
- `instances remove` and each instance of `apps destroy`: the intent `removing`
  written before the operation begins, then WITHDRAW (the instance STOPPED so nothing
  restarts it, its routes gated, in one write; then the router told), a STOP per
  generation (proven gone, SPEC §5.5: the records go only after), PURGE_DATA when
  asked, FORGET (the records, in one write).
  Crash anywhere: the reconciler finalizes the operation, and boot removes the
  instance again from its start, every step a no-op where already done.
- `apps destroy` then runs one operation of the app itself (journaled with no
  instance): REMOVE_BUILDS, FORGET. Its intent is the app's `destroying` mark.
Data stays unless `--purge-data` says otherwise (SPEC §5.7); the journal, events and
idempotency keys outlive every removal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from keelway import failpoints, names
from keelway.builds import gc as builds_gc
from keelway.builds.tree import remove_tree
from keelway.data.objects import ObjectStore, ObjectStoreError, instance_prefix
from keelway.data.replicas import Replicas
from keelway.deploy import planned, targets
from keelway.deploy.deployer import Deployer, InstanceResult
from keelway.deploy.errors import NotFoundError, OperationError, UserError
from keelway.deploy.instances import lay_down
from keelway.deploy.locks import Locks
from keelway.deploy.outcome import Outcome, Progress, Result
from keelway.deploy.part import Part
from keelway.deploy.planned import Plan, PlannedStep
from keelway.deploy.publisher import Publisher
from keelway.deploy.recovery import Recovery
from keelway.deploy.steps import Done, Effect, Failed, Steps
from keelway.home import Home
from keelway.journal import OpKind, StepKind
from keelway.reconcile.plan import Pass
from keelway.runtime.supervisor import Supervisor
from keelway.store import Conflict, NotFound, Store
from keelway.store.hosts import HostTaken
from keelway.store.lifecycle import InstanceState, OpState, Removal, StepState
from keelway.store.records import Alias, App, Instance, Operation

log = logging.getLogger("keelway.tenants")

failpoints.declare(
    "laydown.before", "laydown.after",
    "remove.withdraw.before", "remove.withdraw.after",
    "remove.stop.before", "remove.stop.after",
    "remove.purge.before", "remove.purge.after",
    "remove.purge-replica.before", "remove.purge-replica.after",
    "remove.purge-snapshots.before", "remove.purge-snapshots.after",
    "remove.forget.before", "remove.forget.after",
    "destroy.builds.before", "destroy.builds.after",
    "destroy.forget.before", "destroy.forget.after",
    "adding.finish.before",
)

# The app's own operation of a destroy names no instance.
APP_SCOPE = ""
# Files are laid down in parallel: each is a few fsyncs, which wait on the disk.
LAY_DOWN_THREADS = 8


def _quiet(_message: str) -> None:
    pass


@dataclass(frozen=True)
class Added:
    instances: list[Instance]
    started: list[InstanceResult]


def _user_error(exc: names.InvalidName) -> UserError:
    return UserError(exc.message, hint=exc.hint)


def _taken(exc: HostTaken) -> UserError:
    return UserError(str(exc), hint="a host names one instance or one alias; "
                     "see `keelway instances list` and `keelway domains list`")


class Tenants(Part):
    def __init__(self, store: Store, home: Home, supervisor: Supervisor, publisher: Publisher,
                 locks: Locks, recovery: Recovery, deployer: Deployer,
                 replicas: Replicas | None = None, objects: ObjectStore | None = None) -> None:
        super().__init__(store, home, supervisor, publisher, locks, recovery)
        # Where a purge finds the instance's replica and snapshots; None: not kept here.
        self.replicas = replicas
        self.objects = objects
        self.deployer = deployer

    # -- validation (before anything changes) ------------------------------------------

    def app(self, name: str) -> App:
        try:
            names.APP.check(name)
        except names.InvalidName as exc:
            raise _user_error(exc) from None
        app = self.store.get_app(name)
        if app is None or app.destroying is not None:
            raise NotFoundError(f"no app named {name}", hint="see `keelway apps`")
        return app

    def instance_of(self, app: str, host: str) -> Instance:
        self.app(app)
        inst = self.store.get_instance(host)
        if inst is None or inst.app != app:
            raise NotFoundError(f"{app} has no instance {host}",
                                hint=f"see `keelway instances list {app}`")
        return inst

    def instance(self, host: str) -> Instance:
        inst = self.store.get_instance(host)
        if inst is None:
            claim = self.store.claim(host)
            hint = (f"{host} is an alias of {claim.instance}" if claim is not None
                    else "see `keelway instances list APP`")
            raise NotFoundError(f"no instance {host}", hint=hint)
        return inst

    def check_hosts(self, hosts: Sequence[str]) -> None:
        """Every host valid, none given twice, none naming anything yet."""
        if not hosts:
            raise UserError("name at least one host")
        seen: set[str] = set()
        for host in hosts:
            try:
                names.HOST.check(host)
            except names.InvalidName as exc:
                raise _user_error(exc) from None
            if host in seen:
                raise UserError(f"{host} is given twice")
            seen.add(host)
            claim = self.store.claim(host)
            if claim is not None:
                raise _taken(HostTaken(host, claim))

    def checked_config(self, app: App, base: Mapping[str, str],
                       changes: Mapping[str, str | None]) -> dict[str, str]:
        """`base` with `changes` (None unsets), refused unless it and the app's config
        layered under it pass the config rules: every process carries both."""
        config = dict(base)
        try:
            for name, value in changes.items():
                if value is None:
                    names.CONFIG_NAME.check(name)
                    config.pop(name, None)
                else:
                    names.check_config_set(name, value)
                    config[name] = value
            names.check_config({**app.config, **config})
        except names.InvalidName as exc:
            raise _user_error(exc) from None
        return config

    # -- apps ------------------------------------------------------------------------

    def create_app(self, name: str) -> App:
        try:
            names.APP.check(name)
        except names.InvalidName as exc:
            raise _user_error(exc) from None
        try:
            return self.store.create_app(name)
        except Conflict:
            raise UserError(f"an app named {name} exists already",
                            hint=f"see `keelway status {name}`") from None

    async def destroy_app(self, name: str, removal: Removal) -> list[str]:
        """Remove every instance of the app (processes proven gone, routes withdrawn,
        records deleted; data kept unless `removal` purges it), then its builds and
        records, so the name can be used again. Returns the hosts removed."""
        app = self.store.get_app(name)
        if app is None:
            raise NotFoundError(f"no app named {name}", hint="see `keelway apps`")
        async with self.locks.app(name):
            self.store.mark_destroying(name, removal)  # the intent, before any effect
            app = self.store.get_app(name) or app
            removal = Removal(app.destroying or removal)
            removed = []
            for inst in self.store.list_instances(name):
                await self._remove(inst, OpKind.DESTROY, removal)
                removed.append(inst.host)
            await self._forget_app(name)
        return removed

    def plan_destroy_app(self, name: str, removal: Removal) -> list[tuple[str, Plan]]:
        """The dry run of `apps destroy`: each instance's removal and the app's own
        operation, as they would run now. Nothing is changed."""
        self.app(name)
        return plan_destroy(self.store, name, removal, replicas=self.replicas is not None,
                            objects=self.objects is not None)

    async def _forget_app(self, name: str) -> None:
        plan = plan_forget_app(name)

        async def work(op: Operation) -> Result:
            steps = Steps(self.store, op.id)

            async def remove_builds() -> Done:
                staged = builds_gc.staged_builds(self.home.builds_dir)
                keep = {build for build in staged if build[0] != name}
                gone = await asyncio.to_thread(builds_gc.collect, self.home.builds_dir, keep)
                return Done(f"{len(gone)} builds removed")

            async def forget() -> Done:
                self.store.forget_app(name)
                return Done(f"app {name}")

            for step in plan.steps:
                match step.kind:
                    case StepKind.REMOVE_BUILDS:
                        await planned.run(steps, step, remove_builds)
                    case StepKind.FORGET:
                        await planned.run(steps, step, forget)
                    case _:
                        raise AssertionError(f"an app's destroy plans no {step.kind} step")
            return Result(Outcome.DONE)

        async with self.locks.instance(APP_SCOPE):
            result = await self.journal.run(name, APP_SCOPE, OpKind.DESTROY, work)
        self._finish_orphans()  # a fault leaves the app's op with no reconciler to end it
        if result.outcome is not Outcome.DONE:
            raise OperationError(f"destroy {name}: {result.reason}",
                                 hint="`keelway apps destroy` again carries it on")

    # -- instances -------------------------------------------------------------------

    async def add_instances(self, app_name: str, hosts: Sequence[str],
                            config: Mapping[str, str], progress: Progress = _quiet,
                            parked: bool = False) -> Added:
        """Lay new instances down whole (records in one write, then their files), then
        start them on the app's current release if it has one. Bad input changes
        nothing: every host and the config are checked first, and the records are
        written all or none.

        `parked`: recorded PARKED with parked routes, the app's current release (if any)
        deferred to each one's first wake; nothing is started here, so adding 10,000
        idle tenants costs records and files only."""
        app = self.app(app_name)
        self.check_hosts(hosts)
        layered = self.checked_config(app, {}, dict(config))
        async with self.locks.app(app_name):
            try:
                instances = self.store.add_instances(app_name, list(hosts), layered,
                                                     parked=parked)
            except HostTaken as exc:
                raise _taken(exc) from None
            except NotFound:
                raise NotFoundError(f"no app named {app_name}") from None
            progress(f"recorded {len(instances)} instances")
            started = await self._finish_add(app_name, list(hosts), progress)
        return Added(instances, started)

    def plan_add_instances(self, app_name: str, hosts: Sequence[str],
                           config: Mapping[str, str], parked: bool = False) -> Plan:
        """The dry run of `instances add`: every check the add makes, then its plan.
        Nothing is changed."""
        app = self.app(app_name)
        self.check_hosts(hosts)
        self.checked_config(app, {}, dict(config))
        return plan_add(self.store, AddRequest(app_name, tuple(hosts), parked))

    async def _finish_add(self, app: str, hosts: list[str],
                          progress: Progress) -> list[InstanceResult]:
        await self._lay_down(app, hosts)
        progress(f"laid down {len(hosts)} instances")
        started: list[InstanceResult] = []
        # Only what runs nothing yet and is not parked: after a crash past a start, that
        # start counts; a parked instance starts at its first wake.
        idle = [host for host in hosts if not self.store.list_active(host)
                and (inst := self.store.get_instance(host)) is not None
                and inst.state is InstanceState.RUNNING]
        released = bool(self.store.list_releases(app))
        if idle and released:
            started = await self.deployer.start_new(app, idle, progress)
        if len(idle) < len(hosts):
            # Parked ones have parked routes: the router must hold their first request
            # and ask for the wake, not answer 404.
            await self.publisher.publish()
        elif not released:
            await self._publish_pages()
        failpoints.hit("adding.finish.before")
        self.store.finish_adding(hosts)
        return started

    async def _publish_pages(self) -> None:
        """Publish for hosts with no route row, whose router page only says "not deployed
        yet" (keelway/deploy/publisher.py): nothing is routed by it, so a router that
        cannot be told now learns it from the next publish (its restart pushes the
        whole table) and the command does not fail for it."""
        try:
            await self.publisher.publish()
        except OperationError as exc:
            log.info("publishing the router's pages: %s", exc.message)

    async def _lay_down(self, app: str, hosts: list[str]) -> None:
        """One LAY_DOWN step for every host, journaled on the first. Crash inside: the
        step stays pending, the reconciler finalizes the operation, and boot lays the
        instances still marked `adding` down again (each file is made only if missing)."""
        plan = plan_add(self.store, AddRequest(app, tuple(hosts)))

        async def work(op: Operation) -> Result:
            async def lay_down() -> Done:
                made = await asyncio.to_thread(self._lay_down_files, hosts)
                return Done(f"{len(hosts)} instances; {made} databases made")

            steps = Steps(self.store, op.id)
            for step in plan.steps:
                if step.delegated:
                    continue  # each start is an attempt of its own (`_finish_add`)
                assert step.kind is StepKind.LAY_DOWN, step
                await planned.run(steps, step, lay_down)
            return Result(Outcome.DONE)

        first = hosts[0]
        async with self.locks.instance(first):
            result = await self.journal.run(app, first, OpKind.ADD_INSTANCES, work)
        if result.outcome is not Outcome.DONE:
            raise OperationError(f"laying down the instances failed: {result.reason}",
                                 hint="the instances are recorded; `keelway up` lays them "
                                      "down again, or remove them with `instances remove`")

    def _lay_down_files(self, hosts: list[str]) -> int:
        def one(host: str) -> bool:
            return lay_down(self.home, host).database

        with ThreadPoolExecutor(LAY_DOWN_THREADS) as pool:
            return sum(pool.map(one, hosts))

    def plan_removal(self, app: str, host: str, removal: Removal) -> Plan:
        """The dry run of `instances remove`: its plan as it would run now."""
        self.instance_of(app, host)
        return plan_remove(self.store, self._remove_request(host, removal))

    async def remove_instance(self, app: str, host: str, removal: Removal) -> None:
        inst = self.instance_of(app, host)
        async with self.locks.app(app):
            await self._remove(inst, OpKind.REMOVE_INSTANCE, removal)

    async def _remove(self, inst: Instance, kind: OpKind, removal: Removal) -> None:
        host = inst.host
        async with self.locks.instance(host):
            await self.recovery.converge(host, Pass.MUTATION)  # failed closed refuses
            # The intent first: a crash from here on is carried on by the next boot.
            self.store.mark_removing(host, removal)
            plan = plan_remove(self.store, self._remove_request(host, removal))
            result = await self.journal.run(
                inst.app, host, kind, lambda op: self._removal_steps(op, host, removal, plan))
        if result.outcome is not Outcome.DONE:
            raise OperationError(f"removing {host}: {result.reason}",
                                 hint=f"see `keelway ops {inst.app} --instance {host}`; "
                                      "removing it again carries on")

    def _remove_request(self, host: str, removal: Removal) -> RemoveRequest:
        return RemoveRequest(host, removal, replicas=self.replicas is not None,
                             objects=self.objects is not None)

    async def _removal_steps(self, op: Operation, host: str, removal: Removal,
                             plan: Plan) -> Result:
        """Run `plan` (`plan_remove`): each step's effect bound by its kind."""
        steps = Steps(self.store, op.id)
        replicas, objects = self.replicas, self.objects

        async def withdraw() -> Done:
            if self.store.withdraw_instance(host, removal):
                await self.publisher.publish()
            return Done("stopped; routes gated")

        def stop(gen_id: int) -> Effect:
            async def stop() -> Done | Failed:
                current = self.store.get_generation(gen_id)
                if current is None or await self.supervisor.stop(
                        current, targets.stop_grace_s(self.store, current)):
                    return Done("gone")
                return Failed(f"generation {gen_id} (pid {current.pid}) did not stop")

            return stop

        async def purge() -> Done:
            await asyncio.to_thread(remove_tree, self.home.data_dir(host))
            self.home.env_file(host).unlink(missing_ok=True)
            return Done("data dir and env file removed")

        async def purge_replica() -> Done | Failed:
            assert replicas is not None
            try:
                count = await replicas.delete(host)
            except ObjectStoreError as exc:
                return Failed(f"the replica of {host} could not be deleted: {exc}")
            return Done(f"{count} objects")

        async def purge_snapshots() -> Done | Failed:
            assert objects is not None
            try:
                count = await asyncio.to_thread(objects.delete_prefix, instance_prefix(host))
            except ObjectStoreError as exc:
                return Failed(f"the snapshots of {host} could not be deleted: {exc}")
            return Done(f"{count} objects")

        async def forget() -> Done:
            self.store.forget_instance(host)
            # The router drops the gated rows too: the host is unknown again (404).
            await self.publisher.publish()
            return Done(f"instance {host}")

        for step in plan.steps:
            match step.kind:
                case StepKind.WITHDRAW:
                    effect: Effect = withdraw
                case StepKind.STOP:
                    effect = stop(step.before_gen or 0)
                case StepKind.PURGE_DATA:
                    effect = purge
                case StepKind.PURGE_REPLICA:
                    effect = purge_replica
                case StepKind.PURGE_SNAPSHOTS:
                    effect = purge_snapshots
                case StepKind.FORGET:
                    effect = forget
                case _:
                    raise AssertionError(f"a removal plans no {step.kind} step")
            if step.kind in (StepKind.PURGE_DATA, StepKind.FORGET):
                # Every process is proven gone: what `current` links to is derived, and
                # it goes with the records, data or not (idempotent).
                self.home.current_link(host).unlink(missing_ok=True)
            if (failed := await planned.run(steps, step, effect)) is not None:
                # A purge that failed fails the removal, which carries on from here
                # when run again.
                return Result(Outcome.FAILED, failed.reason)
        return Result(Outcome.DONE)

    async def set_instance_config(self, app: str, host: str,
                                  changes: Mapping[str, str | None],
                                  progress: Progress = _quiet) -> list[InstanceResult]:
        """Change an instance's own config; it restarts (per mode) if it runs."""
        inst = self.instance_of(app, host)
        config = self.checked_config(self.app(app), inst.config, changes)
        async with self.locks.instance(host):
            current = self.store.get_instance(host) or inst
            self.store.set_instance_config(current, config)
        if targets.running_target(self.store, host) is None:
            return []
        return await self.deployer.restart(app, host, progress)

    # -- aliases -----------------------------------------------------------------------

    async def add_aliases(self, host: str, aliases: Sequence[str]) -> list[Alias]:
        inst = self.instance(host)
        self.check_hosts(aliases)
        async with self.locks.instance(inst.host):
            try:
                found = self.store.add_aliases(inst.host, list(aliases))
            except HostTaken as exc:
                raise _taken(exc) from None
            if self.store.get_route(inst.host) is not None:
                await self.publisher.publish(inst.host)
            else:
                await self._publish_pages()
        return found

    async def remove_aliases(self, host: str, aliases: Sequence[str]) -> list[Alias]:
        inst = self.instance(host)
        if not aliases:
            raise UserError("name at least one alias")
        async with self.locks.instance(inst.host):
            try:
                found = self.store.remove_aliases(inst.host, list(aliases))
            except NotFound as exc:
                raise NotFoundError(str(exc), hint=f"see `keelway domains list {host}`") \
                    from None
            await self.publisher.publish()
        return found

    # -- after a crash -----------------------------------------------------------------

    async def resume(self) -> None:
        """At boot, after the reconciler's pass and before the API opens: carry on every
        interrupted removal, destroy and add from its durable intent."""
        self._finish_orphans()
        for app in self.store.destroying_apps():
            await self._carry_on(f"destroy {app.name}",
                                 self.destroy_app(app.name, Removal(app.destroying
                                                                    or Removal.KEEP_DATA)))
        for inst in self.store.removing_instances():
            await self._carry_on(f"remove {inst.host}", self.remove_instance(
                inst.app, inst.host, Removal(inst.removing or Removal.KEEP_DATA)))
        pending: dict[str, list[str]] = {}
        for inst in self.store.adding_instances():
            pending.setdefault(inst.app, []).append(inst.host)
        for name, hosts in sorted(pending.items()):
            await self._carry_on(f"add {len(hosts)} instances of {name}",
                                 self._carry_on_add(name, hosts))
        self._finish_orphans()

    async def _carry_on_add(self, app: str, hosts: list[str]) -> None:
        async with self.locks.app(app):
            await self._finish_add(app, hosts, _quiet)

    async def _carry_on(self, what: str, work: Coroutine[Any, Any, object]) -> None:
        try:
            await work
        except OperationError as exc:
            log.warning("boot: %s: %s", what, exc.message)

    def _finish_orphans(self) -> None:
        """End the operations whose instance is gone (a removal that crashed after its
        records were deleted, or a destroy's own operation): no reconciler pass sees
        them. A removal or destroy whose instance is gone did what it was for."""
        for op_id in self.store.unfinished_operations():
            op = self.store.get_operation(op_id)
            if op is None or op.terminal or op.id in self.locks.live_ops:
                continue
            done = op.kind in (OpKind.REMOVE_INSTANCE, OpKind.DESTROY) and (
                op.instance != APP_SCOPE or self.store.get_app(op.app) is None)
            for step in op.steps:
                if step.state is StepState.PENDING:
                    self.store.finish_step(
                        op.id, step.seq, StepState.SUCCEEDED if done else StepState.FAILED,
                        detail="its records are gone" if done else None,
                        error=None if done else "interrupted by a control-plane crash")
            fresh = self.store.get_operation(op.id) or op
            self.store.finish_operation(
                fresh, OpState.SUCCEEDED if done else OpState.FAILED,
                error=None if done else "interrupted by a control-plane crash")


# -- plans -------------------------------------------------------------------------------

@dataclass(frozen=True)
class AddRequest:
    app: str
    hosts: tuple[str, ...]
    parked: bool = False


def plan_add(store: Store, request: AddRequest) -> Plan:
    """The steps of `instances add` (reads only): one LAY_DOWN for every host, then,
    unless they are added parked, each one started on the app's current release if it
    has one (delegated: an attempt of its own per instance)."""
    hosts = request.hosts
    steps = [PlannedStep(StepKind.LAY_DOWN, f"lay down {len(hosts)} instances: data dir, "
                         "empty database, env file with a minted key",
                         before=("laydown.before",), after=("laydown.after",),
                         detail=f"{len(hosts)} instances")]
    releases = store.list_releases(request.app)
    if releases and not request.parked:
        number = max(r.number for r in releases)
        steps += [PlannedStep(StepKind.SPAWN, f"start {host} on v{number} (an attempt of "
                              "its own)", delegated=True) for host in hosts]
    return Plan(tuple(steps))


@dataclass(frozen=True)
class RemoveRequest:
    host: str
    removal: Removal
    # Whether this box keeps replicas and snapshots (what a purge deletes there).
    replicas: bool
    objects: bool


def plan_remove(store: Store, request: RemoveRequest) -> Plan:
    """The steps of removing `request.host` (reads only): WITHDRAW, a STOP per live
    generation, the purge when asked (data dir and env file, the replica, the
    snapshots), FORGET. The same for each instance of `apps destroy`."""
    host = request.host
    steps = [PlannedStep(StepKind.WITHDRAW, f"{host} stopped and its routes gated, then "
                         "published", before=("remove.withdraw.before",),
                         after=("remove.withdraw.after",))]
    steps += [PlannedStep(StepKind.STOP, f"stop {gen.service} generation {gen.id}, proven "
                          "gone", service=gen.service, before_gen=gen.id,
                          before=("remove.stop.before",), after=("remove.stop.after",))
              for gen in store.live_generations(host)]
    if request.removal is Removal.PURGE_DATA:
        steps.append(PlannedStep(StepKind.PURGE_DATA, f"remove {host}'s data dir and env "
                                 "file", before=("remove.purge.before",),
                                 after=("remove.purge.after",)))
        if request.replicas:
            steps.append(PlannedStep(StepKind.PURGE_REPLICA, f"delete {host}'s replica",
                                     before=("remove.purge-replica.before",),
                                     after=("remove.purge-replica.after",)))
        if request.objects:
            steps.append(PlannedStep(StepKind.PURGE_SNAPSHOTS, f"delete {host}'s "
                                     "snapshots", before=("remove.purge-snapshots.before",),
                                     after=("remove.purge-snapshots.after",)))
    steps.append(PlannedStep(StepKind.FORGET, f"forget {host}'s records",
                             before=("remove.forget.before",), after=("remove.forget.after",),
                             detail=f"instance {host}"))
    return Plan(tuple(steps))


def plan_forget_app(name: str) -> Plan:
    """The app's own operation of `apps destroy`, once its instances are removed."""
    return Plan((
        PlannedStep(StepKind.REMOVE_BUILDS, f"remove {name}'s staged builds",
                    before=("destroy.builds.before",), after=("destroy.builds.after",)),
        PlannedStep(StepKind.FORGET, f"forget app {name}", before=("destroy.forget.before",),
                    after=("destroy.forget.after",), detail=f"app {name}")))


def plan_destroy(store: Store, name: str, removal: Removal, *, replicas: bool,
                 objects: bool) -> list[tuple[str, Plan]]:
    """`apps destroy` (reads only): each instance's removal, then the app's own
    operation (under APP_SCOPE), in the order they run."""
    plans = [(inst.host, plan_remove(store, RemoveRequest(inst.host, removal, replicas,
                                                          objects)))
             for inst in store.list_instances(name)]
    return [*plans, (APP_SCOPE, plan_forget_app(name))]
