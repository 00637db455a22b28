"""Instances: laid down whole, added (then started), removed, their own config.

Each operation on instances here is journaled, its effects run through `Steps` with a
failpoint before and after each one, and each is rolled forward after a crash, from a
durable intent written before its first effect:
- `instances add`: the records of every new instance in one write, each marked
  `adding` (the intent); then one LAY_DOWN step lays every instance's files down (data
  dir, an empty WAL database at KEELWAY_DB, the env file with a minted key: each of
  them idempotent), then, if the app has a release, each instance is started on it; the
  mark is cleared last. Crash anywhere: boot (`resume`) lays down and starts what is
  still marked.
- `instances remove` and each instance of `apps destroy` (keelway/deploy/apps.py): the
  intent `removing` written before the operation begins, then WITHDRAW (the instance
  STOPPED so nothing restarts it, its routes gated, in one write; then the router
  told), a STOP per generation (proven gone, SPEC §5.5: the records go only after),
  PURGE_DATA when asked, FORGET (the records, in one write). Crash anywhere: the
  reconciler finalizes the operation, and boot removes the instance again from its
  start, every step a no-op where already done.

Starting one generation of an instance is keelway/deploy/generation_start.py's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from keelway import failpoints, names
from keelway.builds.tree import remove_tree
from keelway.data.instance_db import lay_down_db
from keelway.data.objects import ObjectStore, ObjectStoreError, instance_prefix
from keelway.data.replicas import Replicas
from keelway.deploy import apps, targets
from keelway.deploy.errors import NotFoundError, OperationError, UserError, checked, refused_name
from keelway.deploy.locks import Locks
from keelway.deploy.operation import (
    Bound,
    EffectOf,
    Locking,
    Plan,
    PlannedStep,
    Runner,
    Spec,
)
from keelway.deploy.outcome import Outcome, Progress
from keelway.deploy.publisher import Publisher
from keelway.deploy.steps import Done, Failed, Steps
from keelway.home import Home
from keelway.journal import OpKind, StepKind
from keelway.reconcile.apply import end_interrupted
from keelway.reconcile.plan import Verdict, by_steps
from keelway.runtime.environment import ensure_instance_key
from keelway.runtime.supervisor import Supervisor
from keelway.store import NotFound, Store
from keelway.store.hosts import HostTaken
from keelway.store.lifecycle import InstanceState, OpState, Removal
from keelway.store.records import App, Instance, Operation

failpoints.declare("laydown.one.before", "laydown.one.after")
failpoints.declare(
    "laydown.before", "laydown.after",
    "remove.withdraw.before", "remove.withdraw.after",
    "remove.stop.before", "remove.stop.after",
    "remove.purge.before", "remove.purge.after",
    "remove.purge-replica.before", "remove.purge-replica.after",
    "remove.purge-snapshots.before", "remove.purge-snapshots.after",
    "remove.forget.before", "remove.forget.after",
    "adding.finish.before",
)

log = logging.getLogger("keelway.instances")

# Files are laid down in parallel: each is a few fsyncs, which wait on the disk.
LAY_DOWN_THREADS = 8


@dataclass(frozen=True)
class LaidDown:
    """What `lay_down` made of an instance's files (False: it was there already)."""

    database: bool
    key: bool


def lay_down(home: Home, instance: str) -> LaidDown:
    """An instance's files, whole, before anything of its app runs: its data dir (0700),
    an empty WAL database at KEELWAY_DB and its env file with a minted key.

    The one rule for every path that makes an instance (`deploy --host`, the implicit
    APP.localhost, `up --demo`, `instances add`): an app that opens KEELWAY_DB without
    creating it must find it there on its first start (issue 17). Each file is made only
    if missing, so a repeat after a crash anywhere ends the same and an instance's own
    database and key are never touched. Made as root where keelway runs as root; the
    spawn hands them to the instance's uid (keelway/runtime/identities.py)."""
    home.data_dir(instance).mkdir(mode=0o700, parents=True, exist_ok=True)
    database = lay_down_db(home.db_path(instance))
    key = ensure_instance_key(home.env_file(instance))
    return LaidDown(database, key)


async def lay_down_step(store: Store, home: Home, op_id: int, instance: str) -> None:
    """`lay_down` as an attempt's first step, journaled so a crash inside is seen; the
    next attempt or wake lays down again (a no-op for what is there)."""
    async def step() -> Done:
        made = lay_down(home, instance)
        parts = [name for name, new in (("database", made.database), ("key", made.key))
                 if new]
        return Done("made " + " and ".join(parts) if parts else "all there")

    await Steps(store, op_id).run(StepKind.LAY_DOWN, step, before=("laydown.one.before",),
                                  after=("laydown.one.after",))


# -- instances: looked up, checked ------------------------------------------------------

def named(store: Store, host: str) -> Instance:
    """The instance named `host`, its name checked first: the one instance lookup
    (UserError for a bad name; NotFoundError, saying so when `host` is an alias)."""
    checked(names.HOST, host)
    inst = store.instances.get_instance(host)
    if inst is None:
        claim = store.instances.claim(host)
        hint = (f"{host} is an alias of {claim.instance}" if claim is not None
                else "see `keelway instances list APP`")
        raise NotFoundError(f"no instance {host}", hint=hint)
    return inst


def of_app(store: Store, app: str, host: str) -> Instance:
    """Instance `host` of app `app` (NotFoundError if it is not one of its instances)."""
    apps.named(store, app)
    inst = store.instances.get_instance(host)
    if inst is None or inst.app != app:
        raise NotFoundError(f"{app} has no instance {host}",
                            hint=f"see `keelway instances list {app}`")
    return inst


def taken(exc: HostTaken) -> UserError:
    """A host that names something already, as the user hears it."""
    return UserError(str(exc), hint="a host names one instance or one alias; "
                     "see `keelway instances list` and `keelway domains list`")


def check_hosts(store: Store, hosts: Sequence[str]) -> None:
    """Every host valid, none given twice, none naming anything yet."""
    if not hosts:
        raise UserError("name at least one host")
    seen: set[str] = set()
    for host in hosts:
        checked(names.HOST, host)
        if host in seen:
            raise UserError(f"{host} is given twice")
        seen.add(host)
        claim = store.instances.claim(host)
        if claim is not None:
            raise taken(HostTaken(host, claim))


def checked_config(app: App, base: Mapping[str, str],
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
        raise refused_name(exc) from None
    return config


async def publish_pages(publisher: Publisher) -> None:
    """Publish for hosts with no route row, whose router page only says "not deployed
    yet" (keelway/deploy/publisher.py): nothing is routed by it, so a router that
    cannot be told now learns it from the next publish (its restart pushes the
    whole table) and the command does not fail for it."""
    try:
        await publisher.publish()
    except OperationError as exc:
        log.info("publishing the router's pages: %s", exc.message)


def _quiet(_message: str) -> None:
    pass


class StartedOn(Protocol):
    """An instance started on a release (keelway/deploy/deployer.py InstanceResult)."""

    @property
    def host(self) -> str: ...

    @property
    def release(self) -> int: ...

    @property
    def outcome(self) -> str: ...


class Starter(Protocol):
    """What starts instances on the app's release: keelway/deploy/deployer.py
    `Deployer`, a part above this module (it starts through this module's start path),
    so it is handed in, never imported."""

    async def start_new(self, app: str, hosts: list[str],
                        progress: Progress = ...) -> Sequence[StartedOn]: ...

    async def restart(self, app: str, host: str | None,
                      progress: Progress = ...) -> Sequence[StartedOn]: ...


@dataclass(frozen=True)
class Added:
    instances: list[Instance]
    started: Sequence[StartedOn]


@dataclass(eq=False)
class Instances:
    store: Store
    home: Home
    supervisor: Supervisor
    publisher: Publisher
    locks: Locks
    runner: Runner
    starter: Starter
    replicas: Replicas | None = None
    objects: ObjectStore | None = None

    async def add_instances(self, app_name: str, hosts: Sequence[str],
                            config: Mapping[str, str], progress: Progress = _quiet,
                            parked: bool = False) -> Added:
        """Lay new instances down whole (records in one write, then their files), then
        start them on the app's current release if it has one. Bad input changes
        nothing: every host and the config are checked first, and the records are
        written all or none.

        `parked`: recorded PARKED with parked routes, the app's current release (if any)
        deferred to each one's first wake; nothing is started here, so adding 10,000
        idle instances costs records and files only."""
        app = apps.named(self.store, app_name)
        check_hosts(self.store, hosts)
        layered = checked_config(app, {}, dict(config))
        async with self.locks.app(app_name):
            instances: list[Instance] = []

            def record() -> None:
                instances.extend(self.store.instances.add_instances(
                    app_name, list(hosts), layered, parked=parked))

            try:
                # The records (each `adding`) and the operation that carries them on,
                # in one write: boot finds an interrupted add by its operation.
                op = self.store.begin_with(record, app_name, hosts[0], OpKind.ADD_INSTANCES,
                                           self.runner.owner)
            except HostTaken as exc:
                raise taken(exc) from None
            except NotFound:
                raise NotFoundError(f"no app named {app_name}") from None
            progress(f"recorded {len(instances)} instances")
            request = AddRequest(hosts[0], app_name, tuple(hosts), parked, progress=progress)
            await self._finish_add(request, op)
        return Added(instances, request.started)

    def plan_add_instances(self, app_name: str, hosts: Sequence[str],
                           config: Mapping[str, str], parked: bool = False) -> Plan:
        """The dry run of `instances add`: every check the add makes, then its plan.
        Nothing is changed."""
        app = apps.named(self.store, app_name)
        check_hosts(self.store, hosts)
        checked_config(app, {}, dict(config))
        return plan_add(self.store, AddRequest(hosts[0], app_name, tuple(hosts), parked))

    async def _finish_add(self, request: AddRequest, op: Operation) -> None:
        """Run `ADD` in `op` (begun with the records, or interrupted and carried on at
        boot), under the app lock the caller holds: LAY_DOWN for every host, then the
        starts (`_start_added`, attempts of their own) inside the operation, and its end
        clears the marks in the same write (`_added`). Crash anywhere: the operation is
        interrupted and boot carries it on (`recover_add`)."""
        ran = await self.runner.run(ADD, self, request, begun=op)
        if ran.result is not None and ran.result.outcome is not Outcome.DONE:
            raise OperationError(f"laying down the instances failed: {ran.result.reason}",
                                 hint="the instances are recorded; a deploy lays them down "
                                      "again, or remove them with `instances remove`")

    async def start_added(self, request: AddRequest) -> None:
        """Once laid down: each instance that runs nothing yet and is not parked started
        on the app's release (an attempt of its own; after a crash past a start, that
        start counts; a parked instance starts at its first wake), then published."""
        app, hosts = request.app, list(request.hosts)
        request.progress(f"laid down {len(hosts)} instances")
        idle = [host for host in hosts if not self.store.generations.list_active(host)
                and (inst := self.store.instances.get_instance(host)) is not None
                and inst.state is InstanceState.RUNNING]
        released = bool(self.store.builds.list_releases(app))
        if idle and released:
            request.started.extend(await self.starter.start_new(app, idle, request.progress))
        if len(idle) < len(hosts):
            # Parked ones have parked routes: the router must hold their first request
            # and ask for the wake, not answer 404.
            await self.publisher.publish()
        elif not released:
            await publish_pages(self.publisher)
        failpoints.hit("adding.finish.before")

    async def recover_add(self, op: Operation) -> None:
        """At boot: an interrupted `instances add` carried on in its own operation, for
        every instance of its app still marked `adding` (laid down again, each file
        made only if missing; started if it runs nothing), the marks cleared as it
        ends. None marked: it ends as its journal says."""
        hosts = [i.host for i in self.store.instances.adding_instances() if i.app == op.app]
        if not hosts:
            end_interrupted(self.store, op, by_steps(op))
            return
        host = op.instance if op.instance in hosts else hosts[0]
        async with self.locks.app(op.app):
            await self._finish_add(AddRequest(host, op.app, tuple(hosts)), op)

    def lay_down_files(self, hosts: list[str]) -> int:
        def one(host: str) -> bool:
            return lay_down(self.home, host).database

        with ThreadPoolExecutor(LAY_DOWN_THREADS) as pool:
            return sum(pool.map(one, hosts))

    def plan_removal(self, app: str, host: str, removal: Removal) -> Plan:
        """The dry run of `instances remove`: its plan as it would run now."""
        of_app(self.store, app, host)
        return plan_remove(self.store, self._remove_request(host, removal))

    def removal_plan(self, host: str, removal: Removal) -> Plan:
        return plan_remove(self.store, self._remove_request(host, removal, OpKind.DESTROY))

    async def remove_instance(self, app: str, host: str, removal: Removal) -> None:
        of_app(self.store, app, host)
        await self._remove(REMOVE, host, removal)

    async def remove(self, inst: Instance, kind: OpKind, removal: Removal,
                     begun: Operation | None = None) -> None:
        """Remove `inst` as one instance of `apps destroy` (`DESTROY_ONE`), under the
        app lock its caller holds (in `begun`: its interrupted removal carried on)."""
        assert kind is OpKind.DESTROY
        await self._remove(DESTROY_ONE, inst.host, removal, begun)

    async def recover_removal(self, op: Operation) -> None:
        """At boot: an interrupted removal (or one instance of a destroy) carried on in
        its own operation from its `removing` mark, every step a no-op where done;
        one whose records are gone did what it was for."""
        inst = self.store.instances.get_instance(op.instance)
        if inst is None:
            end_interrupted(self.store, op, Verdict(OpState.SUCCEEDED), "its records are gone")
        elif inst.removing is None:
            end_interrupted(self.store, op, by_steps(op))
        else:
            spec = DESTROY_ONE if op.kind is OpKind.DESTROY else REMOVE
            await self._remove(spec, inst.host, Removal(inst.removing), op)

    async def _remove(self, spec: Spec[RemoveRequest, Instances], host: str,
                      removal: Removal, begun: Operation | None = None) -> None:
        inst = named(self.store, host)
        ran = await self.runner.run(spec, self, self._remove_request(host, removal, spec.kind),
                                    begun=begun)
        if ran.result is not None and ran.result.outcome is not Outcome.DONE:
            raise OperationError(f"removing {host}: {ran.result.reason}",
                                 hint=f"see `keelway ops {inst.app} --instance {host}`; "
                                      "removing it again carries on")

    @property
    def purges(self) -> Purges:
        return Purges(replica=self.replicas is not None, snapshots=self.objects is not None)

    def _remove_request(self, host: str, removal: Removal,
                        kind: OpKind = OpKind.REMOVE_INSTANCE) -> RemoveRequest:
        return RemoveRequest(host, removal, self.purges, kind)

    async def set_instance_config(self, app: str, host: str,
                                  changes: Mapping[str, str | None],
                                  progress: Progress = _quiet) -> Sequence[StartedOn]:
        """Change an instance's own config; it restarts (per mode) if it runs."""
        inst = of_app(self.store, app, host)
        config = checked_config(apps.named(self.store, app), inst.config, changes)
        async with self.locks.instance(host):
            current = self.store.instances.get_instance(host) or inst
            self.store.instances.set_instance_config(current, config)
        if targets.running_target(self.store, host) is None:
            return []
        return await self.starter.restart(app, host, progress)

    async def resume(self) -> None:
        """Every removal and add carried on from its mark alone, whatever its operation
        says (what a mark left by a keelway older than `Store.begin_with` needs; boot
        carries on each interrupted operation by its kind instead, `recover_add`,
        `recover_removal`)."""
        for inst in self.store.instances.removing_instances():
            await _carry_on(f"remove {inst.host}", self.remove_instance(
                inst.app, inst.host, Removal(inst.removing or Removal.KEEP_DATA)))
        pending: dict[str, list[str]] = {}
        for inst in self.store.instances.adding_instances():
            pending.setdefault(inst.app, []).append(inst.host)
        for name, hosts in sorted(pending.items()):
            await _carry_on(f"add {len(hosts)} instances of {name}",
                            self._carry_on_add(name, hosts))
        apps.finish_orphans(self.store, self.locks)

    async def _carry_on_add(self, app: str, hosts: list[str]) -> None:
        async with self.locks.app(app):
            await self.runner.run(ADD, self, AddRequest(hosts[0], app, tuple(hosts)))


async def _carry_on(what: str, work: Coroutine[Any, Any, object]) -> None:
    try:
        await work
    except OperationError as exc:
        log.warning("boot: %s: %s", what, exc.message)


# -- plans ----------------------------------------------------------------------------

@dataclass(frozen=True)
class AddRequest:
    host: str  # the first of `hosts`: its lock is taken, its name journaled
    app: str
    hosts: tuple[str, ...]
    parked: bool = False
    progress: Progress = field(default=_quiet, compare=False)
    # What the operation's starts started (`Instances.start_added`).
    started: list[StartedOn] = field(default_factory=list, compare=False)


def plan_add(store: Store, request: AddRequest) -> Plan:
    """The operation of `instances add` (reads only): one LAY_DOWN for every host. The
    starts that follow (unless the instances are added parked, or the app has no
    release) are attempts of their own, one per instance (keelway/deploy/deployer.py
    start_new), never steps of this operation."""
    hosts = request.hosts
    return Plan(OpKind.ADD_INSTANCES, request.app, request.host, (
        PlannedStep(StepKind.LAY_DOWN, f"lay down {len(hosts)} instances: data dir, empty "
                    "database, env file with a minted key", "lay-down",
                    before=("laydown.before",), after=("laydown.after",),
                    detail=f"{len(hosts)} instances"),))


def starts_after_add(store: Store, request: AddRequest) -> list[str]:
    """What `instances add` starts once its instances are laid down: each one on the
    app's current release, an attempt of its own (none when parked or unreleased)."""
    releases = store.builds.list_releases(request.app)
    if not releases or request.parked:
        return []
    number = max(r.number for r in releases)
    return [f"start {host} on v{number} (an attempt of its own)" for host in request.hosts]


def _lay_down(part: Instances, request: AddRequest, _step: PlannedStep) -> Bound:
    async def lay_down(_op: Operation) -> Done:
        hosts = list(request.hosts)
        made = await asyncio.to_thread(part.lay_down_files, hosts)
        return Done(f"{len(hosts)} instances; {made} databases made")

    return lay_down


async def _start_added(part: Instances, request: AddRequest, _op: Operation) -> None:
    # The starts are attempts of their own, each taking its instance's lock.
    async with part.runner.lent(request.host):
        await part.start_added(request)


def _added(part: Instances, request: AddRequest) -> None:
    part.store.instances.finish_adding(list(request.hosts))


async def _recover_add(part: Instances, op: Operation) -> None:
    await part.recover_add(op)


# Under the app lock its caller holds, the records just written (in the write that
# began it): nothing to converge. Its starts run inside it, and its end clears the
# `adding` marks, so a mark is exactly as long-lived as its operation.
ADD: Spec[AddRequest, Instances] = Spec(OpKind.ADD_INSTANCES, plan_add,
                                        {"lay-down": _lay_down}, converge_first=False,
                                        closing=_start_added, ending=_added,
                                        recover=_recover_add)


@dataclass(frozen=True)
class Purges:
    """What a purge deletes beyond the data dir: whether this box keeps replicas and
    snapshots of its instances."""

    replica: bool
    snapshots: bool


@dataclass(frozen=True)
class RemoveRequest:
    host: str
    removal: Removal
    purges: Purges
    kind: OpKind = OpKind.REMOVE_INSTANCE  # or DESTROY: one instance of `apps destroy`


def plan_remove(store: Store, request: RemoveRequest) -> Plan:
    """The steps of removing `request.host` (reads only): WITHDRAW, a STOP per live
    generation, the purge when asked (data dir and env file, the replica, the
    snapshots), FORGET. The same for each instance of `apps destroy`."""
    host = request.host
    inst = named(store, host)
    steps = [PlannedStep(StepKind.WITHDRAW, f"{host} stopped and its routes gated, then "
                         "published", "withdraw", before=("remove.withdraw.before",),
                         after=("remove.withdraw.after",))]
    steps += [PlannedStep(StepKind.STOP, f"stop {gen.service} generation {gen.id}, proven "
                          "gone", "stop", service=gen.service, before_gen=gen.id,
                          before=("remove.stop.before",), after=("remove.stop.after",))
              for gen in store.generations.live_generations(host)]
    if request.removal is Removal.PURGE_DATA:
        steps.append(PlannedStep(StepKind.PURGE_DATA, f"remove {host}'s data dir and env "
                                 "file", "purge", before=("remove.purge.before",),
                                 after=("remove.purge.after",)))
        if request.purges.replica:
            steps.append(PlannedStep(StepKind.PURGE_REPLICA, f"delete {host}'s replica",
                                     "purge-replica", before=("remove.purge-replica.before",),
                                     after=("remove.purge-replica.after",)))
        if request.purges.snapshots:
            steps.append(PlannedStep(StepKind.PURGE_SNAPSHOTS, f"delete {host}'s "
                                     "snapshots", "purge-snapshots",
                                     before=("remove.purge-snapshots.before",),
                                     after=("remove.purge-snapshots.after",)))
    steps.append(PlannedStep(StepKind.FORGET, f"forget {host}'s records", "forget",
                             before=("remove.forget.before",), after=("remove.forget.after",),
                             detail=f"instance {host}"))
    return Plan(request.kind, inst.app, host, tuple(steps))


def _withdraw(part: Instances, request: RemoveRequest, _step: PlannedStep) -> Bound:
    async def withdraw(_op: Operation) -> Done:
        if part.store.instances.withdraw_instance(request.host, request.removal):
            await part.publisher.publish()
        return Done("stopped; routes gated")

    return withdraw


def _stop(part: Instances, _request: RemoveRequest, step: PlannedStep) -> Bound:
    gen_id = step.before_gen or 0

    async def stop(_op: Operation) -> Done | Failed:
        current = part.store.generations.get_generation(gen_id)
        if current is None or await part.supervisor.stop(
                current, targets.stop_grace_s(part.store, current)):
            return Done("gone")
        pid = part.store.local.presence(gen_id).pid
        return Failed(f"generation {gen_id} (pid {pid}) did not stop")

    return stop


def _unlink_current(part: Instances, host: str) -> None:
    # Every process is proven gone: what `current` links to is derived, and it goes
    # with the records, data or not (idempotent).
    part.home.current_link(host).unlink(missing_ok=True)


def _purge(part: Instances, request: RemoveRequest, _step: PlannedStep) -> Bound:
    host = request.host

    async def purge(_op: Operation) -> Done:
        _unlink_current(part, host)
        await asyncio.to_thread(remove_tree, part.home.data_dir(host))
        part.home.env_file(host).unlink(missing_ok=True)
        return Done("data dir and env file removed")

    return purge


def _purge_replica(part: Instances, request: RemoveRequest, _step: PlannedStep) -> Bound:
    """What the object store keeps of the host goes with its data (SPEC §5.7): its
    replica (its seed imports' under it). Its processes are proven gone, so nothing
    replicates there any more. A failure fails the removal, which carries on from
    here when run again."""
    def delete() -> Awaitable[int]:
        assert part.replicas is not None
        return part.replicas.delete(request.host)

    return _deleting_objects(f"the replica of {request.host}", delete)


def _purge_snapshots(part: Instances, request: RemoveRequest, _step: PlannedStep) -> Bound:
    def delete() -> Awaitable[int]:
        assert part.objects is not None
        return asyncio.to_thread(part.objects.delete_prefix, instance_prefix(request.host))

    return _deleting_objects(f"the snapshots of {request.host}", delete)


def _deleting_objects(what: str, delete: Callable[[], Awaitable[int]]) -> Bound:
    """A purge of objects: an object store that fails fails the step (and the removal,
    which carries on from here when run again); the count is the step's detail."""

    async def purge_objects(_op: Operation) -> Done | Failed:
        try:
            count = await delete()
        except ObjectStoreError as exc:
            return Failed(f"{what} could not be deleted: {exc}")
        return Done(f"{count} objects")

    return purge_objects


def _forget(part: Instances, request: RemoveRequest, _step: PlannedStep) -> Bound:
    host = request.host

    async def forget(_op: Operation) -> Done:
        _unlink_current(part, host)
        part.store.instances.forget_instance(host)
        # The router drops the gated rows too: the host is unknown again (404).
        await part.publisher.publish()
        return Done(f"instance {host}")

    return forget


def _removing(part: Instances, request: RemoveRequest) -> None:
    # The intent, in the write that begins the operation, after convergence (failed
    # closed refuses): a crash from here on is carried on by the next boot
    # (`recover_removal`; a destroy's by keelway/deploy/apps.py `recover_destroy`).
    inst = part.store.instances.get_instance(request.host)
    if request.kind is OpKind.DESTROY and inst is not None:
        part.store.apps.mark_destroying(inst.app, request.removal)
    part.store.instances.mark_removing(request.host, request.removal)


async def _recover_removal(part: Instances, op: Operation) -> None:
    await part.recover_removal(op)


_REMOVAL: dict[str, EffectOf[Instances, RemoveRequest]] = {
    "withdraw": _withdraw, "stop": _stop, "purge": _purge, "purge-replica": _purge_replica,
    "purge-snapshots": _purge_snapshots, "forget": _forget}
# `instances remove`: under its app's lock and its own; boot carries an interrupted one
# on (`recover_removal`).
REMOVE: Spec[RemoveRequest, Instances] = Spec(OpKind.REMOVE_INSTANCE, plan_remove, _REMOVAL,
                                              locks=Locking.APP, intent=_removing,
                                              recover=_recover_removal)
# One instance of `apps destroy`, under the app lock the destroy holds; its kind's
# recovery is the destroy's (keelway/deploy/apps.py FORGET_APP).
DESTROY_ONE: Spec[RemoveRequest, Instances] = Spec(OpKind.DESTROY, plan_remove, _REMOVAL,
                                                   intent=_removing)
