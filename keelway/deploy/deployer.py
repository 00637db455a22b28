"""Operations on instances: deploy, config, rollback, restart, stop, start.

Each is a spec (keelway/deploy/operation.py) the one runner carries out: under its
instance's lock, after reconciliation (a failed-closed instance refuses it), as a
journaled operation whose steps are written before their effects. A rollout (deploy,
config, rollback) first bumps the schedule revision of every instance it targets, so an
older attempt still in flight stands down at its next check; then it goes instance by
instance, the first one being the canary, and halts at the first instance that does not
end DONE, leaving the rest on what they run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from keelway import failpoints, names
from keelway.builds.errors import ManifestError
from keelway.builds.manifest import Manifest, Mode, RolloutSpec, load_manifest, overlay_rollout
from keelway.builds.preview import BuildPreview
from keelway.deploy import targets
from keelway.deploy.attempt import Attempt
from keelway.deploy.crash_restarts import CrashRestarts
from keelway.deploy.deploy_plan import DeployPlan
from keelway.deploy.errors import (
    AppFailed,
    NotFoundError,
    OperationError,
    UserError,
    checked,
    refused_name,
)
from keelway.deploy.fences import refuse_if_fenced
from keelway.deploy.instances import lay_down_step
from keelway.deploy.locks import Locks
from keelway.deploy.operation import (
    Bound,
    Ended,
    Plan,
    PlannedStep,
    Ran,
    Runner,
    Spec,
    stop_generation,
    stop_steps,
)
from keelway.deploy.outcome import Outcome, Progress, Result
from keelway.deploy.plan import describe_step, fallback_of, plan_attempt
from keelway.deploy.publisher import Publisher
from keelway.deploy.rollouts import Rollouts, begin_rollout, on_release, settle_rolling
from keelway.deploy.rollouts import mark as mark_hosts
from keelway.deploy.rollouts import move as move_rollout
from keelway.deploy.steps import Done, Failed
from keelway.deploy.targets import Target
from keelway.home import Home
from keelway.journal import Cause, OpKind, StepKind
from keelway.runtime.supervisor import Supervisor
from keelway.store import Conflict, IllegalTransition, StaleSchedule, Store
from keelway.store.lifecycle import GenState, InstanceState, RolloutState
from keelway.store.records import Instance, Operation, ReleaseDraft
from keelway.store.rollouts import HostState, RolloutJournal

failpoints.declare("defer.before", "defer.after", "defer.batch.before", "defer.batch.after",
                   "service.out.before", "service.out.after", "service.in.before",
                   "service.in.after")


def _quiet(_message: str) -> None:
    pass


# How many parked instances' deferrals one write journals (`Deployer._defer_parked`): a
# thousand instances' worth in ten writes, and a turn of the event loop between two.
DEFER_BATCH = 100


log = logging.getLogger("keelway.deployer")


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
    # The build's manifest, read before it is staged (a dry-run deploy's); None: read
    # from `build_path`.
    manifest: Manifest | None = None


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


@dataclass(eq=False)
class Deployer:
    """The operations users ask for: deploy, config, rollback, restart, stop, start."""

    store: Store
    home: Home
    supervisor: Supervisor
    publisher: Publisher
    locks: Locks  # the app's lock around a rollout
    runner: Runner
    restarts: CrashRestarts  # a start respawns what ACTIVE names
    rollouts: Rollouts  # drives a release's cohorts, journaled
    # Rollouts a crash cut short, carried on in the background (kept: a task nothing
    # refers to may be collected before it ends).
    resuming: set[asyncio.Task[object]] = field(default_factory=set)

    # -- validation ------------------------------------------------------------------

    def validate_hosts(self, app: str, hosts: list[str]) -> None:
        """Refuse bad or foreign hostnames before anything is staged or written."""
        for host in hosts:
            checked(names.HOST, host)
            claim = self.store.instances.claim(host)
            if claim is not None and claim.alias:
                raise UserError(f"{host} is {claim.describe()}, not an instance",
                                hint=f"deploy to {claim.instance}, which it serves")
            if claim is not None and claim.app != app:
                raise UserError(f"{host} already belongs to app {claim.app}",
                                hint=f"pick another host, or remove it from {claim.app}")

    def instances_of(self, app: str, host: str | None) -> list[Instance]:
        return targets.instances_of(self.store, app, host)

    # -- rollouts --------------------------------------------------------------------

    async def deploy(self, app: str, build_digest: str, build_path: Path, hosts: list[str],
                     progress: Progress = _quiet, key: str | None = None,
                     request_digest: str | None = None,
                     mode: Mode | None = None,
                     source: dict[str, str] | None = None,
                     rollout: Mapping[str, str] | None = None) -> list[InstanceResult]:
        """Release a staged build to every instance of `app` (and to new `hosts`);
        `source` says where the build was staged from (`keelway releases` shows it);
        `rollout`, this release's own [rollout] keys."""
        every, _added = self._deploy_hosts(app, hosts)
        self.store.apps.ensure_app(app)
        for host in every:
            self.store.instances.ensure_instance(host, app)
        self.store.builds.record_build(app, build_digest, str(build_path), source)
        return await self._rollout(self._deploy_intent(
            app, build_digest, build_path, every, progress, key, request_digest, mode), rollout)

    def dry_deploy(self, app: str, build: BuildPreview, hosts: list[str],
                   mode: Mode | None = None) -> DeployPlan:
        """What `deploy` of the build `build` previews would do now: the release it
        would write and each instance's plan, the ones it would add planned as the
        deploy plans them once added. Reads only; refuses what `deploy` refuses (a bad
        name, a foreign host, a fenced running instance)."""
        every, added = self._deploy_hosts(app, hosts)
        intent = self._deploy_intent(app, build.digest, build.path, every, _quiet, None,
                                     None, mode, build.manifest)
        rollout = self._dry_scheduled(intent, added)
        return DeployPlan(build, rollout.target, tuple(added),
                          self._dry_plans(rollout, every, added))

    def _deploy_hosts(self, app: str, hosts: list[str]) -> tuple[list[str], list[str]]:
        """The instances a deploy of `app` releases to, in order (its own, then the new
        `hosts`; with neither, `<app>.localhost`), and those of them it adds, checked."""
        checked(names.APP, app)
        known = [i.host for i in self.store.instances.list_instances(app)]
        every = known + [h for h in hosts if h not in known] or [f"{app}.localhost"]
        added = [h for h in every if h not in known]
        self.validate_hosts(app, added)
        return every, added

    def _deploy_intent(self, app: str, build_digest: str, build_path: Path,
                       hosts: list[str], progress: Progress, key: str | None,
                       request_digest: str | None, mode: Mode | None,
                       manifest: Manifest | None = None) -> Intent:
        app_record = self.store.apps.get_app(app)
        config = dict(app_record.config) if app_record else {}
        return Intent(app, OpKind.DEPLOY, Cause.RELEASE, build_digest, build_path, config,
                      f"Deploy {build_digest[:12]}", tuple(hosts), progress, key,
                      request_digest, mode, manifest)

    async def set_config(self, app: str, changes: dict[str, str | None],
                         progress: Progress = _quiet, key: str | None = None,
                         request_digest: str | None = None,
                         rollout: Mapping[str, str] | None = None) -> list[InstanceResult]:
        """A new release with changed config vars (None unsets); restarts per mode."""
        intent = self._config_intent(app, changes, progress, key, request_digest)
        if intent is None:
            # `apps create`, then config before the first deploy: nothing runs yet, so
            # there is nothing to roll out; the first deploy's release carries it.
            app_record = self.store.apps.get_app(app)
            assert app_record is not None
            self.store.apps.set_app_config(app_record, self.new_config(app, changes))
            return []
        return await self._rollout(intent, rollout)

    def dry_config(self, app: str, changes: dict[str, str | None]) -> list[Plan]:
        intent = self._config_intent(app, changes, _quiet, None, None)
        return [] if intent is None else self._dry_rollout(intent)

    def _config_intent(self, app: str, changes: dict[str, str | None], progress: Progress,
                       key: str | None, request_digest: str | None) -> Intent | None:
        config = self.new_config(app, changes)
        if not self.store.builds.list_releases(app):
            return None
        current = targets.current_release(self.store, app)
        changed = ", ".join(sorted(changes))
        verb = "Set" if all(v is not None for v in changes.values()) else "Update"
        return Intent(app, OpKind.CONFIG, Cause.CONFIG, current.build_digest,
                      current.build_path, config, f"{verb} {changed}", self._hosts(app),
                      progress, key, request_digest)

    def new_config(self, app: str, changes: dict[str, str | None]) -> dict[str, str]:
        """`app`'s config with `changes` applied (None unsets), refused with a UserError
        unless the whole of it passes the config rules: every process carries all of it."""
        app_record = self.store.apps.get_app(app)
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
            raise refused_name(exc) from None
        return config

    async def rollback(self, app: str, to: int | None, progress: Progress = _quiet,
                       key: str | None = None, request_digest: str | None = None,
                       rollout: Mapping[str, str] | None = None) -> list[InstanceResult]:
        """A new release with the build and config of an older one (default: the one
        before the latest)."""
        return await self._rollout(self._rollback_intent(app, to, progress, key,
                                                         request_digest), rollout)

    def dry_rollback(self, app: str, to: int | None) -> list[Plan]:
        return self._dry_rollout(self._rollback_intent(app, to, _quiet, None, None))

    def _rollback_intent(self, app: str, to: int | None, progress: Progress,
                         key: str | None, request_digest: str | None) -> Intent:
        releases = self.store.builds.list_releases(app)
        if self.store.apps.get_app(app) is None:
            raise NotFoundError(f"no app named {app}", hint="see `keelway apps`")
        if to is None:
            if len(releases) < 2:
                raise UserError(f"{app} has no earlier release to roll back to",
                                hint=f"see `keelway releases {app}`")
            to = releases[1].number
        if self.store.builds.get_release(app, to) is None:
            raise NotFoundError(f"{app} has no release v{to}",
                                hint=f"see `keelway releases {app}`")
        chosen = self._release_target(app, to)
        return Intent(app, OpKind.ROLLBACK, Cause.RELEASE, chosen.build_digest,
                      chosen.build_path, dict(chosen.config), f"Rollback to v{to}",
                      self._hosts(app), progress, key, request_digest,
                      manifest=chosen.manifest)

    def _hosts(self, app: str) -> tuple[str, ...]:
        return tuple(i.host for i in self.store.instances.list_instances(app))

    async def _rollout(self, intent: Intent,
                       overrides: Mapping[str, str] | None = None) -> list[InstanceResult]:
        """`intent` rolled out, `overrides` (its `--rollout KEY=VALUE`) over the app's
        [rollout]."""
        # Scheduling comes first and outside every lock: a newer intent is what makes an
        # older attempt, still running, stand down at its next check.
        revs = {host: self.store.instances.bump_schedule(host) for host in intent.hosts}
        async with self.locks.app(intent.app):
            rollout = self._scheduled(intent, revs)
            parked = [h for h in intent.hosts
                      if (inst := self.store.instances.get_instance(h)) is not None
                      and inst.state is InstanceState.PARKED]
            awake = [h for h in intent.hosts if h not in parked]
            releases = self.store.builds.list_releases(intent.app)
            spec = rollout_spec(rollout.target.manifest, overrides or {})
            journal = begin_rollout(self.store, intent.app, rollout.target.release,
                                    releases[0].number if releases else None, intent.kind,
                                    awake, parked, spec, overrides)
            return await self._drive(journal, rollout, spec)

    async def _drive(self, journal: RolloutJournal, rollout: Rollout,
                     spec: RolloutSpec) -> list[InstanceResult]:
        """Carry the journaled rollout on with `rollout`'s attempts (the app's lock
        held); its results by host, or AppFailed when it stopped short of done."""
        results: dict[str, InstanceResult] = {}
        now = rollout

        async def attempt(host: str) -> Result:
            nonlocal now
            taking = now
            result = await self._attempt_on(taking, host)
            if result.released:
                # The first install wrote the release; the rest install that one.
                now = dataclasses.replace(now, release=None)
            results[host] = InstanceResult(host, taking.target.release, _said(result),
                                           result.generations)
            return result

        async def defer(hosts: Sequence[str]) -> dict[str, Result]:
            deferred = await self._defer_parked(now, hosts)
            for host, result in deferred.items():
                results[host] = InstanceResult(host, now.target.release, _said(result), {})
            return deferred

        ended = await self.rollouts.drive(journal, spec, attempt,
                                          lambda: now.release is None, rollout.progress,
                                          defer)
        if ended.state is not RolloutState.DONE:
            raise AppFailed(
                f"{ended.reason or 'it stopped'}; the rollout is {ended.state.value}",
                hint=f"see `keelway rollout status {rollout.app}`, `keelway logs "
                     f"{rollout.app}` and `keelway ops {rollout.app}`")
        return [results[h.host] for h in ended.hosts if h.host in results]

    # -- a rollout by name: status, pause, resume, abort ------------------------------

    def rollout_of(self, app: str) -> RolloutJournal | None:
        """The app's latest rollout (None: it has had none)."""
        checked(names.APP, app)
        if self.store.apps.get_app(app) is None:
            raise NotFoundError(f"no app named {app}", hint="see `keelway apps`")
        return self.store.rollouts.latest_rollout(app)

    def pause_rollout(self, app: str) -> RolloutJournal:
        """A running rollout paused: the cohort under way finishes, no next one starts.
        Written at once, outside the app's lock the rollout holds: its driver reads it
        before each cohort (and while a bake waits for traffic)."""
        journal = self._open_rollout(app, (RolloutState.RUNNING,), "pause")
        try:
            return move_rollout(self.store, journal, RolloutState.PAUSED,
                                reason="paused by request")
        except (Conflict, IllegalTransition):
            raise UserError(f"{app}'s rollout moved meanwhile",
                            hint=f"see `keelway rollout status {app}`") from None

    async def resume_rollout(self, app: str,
                             progress: Progress = _quiet) -> list[InstanceResult]:
        """A halted or paused rollout carried on from where it stopped: its failed
        instances and the ones not begun are attempted, never one on the release."""
        async with self.locks.app(app):
            journal = self._open_rollout(app, (RolloutState.HALTED, RolloutState.PAUSED),
                                         "resume")
            rollout = self._resumable(journal, progress)
            failed = journal.in_state(HostState.FAILED)
            if failed:
                mark_hosts(self.store, journal.id, failed, HostState.PENDING)
            journal = settle_rolling(self.store, journal)
            # A cohort whose every instance took the release stopped on its figures (or
            # a pause): a person's resume goes on past them, to the next cohort.
            cohort = journal.cohort
            if cohort + 1 < len(journal.cohorts) and all(
                    h.state is HostState.ROLLED for h in journal.hosts if h.cohort == cohort):
                cohort += 1
            journal = move_rollout(self.store, journal, RolloutState.RUNNING, cohort=cohort,
                                   figures=journal.figures)
            return await self._drive(journal, rollout, self._spec_of(journal, rollout))

    async def abort_rollout(self, app: str,
                            progress: Progress = _quiet) -> list[InstanceResult]:
        """Every instance the rollout took to its release taken back to the release
        before it (no new release is written: the fleet is one release again), then the
        rollout ABORTED. A running one is paused first, by `rollout pause`."""
        async with self.locks.app(app):
            journal = self._open_rollout(app, (RolloutState.HALTED, RolloutState.PAUSED),
                                         "abort")
            previous = journal.previous
            if previous is None:
                raise UserError(f"release v{journal.release} of {app} is its first: there "
                                "is no release to go back to",
                                hint=f"stop it with `keelway stop {app}`")
            journal = settle_rolling(self.store, journal)
            back = self._release_target(app, previous)
            hosts = [h for h in journal.in_state(HostState.ROLLED, HostState.FAILED)
                     if on_release(self.store, h, journal.release)]
            revs = {host: self.store.instances.bump_schedule(host) for host in hosts}
            rollout = Rollout(app, OpKind.ROLLBACK, Cause.RELEASE, back, revs, None, progress,
                              None, None)
            results = []
            async for host, result, said in self._each(rollout, hosts):
                results.append(said)
                if result.outcome is not Outcome.DONE:
                    raise AppFailed(f"{host}: {result.reason}; the abort stopped here, "
                                    "the rollout is still "
                                    f"{journal.state.value}",
                                    hint=f"see `keelway logs {app} --instance {host}`")
                mark_hosts(self.store, journal.id, [host], HostState.REVERTED)
            fresh = self.store.rollouts.get_rollout(journal.id)
            assert fresh is not None
            move_rollout(self.store, fresh, RolloutState.ABORTED,
                         reason=f"aborted: back on v{previous}", figures=fresh.figures)
            return results

    def resume_interrupted(self) -> None:
        """After a crash: each rollout left RUNNING carried on in the background from
        where its journal stands (its cut-short attempts ended by the boot first)."""
        for journal in self.store.rollouts.running_rollouts():
            task = asyncio.get_running_loop().create_task(self._resume_after_crash(journal))
            self.resuming.add(task)
            task.add_done_callback(self.resuming.discard)

    async def _resume_after_crash(self, journal: RolloutJournal) -> object:
        try:
            async with self.locks.app(journal.app):
                fresh = self.store.rollouts.get_rollout(journal.id)
                if fresh is None or fresh.state is not RolloutState.RUNNING:
                    return None
                try:
                    rollout = self._resumable(fresh, _quiet)
                except OperationError as exc:
                    move_rollout(self.store, fresh, RolloutState.HALTED, reason=exc.message)
                    return None
                return await self._drive(settle_rolling(self.store, fresh), rollout,
                                         self._spec_of(fresh, rollout))
        except OperationError as exc:
            log.warning("rollout of %s v%d after the restart: %s", journal.app,
                        journal.release, exc.message)
        return None

    def _open_rollout(self, app: str, states: Sequence[RolloutState],
                      verb: str) -> RolloutJournal:
        journal = self.rollout_of(app)
        if journal is None or journal.state not in states:
            said = "has had no rollout" if journal is None else (
                f"has no rollout to {verb}: v{journal.release}'s is {journal.state.value}")
            raise UserError(f"{app} {said}", hint=f"see `keelway rollout status {app}`")
        return journal

    def _release_target(self, app: str, number: int) -> Target:
        release = self.store.builds.get_release(app, number)
        if release is None:
            raise UserError(f"release v{number} of {app} was never written (its first "
                            "instance did not take it)", hint=f"deploy {app} again")
        build = targets.build_path(self.store, app, release.build_digest)
        if build is None:
            raise UserError(f"the build of v{number} is no longer staged",
                            hint="deploy its source again")
        return Target.load(app, number, release.build_digest, build, dict(release.config))

    @staticmethod
    def _spec_of(journal: RolloutJournal, rollout: Rollout) -> RolloutSpec:
        """How a rollout carried on is judged: as it began, its release's [rollout]
        with the overrides it was given."""
        return rollout_spec(rollout.target.manifest, dict(journal.overrides))

    def _resumable(self, journal: RolloutJournal, progress: Progress) -> Rollout:
        """The rollout `journal` records, as its attempts need it again: its release
        (written: the first instance took it), each host not on it scheduled anew."""
        target = self._release_target(journal.app, journal.release)
        hosts = [h.host for h in journal.hosts if h.state is not HostState.ROLLED]
        revs = {host: self.store.instances.bump_schedule(host) for host in hosts
                if self.store.instances.get_instance(host) is not None}
        cause = Cause.CONFIG if journal.kind is OpKind.CONFIG else Cause.RELEASE
        return Rollout(journal.app, journal.kind, cause, target, revs, None, progress, None,
                       None)

    def _scheduled(self, intent: Intent, revs: Mapping[str, int]) -> Rollout:
        """The rollout of `intent` at schedule `revs`: its target is the app's next
        release (read under the app's lock by a rollout that runs)."""
        number = self.store.builds.next_release_number(intent.app)
        manifest = intent.manifest or load_manifest(intent.build_path)
        return Rollout(
            intent.app, intent.kind, intent.cause,
            Target.of(intent.app, number, intent.build_digest, intent.build_path,
                      dict(intent.config), manifest, intent.mode),
            revs, ReleaseDraft(intent.app, intent.build_digest, dict(intent.config),
                               intent.description),
            intent.progress, intent.key, intent.request_digest)

    def _dry_rollout(self, intent: Intent) -> list[Plan]:
        return self._dry_plans(self._dry_scheduled(intent, []), intent.hosts, [])

    def _dry_scheduled(self, intent: Intent, added: list[str]) -> Rollout:
        """`intent` as scheduled now, at the revision each instance holds (an instance a
        deploy would add starts at 0), so no plan of it is superseded."""
        return self._scheduled(intent, {
            host: 0 if host in added else targets.instance_named(self.store, host).schedule_rev
            for host in intent.hosts})

    def _dry_plans(self, rollout: Rollout, hosts: Sequence[str],
                   added: list[str]) -> list[Plan]:
        """Each instance's plan, as the rollout would run it were it scheduled now
        (every instance is planned, though a real rollout halts at its first failure);
        one a deploy would add has no record yet, so it is planned as what it is then:
        an instance that runs nothing and has no route."""
        return [plan_replacing(self.store, AttemptRequest(host, rollout)) if host in added
                else self.dry_attempt(rollout, host) for host in hosts]

    async def start_new(self, app: str, hosts: list[str],
                        progress: Progress = _quiet) -> list[InstanceResult]:
        """Start instances that run nothing yet on the app's current release, writing no
        new release (`instances add`, keelway/deploy/tenants.py). Each is an attempt of
        its own; one that fails leaves the others to start. The caller holds the app's
        lock."""
        target = targets.current_release(self.store, app)
        revs = {host: self.store.instances.bump_schedule(host) for host in hosts}
        rollout = Rollout(app, OpKind.DEPLOY, Cause.RELEASE, target, revs, None, progress,
                          None, None)
        return [said async for _host, _result, said in self._each(rollout, hosts)]

    async def _each(self, rollout: Rollout, hosts: Sequence[str],
                    ) -> AsyncIterator[tuple[str, Result, InstanceResult]]:
        """`rollout`'s attempt on each of `hosts` in turn: how each went, and as said."""
        for host in hosts:
            result = await self._attempt_on(rollout, host)
            yield host, result, InstanceResult(host, rollout.target.release, _said(result),
                                               result.generations)

    async def restart(self, app: str, host: str | None, progress: Progress = _quiet,
                      key: str | None = None,
                      request_digest: str | None = None) -> list[InstanceResult]:
        """New generations of what each instance runs now (overlap or hold per service)."""
        results = []
        for inst in self.instances_of(app, host):
            target = self._restart_target(inst)
            if target is None:
                # Nothing runs to restart; its next wake starts fresh processes anyway,
                # and a pending release is not to be replaced by what ran before.
                results.append(InstanceResult(inst.host, 0, "parked", {}))
                continue
            rev = self.store.instances.bump_schedule(inst.host)
            result = await self._attempt_on(
                Rollout(app, OpKind.RESTART, Cause.RESTART, target, {inst.host: rev}, None,
                        progress, key, request_digest), inst.host)
            results.append(InstanceResult(inst.host, target.release, result.outcome.value,
                                          result.generations))
            if result.outcome is not Outcome.DONE:
                raise AppFailed(f"{inst.host}: {result.reason}",
                                hint=f"see `keelway logs {app} --instance {inst.host}`")
        return results

    def dry_restart(self, app: str, host: str | None) -> list[Plan]:
        plans = []
        for inst in self.instances_of(app, host):
            target = self._restart_target(inst)
            if target is None:
                plans.append(Plan(OpKind.RESTART, app, inst.host,
                                  nothing="parked: its next wake starts fresh processes"))
                continue
            plans.append(self.dry_attempt(
                Rollout(app, OpKind.RESTART, Cause.RESTART, target,
                        {inst.host: inst.schedule_rev}, None, _quiet, None, None),
                inst.host))
        return plans

    def _restart_target(self, inst: Instance) -> Target | None:
        """What a restart of `inst` starts again (None: parked, nothing runs); refused
        before anything is scheduled when fenced or when it runs nothing."""
        if inst.state is InstanceState.PARKED:
            return None
        refuse_if_fenced(self.store, inst.host, "restart")
        target = targets.running_target(self.store, inst.host)
        if target is None:
            raise UserError(f"{inst.host} runs nothing to restart",
                            hint=f"deploy {inst.app} first, or `keelway start {inst.app}`")
        return target

    async def _defer_parked(self, rollout: Rollout, hosts: Sequence[str]) -> dict[str, Result]:
        """The release left pending on parked `hosts` in writes of DEFER_BATCH
        (`Store.defer_releases`): each host journaled as its own attempt would be (an
        operation, its DEFER step), without an attempt's per-host round of locking,
        converging and a write per step, which took a thousand-instance rollout's
        parked cohort seconds on end with no turn for a request. Only once the release
        row is written (`rollout.release` None: the first instance wrote it). A host
        passed over (its lock held by an operation, an operation of it unfinished, awake
        or rescheduled by now) is left to its own attempt. Nothing to converge after:
        a deferral changes no process, route or ACTIVE (so the `current` link stays
        right too). The results of those deferred."""
        assert rollout.release is None, "the release row is written first"
        results: dict[str, Result] = {}
        for start in range(0, len(hosts), DEFER_BATCH):
            held: list[str] = []
            try:
                for host in hosts[start:start + DEFER_BATCH]:
                    lock = self.locks.instance(host)
                    if lock.locked():
                        continue
                    await lock.acquire()  # free: taken at once, no turn of the loop
                    held.append(host)
                ready = [(host, rollout.revisions[host]) for host in held
                         if (latest := self.store.ops.latest_operation(host)) is None
                         or latest.terminal]
                failpoints.hit("defer.batch.before")
                written = self.store.defer_releases(
                    ready, app=rollout.app, kind=rollout.kind, owner=self.runner.owner,
                    number=rollout.target.release, cause=rollout.cause, key=rollout.key,
                    request_digest=rollout.request_digest)
                failpoints.hit("defer.batch.after")
            finally:
                for host in held:
                    self.locks.instance(host).release()
            for op in written:
                results[op.instance] = Result(Outcome.DONE, "deferred to the next wake",
                                              deferred=True)
                rollout.progress(f"{op.instance} is parked: v{rollout.target.release} "
                                 "starts at its next wake")
            await asyncio.sleep(0)  # a request's turn between two writes
        return results

    async def _attempt_on(self, rollout: Rollout, host: str) -> Result:
        ran = await self.runner.run(ATTEMPTS[rollout.kind], self,
                                     AttemptRequest(host, rollout), key=rollout.key,
                                     request_digest=rollout.request_digest,
                                     schedule_rev=rollout.revisions[host])
        if ran.result is None:
            return Result(Outcome.SUPERSEDED, ran.plan.nothing)
        return ran.result

    def dry_attempt(self, rollout: Rollout, host: str) -> Plan:
        return self.runner.dry_run(ATTEMPTS[rollout.kind], AttemptRequest(host, rollout))

    # -- stop / start ----------------------------------------------------------------

    async def stop_instance(self, inst: Instance) -> None:
        """Take the instance out of service (STOPPED, route gated: 503), then stop every
        generation and prove it gone; ACTIVE stays, so start respawns what ran."""
        ran = await self.runner.run(STOP, self, HostRequest(inst.host))
        if not ran.done:
            assert ran.result is not None
            raise OperationError(ran.result.reason or "stop failed")

    async def start_instance(self, inst: Instance) -> None:
        """Put the instance back in service (RUNNING), then respawn what ACTIVE names and
        publish its route: the same path as a restart after a crash."""
        ran = await self.runner.run(START, self, HostRequest(inst.host))
        if not ran.done:
            assert ran.result is not None
            raise AppFailed(f"{inst.host}: {ran.result.reason}",
                            hint=f"see `keelway logs {inst.app} --instance {inst.host}`")

    def dry_stop(self, inst: Instance) -> Plan:
        return self.runner.dry_run(STOP, HostRequest(inst.host))

    def dry_start(self, inst: Instance) -> Plan:
        return self.runner.dry_run(START, HostRequest(inst.host))


def _said(result: Result) -> str:
    """An instance's outcome as a rollout reports it: `deferred` for a parked one."""
    return "deferred" if result.deferred else result.outcome.value


# -- the attempt kinds: deploy, config, rollback, restart ---------------------------


@dataclass(frozen=True)
class AttemptRequest:
    host: str
    rollout: Rollout


def plan_attempt_on(store: Store, request: AttemptRequest) -> Plan:
    """One instance's step of a rollout. Superseded (a newer schedule) before it
    starts: nothing. A parked instance: its release deferred to its next wake (one
    DEFER step), nothing started; a fenced one is deferred too, since nothing runs. A
    fenced running one is refused. Otherwise the instance laid down whole, then the
    attempt of deploy/plan.py, which journals its own steps and falls back by its
    table (its line lists the steps it plans now)."""
    rollout, host = request.rollout, request.host
    inst = targets.instance_named(store, host)
    kind = rollout.kind
    if inst.schedule_rev != rollout.revisions[host]:
        return Plan(kind, inst.app, host, nothing="superseded before it started")
    release = rollout.target.release
    if inst.state is InstanceState.PARKED:
        return Plan(kind, inst.app, host, (PlannedStep(
            StepKind.DEFER, f"{host} is parked: v{release} is left pending for its next "
            "wake", "defer", before=("defer.before",), after=("defer.after",),
            arg=release),))
    refuse_if_fenced(store, host, kind.value)
    return plan_replacing(store, request)


def plan_replacing(store: Store, request: AttemptRequest) -> Plan:
    """An attempt that replaces what the instance runs: it is laid down whole, then the
    attempt of deploy/plan.py runs over the generations ACTIVE names (none on an
    instance that runs nothing yet). A dry-run deploy plans an instance it would add
    with it directly: added RUNNING at schedule 0 with no fence, `plan_attempt_on`
    would come to this same plan."""
    rollout, host = request.rollout, request.host
    release = rollout.target.release
    prior = {a.service: gen for a in store.generations.list_active(host)
             if (gen := store.generations.get_generation(a.generation_id)) is not None
             and gen.state is not GenState.GONE}
    attempt = plan_attempt(rollout.target.manifest, prior, rollout.cause,
                           routed=store.routes.get_route(host) is not None)
    said = ", ".join(describe_step(step) for step in attempt.steps)
    return Plan(rollout.kind, rollout.app, host, (
        PlannedStep(StepKind.LAY_DOWN, f"lay {host} down whole (data dir, databases, "
                    "env file)", "lay-down", journals_own=True),
        PlannedStep(StepKind.SPAWN, f"attempt v{release} "
                    f"({rollout.target.build_digest[:12]}, {attempt.mode.value}): {said}; "
                    f"on failure: {fallback_of(rollout.cause, attempt.mode)}", "attempt",
                    arg=release, journals_own=True),
    ))


def _lay_down(deployer: Deployer, request: AttemptRequest, _step: PlannedStep) -> Bound:
    async def lay_down(op: Operation) -> Done:
        await lay_down_step(deployer.store, deployer.home, op.id, request.host)
        return Done()

    return lay_down


def _attempt(deployer: Deployer, request: AttemptRequest, _step: PlannedStep) -> Bound:
    async def attempt(op: Operation) -> Ended:
        rollout = request.rollout
        return Ended(await Attempt(
            store=deployer.store, home=deployer.home, supervisor=deployer.supervisor,
            publisher=deployer.publisher, op=op, host=request.host, cause=rollout.cause,
            target=rollout.target, rev=rollout.revisions[request.host],
            release=rollout.release, progress=rollout.progress).run())

    return attempt


def _defer(deployer: Deployer, request: AttemptRequest, _step: PlannedStep) -> Bound:
    """A parked instance stays parked: the rollout's release is left pending for its
    next wake, which runs it as an attempt with the settle window and the fallback of
    its cause. Nothing starts now."""
    async def defer(_op: Operation) -> Ended:
        rollout, host = request.rollout, request.host
        try:
            written = deployer.store.defer_release(
                host, schedule_rev=rollout.revisions[host], number=rollout.target.release,
                cause=rollout.cause, release=rollout.release)
        except StaleSchedule:
            return Ended(Result(Outcome.SUPERSEDED,
                                "superseded by a newer operation before it was deferred"))
        rollout.progress(f"{host} is parked: v{rollout.target.release} starts at its "
                         "next wake")
        return Ended(Result(Outcome.DONE, "deferred to the next wake",
                            released=written is not None, deferred=True),
                     detail=f"v{rollout.target.release}")

    return defer


async def _link_current(deployer: Deployer, request: HostRequest | AttemptRequest,
                        ran: Ran) -> None:
    if ran.result is not None:
        targets.link_current(deployer.store, deployer.home, request.host)


ATTEMPTS: dict[OpKind, Spec[AttemptRequest, Deployer]] = {
    kind: Spec(kind, plan_attempt_on,
               {"lay-down": _lay_down, "attempt": _attempt, "defer": _defer},
               converge_after=True, after=_link_current)
    for kind in (OpKind.DEPLOY, OpKind.CONFIG, OpKind.ROLLBACK, OpKind.RESTART)}


# -- stop and start -----------------------------------------------------------------


@dataclass(frozen=True)
class HostRequest:
    host: str


def plan_stop(store: Store, request: HostRequest) -> Plan:
    """Stop: the instance STOPPED and its route gated in one write, published; then a
    stop of every live generation but the replicator (the replication hook stops it
    after the app, with a last sync). Once the first step succeeded, convergence stops
    whatever ACTIVE still runs."""
    host = request.host
    inst = targets.instance_named(store, host)
    return Plan(OpKind.STOP, inst.app, host, (
        PlannedStep(StepKind.OUT_OF_SERVICE, f"{host} STOPPED and its route gated (503) in "
                    "one write, then published", "out-of-service",
                    before=("service.out.before",), after=("service.out.after",)),
        *stop_steps(store, host)))


def _out_of_service(deployer: Deployer, request: HostRequest, _step: PlannedStep) -> Bound:
    async def out_of_service(_op: Operation) -> Done:
        if deployer.store.take_out_of_service(request.host, InstanceState.STOPPED):
            await deployer.publisher.publish()
        return Done()

    return out_of_service


def _stop(deployer: Deployer, _request: HostRequest, step: PlannedStep) -> Bound:
    return stop_generation(deployer.store, deployer.supervisor, step)


STOP: Spec[HostRequest, Deployer] = Spec(
    OpKind.STOP, plan_stop, {"out-of-service": _out_of_service, "stop": _stop})


def plan_start(store: Store, request: HostRequest) -> Plan:
    """Start: the instance RUNNING (once written, convergence restarts ACTIVE), then what
    ACTIVE names respawned through the verified start path and its route published."""
    host = request.host
    inst = targets.instance_named(store, host)
    return Plan(OpKind.START, inst.app, host, (
        PlannedStep(StepKind.IN_SERVICE, f"{host} RUNNING", "in-service",
                    before=("service.in.before",), after=("service.in.after",)),
        PlannedStep(StepKind.SPAWN, "start what ACTIVE names and publish its route",
                    "respawn", journals_own=True)))


def _in_service(deployer: Deployer, request: HostRequest, _step: PlannedStep) -> Bound:
    async def in_service(_op: Operation) -> Done:
        current = targets.instance_named(deployer.store, request.host)
        if current.state is not InstanceState.RUNNING:
            deployer.store.instances.set_instance_state(current, InstanceState.RUNNING)
        return Done()

    return in_service


def _respawn(deployer: Deployer, request: HostRequest, _step: PlannedStep) -> Bound:
    async def respawn(op: Operation) -> Done | Failed:
        current = targets.instance_named(deployer.store, request.host)
        result = await deployer.restarts.respawn_active(op, current)
        return Done() if result.outcome is Outcome.DONE else Failed(
            result.reason or "the start failed")

    return respawn


START: Spec[HostRequest, Deployer] = Spec(
    OpKind.START, plan_start, {"in-service": _in_service, "respawn": _respawn},
    fence_verb="start", converge_after=True, after=_link_current)


def rollout_spec(manifest: Manifest, overrides: Mapping[str, str]) -> RolloutSpec:
    """How a release rolls out: its manifest's [rollout] with `overrides` (`--rollout
    KEY=VALUE`) over it; a bad override is the user's (UserError), nothing begun."""
    try:
        return overlay_rollout(manifest.rollout, overrides)
    except ManifestError as exc:
        raise UserError(str(exc), hint="see docs/app-contract.md#rollouts") from None
