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
from keelway.deploy import targets
from keelway.deploy.crash_restarts import CrashRestarts
from keelway.deploy.deployer import Deployer, InstanceResult
from keelway.deploy.errors import NotFoundError, OperationError, UserError
from keelway.deploy.instances import lay_down
from keelway.deploy.locks import Locks
from keelway.deploy.operation import Runner
from keelway.deploy.outcome import Outcome, Progress, Result
from keelway.deploy.passes import Passes
from keelway.deploy.publisher import Publisher
from keelway.deploy.replica_keeper import ReplicaKeeper
from keelway.deploy.steps import Done, Failed, Steps
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


class Tenants:
    def __init__(self, store: Store, home: Home, supervisor: Supervisor, publisher: Publisher,
                 locks: Locks, passes: Passes, restarts: CrashRestarts,
                 keeper: ReplicaKeeper, runner: Runner, deployer: Deployer,
                 replicas: Replicas | None = None, objects: ObjectStore | None = None) -> None:
        self.store = store
        self.home = home
        self.supervisor = supervisor
        self.publisher = publisher
        self.locks = locks
        self.passes = passes
        self.restarts = restarts
        self.keeper = keeper
        self.journal = runner
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
        app = self.store.apps.get_app(name)
        if app is None or app.destroying is not None:
            raise NotFoundError(f"no app named {name}", hint="see `keelway apps`")
        return app

    def instance_of(self, app: str, host: str) -> Instance:
        self.app(app)
        inst = self.store.instances.get_instance(host)
        if inst is None or inst.app != app:
            raise NotFoundError(f"{app} has no instance {host}",
                                hint=f"see `keelway instances list {app}`")
        return inst

    def instance(self, host: str) -> Instance:
        inst = self.store.instances.get_instance(host)
        if inst is None:
            claim = self.store.instances.claim(host)
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
            claim = self.store.instances.claim(host)
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
            return self.store.apps.create_app(name)
        except Conflict:
            raise UserError(f"an app named {name} exists already",
                            hint=f"see `keelway status {name}`") from None

    async def destroy_app(self, name: str, removal: Removal) -> list[str]:
        """Remove every instance of the app (processes proven gone, routes withdrawn,
        records deleted; data kept unless `removal` purges it), then its builds and
        records, so the name can be used again. Returns the hosts removed."""
        app = self.store.apps.get_app(name)
        if app is None:
            raise NotFoundError(f"no app named {name}", hint="see `keelway apps`")
        async with self.locks.app(name):
            self.store.apps.mark_destroying(name, removal)  # the intent, before any effect
            app = self.store.apps.get_app(name) or app
            removal = Removal(app.destroying or removal)
            removed = []
            for inst in self.store.instances.list_instances(name):
                await self._remove(inst, OpKind.DESTROY, removal)
                removed.append(inst.host)
            await self._forget_app(name)
        return removed

    async def _forget_app(self, name: str) -> None:
        async def work(op: Operation) -> Result:
            steps = Steps(self.store, op.id)

            async def remove_builds() -> Done:
                staged = builds_gc.staged_builds(self.home.builds_dir)
                keep = {build for build in staged if build[0] != name}
                gone = await asyncio.to_thread(builds_gc.collect, self.home.builds_dir, keep)
                return Done(f"{len(gone)} builds removed")

            async def forget() -> Done:
                self.store.apps.forget_app(name)
                return Done(f"app {name}")

            await steps.run(StepKind.REMOVE_BUILDS, remove_builds,
                            before=("destroy.builds.before",), after=("destroy.builds.after",))
            await steps.run(StepKind.FORGET, forget, before=("destroy.forget.before",),
                            after=("destroy.forget.after",), detail=f"app {name}")
            return Result(Outcome.DONE)

        async with self.locks.instance(APP_SCOPE):
            result = await self.journal.journaled(name, APP_SCOPE, OpKind.DESTROY, work)
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
                instances = self.store.instances.add_instances(app_name, list(hosts), layered,
                                                               parked=parked)
            except HostTaken as exc:
                raise _taken(exc) from None
            except NotFound:
                raise NotFoundError(f"no app named {app_name}") from None
            progress(f"recorded {len(instances)} instances")
            started = await self._finish_add(app_name, list(hosts), progress)
        return Added(instances, started)

    async def _finish_add(self, app: str, hosts: list[str],
                          progress: Progress) -> list[InstanceResult]:
        await self._lay_down(app, hosts)
        progress(f"laid down {len(hosts)} instances")
        started: list[InstanceResult] = []
        # Only what runs nothing yet and is not parked: after a crash past a start, that
        # start counts; a parked instance starts at its first wake.
        idle = [host for host in hosts if not self.store.generations.list_active(host)
                and (inst := self.store.instances.get_instance(host)) is not None
                and inst.state is InstanceState.RUNNING]
        released = bool(self.store.builds.list_releases(app))
        if idle and released:
            started = await self.deployer.start_new(app, idle, progress)
        if len(idle) < len(hosts):
            # Parked ones have parked routes: the router must hold their first request
            # and ask for the wake, not answer 404.
            await self.publisher.publish()
        elif not released:
            await self._publish_pages()
        failpoints.hit("adding.finish.before")
        self.store.instances.finish_adding(hosts)
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
        async def work(op: Operation) -> Result:
            async def lay_down() -> Done:
                made = await asyncio.to_thread(self._lay_down_files, hosts)
                return Done(f"{len(hosts)} instances; {made} databases made")

            await Steps(self.store, op.id).run(
                StepKind.LAY_DOWN, lay_down, before=("laydown.before",),
                after=("laydown.after",), detail=f"{len(hosts)} instances")
            return Result(Outcome.DONE)

        first = hosts[0]
        async with self.locks.instance(first):
            result = await self.journal.journaled(app, first, OpKind.ADD_INSTANCES, work)
        if result.outcome is not Outcome.DONE:
            raise OperationError(f"laying down the instances failed: {result.reason}",
                                 hint="the instances are recorded; `keelway up` lays them "
                                      "down again, or remove them with `instances remove`")

    def _lay_down_files(self, hosts: list[str]) -> int:
        def one(host: str) -> bool:
            return lay_down(self.home, host).database

        with ThreadPoolExecutor(LAY_DOWN_THREADS) as pool:
            return sum(pool.map(one, hosts))

    async def remove_instance(self, app: str, host: str, removal: Removal) -> None:
        inst = self.instance_of(app, host)
        async with self.locks.app(app):
            await self._remove(inst, OpKind.REMOVE_INSTANCE, removal)

    async def _remove(self, inst: Instance, kind: OpKind, removal: Removal) -> None:
        host = inst.host
        async with self.locks.instance(host):
            await self.passes.converge(host, Pass.MUTATION)  # failed closed refuses
            # The intent first: a crash from here on is carried on by the next boot.
            self.store.instances.mark_removing(host, removal)
            result = await self.journal.journaled(
                inst.app, host, kind, lambda op: self._removal_steps(op, host, removal))
        if result.outcome is not Outcome.DONE:
            raise OperationError(f"removing {host}: {result.reason}",
                                 hint=f"see `keelway ops {inst.app} --instance {host}`; "
                                      "removing it again carries on")

    async def _removal_steps(self, op: Operation, host: str, removal: Removal) -> Result:
        steps = Steps(self.store, op.id)

        async def withdraw() -> Done:
            if self.store.instances.withdraw_instance(host, removal):
                await self.publisher.publish()
            return Done("stopped; routes gated")

        await steps.run(StepKind.WITHDRAW, withdraw, before=("remove.withdraw.before",),
                        after=("remove.withdraw.after",))
        for gen in self.store.generations.live_generations(host):
            async def stop(gen_id: int = gen.id) -> Done | Failed:
                current = self.store.generations.get_generation(gen_id)
                if current is None or await self.supervisor.stop(
                        current, targets.stop_grace_s(self.store, current)):
                    return Done("gone")
                return Failed(f"generation {gen_id} (pid {current.pid}) did not stop")

            failed = await steps.run(StepKind.STOP, stop, service=gen.service,
                                     before_gen=gen.id, before=("remove.stop.before",),
                                     after=("remove.stop.after",))
            if failed is not None:
                return Result(Outcome.FAILED, failed.reason)
        # What `current` links to is derived; it goes with the records, data or not.
        self.home.current_link(host).unlink(missing_ok=True)
        if removal is Removal.PURGE_DATA:
            async def purge() -> Done:
                await asyncio.to_thread(remove_tree, self.home.data_dir(host))
                self.home.env_file(host).unlink(missing_ok=True)
                return Done("data dir and env file removed")

            await steps.run(StepKind.PURGE_DATA, purge, before=("remove.purge.before",),
                            after=("remove.purge.after",))
            if (failed := await self._purge_stored(steps, host)) is not None:
                return Result(Outcome.FAILED, failed.reason)

        async def forget() -> Done:
            self.store.instances.forget_instance(host)
            # The router drops the gated rows too: the host is unknown again (404).
            await self.publisher.publish()
            return Done(f"instance {host}")

        await steps.run(StepKind.FORGET, forget, before=("remove.forget.before",),
                        after=("remove.forget.after",), detail=f"instance {host}")
        return Result(Outcome.DONE)

    async def _purge_stored(self, steps: Steps, host: str) -> Failed | None:
        """What the object store keeps of `host`: its replica (its seed imports' under
        it), then its snapshots; what `--purge-data` says goes with the data (SPEC §5.7).
        Its processes are proven gone, so nothing replicates there any more. A failure
        fails the removal, which carries on from here when run again."""
        replicas, objects = self.replicas, self.objects
        if replicas is not None:
            async def purge_replica() -> Done | Failed:
                try:
                    count = await replicas.delete(host)
                except ObjectStoreError as exc:
                    return Failed(f"the replica of {host} could not be deleted: {exc}")
                return Done(f"{count} objects")

            failed = await steps.run(StepKind.PURGE_REPLICA, purge_replica,
                                     before=("remove.purge-replica.before",),
                                     after=("remove.purge-replica.after",))
            if failed is not None:
                return failed
        if objects is not None:
            async def purge_snapshots() -> Done | Failed:
                try:
                    count = await asyncio.to_thread(objects.delete_prefix,
                                                    instance_prefix(host))
                except ObjectStoreError as exc:
                    return Failed(f"the snapshots of {host} could not be deleted: {exc}")
                return Done(f"{count} objects")

            return await steps.run(StepKind.PURGE_SNAPSHOTS, purge_snapshots,
                                   before=("remove.purge-snapshots.before",),
                                   after=("remove.purge-snapshots.after",))
        return None

    async def set_instance_config(self, app: str, host: str,
                                  changes: Mapping[str, str | None],
                                  progress: Progress = _quiet) -> list[InstanceResult]:
        """Change an instance's own config; it restarts (per mode) if it runs."""
        inst = self.instance_of(app, host)
        config = self.checked_config(self.app(app), inst.config, changes)
        async with self.locks.instance(host):
            current = self.store.instances.get_instance(host) or inst
            self.store.instances.set_instance_config(current, config)
        if targets.running_target(self.store, host) is None:
            return []
        return await self.deployer.restart(app, host, progress)

    # -- aliases -----------------------------------------------------------------------

    async def add_aliases(self, host: str, aliases: Sequence[str]) -> list[Alias]:
        inst = self.instance(host)
        self.check_hosts(aliases)
        async with self.locks.instance(inst.host):
            try:
                found = self.store.instances.add_aliases(inst.host, list(aliases))
            except HostTaken as exc:
                raise _taken(exc) from None
            if self.store.routes.get_route(inst.host) is not None:
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
                found = self.store.instances.remove_aliases(inst.host, list(aliases))
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
        for app in self.store.apps.destroying_apps():
            await self._carry_on(f"destroy {app.name}",
                                 self.destroy_app(app.name, Removal(app.destroying
                                                                    or Removal.KEEP_DATA)))
        for inst in self.store.instances.removing_instances():
            await self._carry_on(f"remove {inst.host}", self.remove_instance(
                inst.app, inst.host, Removal(inst.removing or Removal.KEEP_DATA)))
        pending: dict[str, list[str]] = {}
        for inst in self.store.instances.adding_instances():
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
        for op_id in self.store.ops.unfinished_operations():
            op = self.store.ops.get_operation(op_id)
            if op is None or op.terminal or op.id in self.locks.live_ops:
                continue
            done = op.kind in (OpKind.REMOVE_INSTANCE, OpKind.DESTROY) and (
                op.instance != APP_SCOPE or self.store.apps.get_app(op.app) is None)
            for step in op.steps:
                if step.state is StepState.PENDING:
                    self.store.ops.finish_step(
                        op.id, step.seq, StepState.SUCCEEDED if done else StepState.FAILED,
                        detail="its records are gone" if done else None,
                        error=None if done else "interrupted by a control-plane crash")
            fresh = self.store.ops.get_operation(op.id) or op
            self.store.ops.finish_operation(
                fresh, OpState.SUCCEEDED if done else OpState.FAILED,
                error=None if done else "interrupted by a control-plane crash")
