"""Operations on instances: deploy, config, rollback, restart, stop, start.

A part beside `Recovery` (which converges an instance and respawns what ACTIVE names),
`Journaled` (the journal's edges) and `Locks`, wired together in keelway/api/daemon.py.
Every operation runs under its instance's lock, after reconciliation (a failed-closed
instance refuses it), as a journaled operation whose steps are written before their
effects. A rollout (deploy, config, rollback) first bumps the schedule revision of
every instance it targets, so an older attempt still in flight stands down at its next
check; then it goes instance by instance, the first one being the canary, and halts at
the first instance that does not end DONE, leaving the rest on what they run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from keelway import failpoints, names
from keelway.builds.manifest import Mode
from keelway.deploy import targets
from keelway.deploy.attempt import Attempt
from keelway.deploy.errors import AppFailed, NotFoundError, OperationError, UserError
from keelway.deploy.fences import refuse_if_fenced
from keelway.deploy.instances import lay_down_step
from keelway.deploy.outcome import Outcome, Progress, Result
from keelway.deploy.part import Part
from keelway.deploy.steps import Done, Failed, Steps
from keelway.deploy.targets import Target
from keelway.journal import REPLICA, Cause, OpKind, StepKind
from keelway.reconcile.plan import Pass
from keelway.store import StaleSchedule
from keelway.store.lifecycle import InstanceState
from keelway.store.records import Generation, Instance, Operation, ReleaseDraft

failpoints.declare("defer.before", "defer.after",
                   "service.out.before", "service.out.after", "service.in.before",
                   "service.in.after")


def _quiet(_message: str) -> None:
    pass


@dataclass(frozen=True)
class Intent:
    """A rollout as asked (deploy, config, rollback), before anything is scheduled:
    the build and config to release, to which hosts in order (the first is the canary),
    and how the request is reported and keyed."""

    app: str
    kind: OpKind
    cause: Cause
    build_digest: str
    build_path: Path
    config: Mapping[str, str]
    description: str
    hosts: tuple[str, ...]
    progress: Progress
    key: str | None
    request_digest: str | None
    mode: Mode | None = None


@dataclass(frozen=True)
class Rollout:
    """A rollout's state as its attempts need it: the target every instance moves to,
    the schedule revision each attempt holds, the release still to be written (None once
    the first instance wrote it, and for a restart, which writes none), and the
    request's key, digest and progress. A restart is a rollout of one instance."""

    app: str
    kind: OpKind
    cause: Cause
    target: Target
    revisions: Mapping[str, int]
    release: ReleaseDraft | None
    progress: Progress
    key: str | None
    request_digest: str | None


@dataclass
class InstanceResult:
    host: str
    release: int
    outcome: str
    generations: dict[str, int] = field(default_factory=dict)


class Deployer(Part):
    """The operations users ask for: deploy, config, rollback, restart, stop, start."""

    # -- validation ------------------------------------------------------------------

    def validate_hosts(self, app: str, hosts: list[str]) -> None:
        """Refuse bad or foreign hostnames before anything is staged or written."""
        for host in hosts:
            try:
                names.HOST.check(host)
            except names.InvalidName as exc:
                raise UserError(exc.message, hint=exc.hint) from None
            claim = self.store.claim(host)
            if claim is not None and claim.alias:
                raise UserError(f"{host} is {claim.describe()}, not an instance",
                                hint=f"deploy to {claim.instance}, which it serves")
            if claim is not None and claim.app != app:
                raise UserError(f"{host} already belongs to app {claim.app}",
                                hint=f"pick another host, or remove it from {claim.app}")

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
                     mode: Mode | None = None,
                     source: dict[str, str] | None = None) -> list[InstanceResult]:
        """Release a staged build to every instance of `app` (and to new `hosts`);
        `source` says where the build was staged from (`keelway releases` shows it)."""
        try:
            names.APP.check(app)
        except names.InvalidName as exc:
            raise UserError(exc.message, hint=exc.hint) from None
        known = [i.host for i in self.store.list_instances(app)]
        targets = known + [h for h in hosts if h not in known] or [f"{app}.localhost"]
        self.validate_hosts(app, [h for h in targets if h not in known])
        self.store.ensure_app(app)
        for host in targets:
            self.store.ensure_instance(host, app)
        self.store.record_build(app, build_digest, str(build_path), source)
        app_record = self.store.get_app(app)
        config = dict(app_record.config) if app_record else {}
        return await self._rollout(Intent(
            app, OpKind.DEPLOY, Cause.RELEASE, build_digest, build_path, config,
            f"Deploy {build_digest[:12]}", tuple(targets), progress, key, request_digest,
            mode))

    async def set_config(self, app: str, changes: dict[str, str | None],
                         progress: Progress = _quiet, key: str | None = None,
                         request_digest: str | None = None) -> list[InstanceResult]:
        """A new release with changed config vars (None unsets); restarts per mode."""
        config = self.new_config(app, changes)
        app_record = self.store.get_app(app)
        if app_record is not None and not self.store.list_releases(app):
            # `apps create`, then config before the first deploy: nothing runs yet, so
            # there is nothing to roll out; the first deploy's release carries it.
            self.store.set_app_config(app_record, config)
            return []
        current = targets.current_release(self.store, app)
        changed = ", ".join(sorted(changes))
        verb = "Set" if all(v is not None for v in changes.values()) else "Update"
        return await self._rollout(Intent(
            app, OpKind.CONFIG, Cause.CONFIG, current.build_digest, current.build_path,
            config, f"{verb} {changed}", self._hosts(app), progress, key, request_digest))

    def new_config(self, app: str, changes: dict[str, str | None]) -> dict[str, str]:
        """`app`'s config with `changes` applied (None unsets), refused with a UserError
        unless the whole of it passes the config rules: every process carries all of it."""
        app_record = self.store.get_app(app)
        if app_record is None:
            raise NotFoundError(f"no app named {app}", hint="see `keelway apps`")
        config = dict(app_record.config)
        for name, value in changes.items():
            if value is None:
                config.pop(name, None)
            else:
                config[name] = value
        try:
            names.check_config(config)
        except names.InvalidName as exc:
            raise UserError(exc.message, hint=exc.hint) from None
        return config

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
        return await self._rollout(Intent(
            app, OpKind.ROLLBACK, Cause.RELEASE, chosen.build_digest, build,
            dict(chosen.config), f"Rollback to v{to}", self._hosts(app), progress, key,
            request_digest))

    def _hosts(self, app: str) -> tuple[str, ...]:
        return tuple(i.host for i in self.store.list_instances(app))

    async def _rollout(self, intent: Intent) -> list[InstanceResult]:
        # Scheduling comes first and outside every lock: a newer intent is what makes an
        # older attempt, still running, stand down at its next check.
        revs = {host: self.store.bump_schedule(host) for host in intent.hosts}
        async with self.locks.app(intent.app):
            number = self.store.next_release_number(intent.app)
            rollout = Rollout(
                intent.app, intent.kind, intent.cause,
                Target.load(intent.app, number, intent.build_digest, intent.build_path,
                            dict(intent.config), intent.mode),
                revs, ReleaseDraft(intent.app, intent.build_digest, dict(intent.config),
                                   intent.description),
                intent.progress, intent.key, intent.request_digest)
            results: list[InstanceResult] = []
            for host in intent.hosts:
                result = await self._attempt_on(rollout, host)
                if result.released:
                    # The first install wrote the release; the rest install that one.
                    rollout = dataclasses.replace(rollout, release=None)
                results.append(InstanceResult(host, number, _said(result),
                                              result.generations))
                if result.outcome is not Outcome.DONE:
                    raise AppFailed(
                        f"{host}: {result.reason}" + ("" if host == intent.hosts[-1] else
                                                      "; the rollout halted here"),
                        hint=f"see `keelway logs {intent.app} --instance {host}` and "
                             f"`keelway ops {intent.app}`")
            return results

    async def start_new(self, app: str, hosts: list[str],
                        progress: Progress = _quiet) -> list[InstanceResult]:
        """Start instances that run nothing yet on the app's current release, writing no
        new release (`instances add`, keelway/deploy/tenants.py). Each is an attempt of
        its own; one that fails leaves the others to start. The caller holds the app's
        lock."""
        target = targets.current_release(self.store, app)
        revs = {host: self.store.bump_schedule(host) for host in hosts}
        rollout = Rollout(app, OpKind.DEPLOY, Cause.RELEASE, target, revs, None, progress,
                          None, None)
        results = []
        for host in hosts:
            result = await self._attempt_on(rollout, host)
            results.append(InstanceResult(host, target.release, _said(result),
                                          result.generations))
        return results

    async def restart(self, app: str, host: str | None, progress: Progress = _quiet,
                      key: str | None = None,
                      request_digest: str | None = None) -> list[InstanceResult]:
        """New generations of what each instance runs now (overlap or hold per service)."""
        results = []
        for inst in self.instances_of(app, host):
            if inst.state is InstanceState.PARKED:
                # Nothing runs to restart; its next wake starts fresh processes anyway,
                # and a pending release is not to be replaced by what ran before.
                results.append(InstanceResult(inst.host, 0, "parked", {}))
                continue
            refuse_if_fenced(self.store, inst.host, "restart")
            target = targets.running_target(self.store, inst.host)
            if target is None:
                raise UserError(f"{inst.host} runs nothing to restart",
                                hint=f"deploy {app} first, or `keelway start {app}`")
            rev = self.store.bump_schedule(inst.host)
            result = await self._attempt_on(
                Rollout(app, OpKind.RESTART, Cause.RESTART, target, {inst.host: rev}, None,
                        progress, key, request_digest), inst.host)
            results.append(InstanceResult(inst.host, target.release, result.outcome.value,
                                          result.generations))
            if result.outcome is not Outcome.DONE:
                raise AppFailed(f"{inst.host}: {result.reason}",
                                hint=f"see `keelway logs {app} --instance {inst.host}`")
        return results

    async def _attempt_on(self, rollout: Rollout, host: str) -> Result:
        rev = rollout.revisions[host]
        async with self.locks.instance(host):
            await self.recovery.converge(host, Pass.MUTATION)
            inst = self.store.get_instance(host)
            if inst is None or inst.schedule_rev != rev:
                return Result(Outcome.SUPERSEDED, "superseded before it started")
            if inst.state is InstanceState.PARKED:
                return await self._defer(rollout, host, rev)
            refuse_if_fenced(self.store, host, rollout.kind.value)

            async def attempt(op: Operation) -> Result:
                await lay_down_step(self.store, self.home, op.id, host)
                return await Attempt(
                    store=self.store, home=self.home, supervisor=self.supervisor,
                    publisher=self.publisher, op=op, host=host, cause=rollout.cause,
                    target=rollout.target, rev=rev, release=rollout.release,
                    progress=rollout.progress).run()

            result = await self.journal.journaled(rollout.app, host, rollout.kind, attempt,
                                            key=rollout.key,
                                            request_digest=rollout.request_digest,
                                            schedule_rev=rev, converge_after=True)
            targets.link_current(self.store, self.home, host)
            return result

    async def _defer(self, rollout: Rollout, host: str, rev: int) -> Result:
        """A parked instance stays parked: the rollout's release is left pending for its
        next wake, which runs it as an attempt with the settle window and the fallback
        of `rollout.cause`. Nothing starts now; the caller holds the instance lock."""
        released = False

        async def defer(op: Operation) -> Result:
            nonlocal released

            async def pending() -> Done | Failed:
                nonlocal released
                try:
                    written = self.store.defer_release(
                        host, schedule_rev=rev, number=rollout.target.release,
                        cause=rollout.cause, release=rollout.release)
                except StaleSchedule:
                    return Failed("superseded by a newer operation before it was deferred")
                released = written is not None
                return Done(f"v{rollout.target.release}")

            failed = await Steps(self.store, op.id).run(StepKind.DEFER, pending,
                                                        before=("defer.before",),
                                                        after=("defer.after",))
            if failed is not None:
                return Result(Outcome.SUPERSEDED, failed.reason)
            rollout.progress(f"{host} is parked: v{rollout.target.release} starts at its "
                             "next wake")
            return Result(Outcome.DONE, "deferred to the next wake", released=released,
                          deferred=True)

        return await self.journal.journaled(rollout.app, host, rollout.kind, defer,
                                      key=rollout.key, request_digest=rollout.request_digest,
                                      schedule_rev=rev)

    # -- stop / start ----------------------------------------------------------------

    async def stop_instance(self, inst: Instance) -> None:
        """Take the instance out of service (STOPPED, route gated: 503), then stop every
        generation and prove it gone; ACTIVE stays, so start respawns what ran."""
        async with self.locks.instance(inst.host):
            await self.recovery.converge(inst.host, Pass.MUTATION)

            async def stop(op: Operation) -> Result:
                steps = Steps(self.store, op.id)

                async def out_of_service() -> Done:
                    if self.store.take_out_of_service(inst.host, InstanceState.STOPPED):
                        await self.publisher.publish()
                    return Done()

                await steps.run(StepKind.OUT_OF_SERVICE, out_of_service,
                                before=("service.out.before",), after=("service.out.after",))
                for gen in self.store.live_generations(inst.host):
                    if gen.service == REPLICA:
                        continue  # after the app, with a last sync (Recovery.keep_replica)
                    if (failed := await self._stop(steps, gen)) is not None:
                        raise OperationError(failed.reason,
                                             hint="the process is stuck in the kernel; "
                                                  "check `ps`")
                return Result(Outcome.DONE)

            result = await self.journal.journaled(inst.app, inst.host, OpKind.STOP, stop)
            if result.outcome is not Outcome.DONE:
                raise OperationError(result.reason or "stop failed")

    async def _stop(self, steps: Steps, gen: Generation) -> Failed | None:
        async def halt() -> Done | Failed:
            if await self.supervisor.stop(gen, targets.stop_grace_s(self.store, gen)):
                return Done()
            return Failed(f"generation {gen.id} (pid {gen.pid}) did not stop")

        return await steps.run(StepKind.STOP, halt, service=gen.service, before_gen=gen.id)

    async def start_instance(self, inst: Instance) -> None:
        """Put the instance back in service (RUNNING), then respawn what ACTIVE names and
        publish its route: the same path as a restart after a crash."""
        async with self.locks.instance(inst.host):
            await self.recovery.converge(inst.host, Pass.MUTATION)
            inst = self.store.get_instance(inst.host) or inst
            refuse_if_fenced(self.store, inst.host, "start")

            async def start(op: Operation) -> Result:
                async def in_service() -> Done:
                    current = self.store.get_instance(inst.host)
                    if current is None:
                        raise NotFoundError(f"no instance {inst.host}")
                    if current.state is not InstanceState.RUNNING:
                        self.store.set_instance_state(current, InstanceState.RUNNING)
                    return Done()

                await Steps(self.store, op.id).run(
                    StepKind.IN_SERVICE, in_service,
                    before=("service.in.before",), after=("service.in.after",))
                current = self.store.get_instance(inst.host) or inst
                return await self.recovery.respawn_active(op, current)

            result = await self.journal.journaled(inst.app, inst.host, OpKind.START, start)
            await self.recovery.converge(inst.host, Pass.MUTATION)
            targets.link_current(self.store, self.home, inst.host)
            if result.outcome is not Outcome.DONE:
                raise AppFailed(f"{inst.host}: {result.reason}",
                                hint=f"see `keelway logs {inst.app} --instance {inst.host}`")



def _said(result: Result) -> str:
    """An instance's outcome as a rollout reports it: `deferred` for a parked one."""
    return "deferred" if result.deferred else result.outcome.value
