"""One attempt: carry out the plan (keelway/deploy/plan.py) that replaces what one
instance runs with a target, and fall back by the plan's table when it fails.

The order of effects, per SPEC §4 Deployer, is the plan's:
  overlap: candidate on a new port -> ready -> ACTIVE + route -> publish -> settle ->
           build good -> drain and stop the old generation (retirement-pending meanwhile)
  hold:    withdraw traffic -> replacement-pending on the old -> stop it, proven gone ->
           [hold exec] -> release command -> candidate -> ready -> ACTIVE -> publish -> settle
When it fails, `plan.FALLBACK` says what takes its place: what it replaced (restart,
config), the last good build or with none a stop (a release), or nothing at all (a
hold-mode release that executed: the instance goes down).
Supersession: the attempt holds the instance's schedule revision and re-checks it before
the spawn, at the spawn, before the install (the store's `install` compares it inside
its own write and refuses with `StaleSchedule`) and before the result counts; a
superseded attempt never marks a build good, never writes a release, and leaves traffic
to the newer attempt.
Each journaled step runs through `Steps` (keelway/deploy/steps.py): its write, then its
failpoints around its effect, then its outcome.
Expected outcomes are values (`StartFailed`, `Failed`, `Result`); the one exception is
`Superseded`, raised by the gate (and for a refused install), because it must unwind
whatever step it is checked in. Candidates that end unpublished are removed by the
reconciler, one path for failures and crashes alike.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import assert_never

from keelway import failpoints
from keelway.builds.manifest import ServiceSpec
from keelway.deploy import targets
from keelway.deploy.errors import OperationError
from keelway.deploy.generation_start import StartFailed, run_release_command, start_generation
from keelway.deploy.outcome import Outcome, Progress, Result
from keelway.deploy.plan import (
    Activate,
    AttemptPlan,
    AttemptStep,
    BeginHoldExec,
    Fallback,
    MarkGood,
    Publish,
    Retire,
    RunReleaseCommand,
    Settle,
    StartCandidate,
    StopReplaced,
    Verify,
    Withdraw,
    fallback,
    fallbacks_of,
    plan_attempt,
    respawns,
)
from keelway.deploy.publisher import Publisher
from keelway.deploy.steps import Done, Failed, Steps, nothing
from keelway.deploy.targets import Target, stop_grace_s
from keelway.home import Home
from keelway.journal import Cause, Inhibition, StepKind
from keelway.runtime.supervisor import SettleOutcome, Supervisor
from keelway.store import StaleSchedule, Store
from keelway.store.lifecycle import GenState, InstanceState, RouteState
from keelway.store.records import Generation, Operation, ReleaseDraft

failpoints.declare("activate.before", "release.before", "activate.after", "hold.stopped",
                   "good.before", "retire.before")

DRAIN_BOUND_S = 10.0


class Superseded(Exception):
    def __init__(self, point: str) -> None:
        super().__init__(f"superseded by a newer operation ({point})")


@dataclass
class Attempt:
    store: Store
    home: Home
    supervisor: Supervisor
    publisher: Publisher
    op: Operation
    host: str
    cause: Cause
    target: Target
    rev: int
    # The rollout's release row: written in the install of the first instance that
    # installs, so ACTIVE never names a release that has no row.
    release: ReleaseDraft | None
    progress: Progress
    _executed: bool = False
    _released: bool = False
    _candidates: dict[str, Generation] = field(default_factory=dict)
    # What the instance ran before the attempt, read before it changes ACTIVE, when the
    # table may fall back to it.
    _replaced: Target | None = None

    @property
    def steps(self) -> Steps:
        return Steps(self.store, self.op.id)

    def gate(self, point: str) -> None:
        inst = self.store.instances.get_instance(self.host)
        if inst is None or inst.schedule_rev != self.rev:
            raise Superseded(point)

    def _say(self, message: str) -> None:
        self.progress(f"{self.host}: {message}")

    async def run(self) -> Result:
        prior = self._prior()
        if Fallback.RESPAWN_REPLACED in fallbacks_of(self.cause):
            self._replaced = targets.running_target(self.store, self.host)
        plan = plan_attempt(self.target.manifest, prior, self.cause,
                            routed=self.store.routes.get_route(self.host) is not None)
        activated = False
        try:
            self.gate("before the attempt")
            for step in plan.steps:
                failed = await self._apply(step, plan, prior)
                if failed is not None:
                    self._say(f"failed: {failed.reason}")
                    return await self._recover(plan, prior, failed.reason, activated)
                # From the install on, a failure must put back what it replaced, a
                # failed publish included: ACTIVE already names the candidates.
                activated = activated or isinstance(step, Activate)
        except Superseded as exc:
            if not activated:
                await self._recover(plan, prior, str(exc), activated)
            self._say(str(exc))
            return Result(Outcome.SUPERSEDED, str(exc), released=self._released)
        return Result(Outcome.DONE, generations={s: g.id for s, g in self._candidates.items()},
                      released=self._released)

    async def _apply(self, step: AttemptStep, plan: AttemptPlan,
                     prior: dict[str, Generation]) -> Failed | None:
        """Carry out one planned step; a failure it expects comes back as a value."""
        match step:
            case RunReleaseCommand():
                self._say("running the release command")
                unfinished = await run_release_command(
                    store=self.store, home=self.home, supervisor=self.supervisor,
                    op_id=self.op.id, instance=self.host, target=self.target, gate=self.gate)
                return Failed(str(unfinished)) if unfinished is not None else None
            case StartCandidate(spec=spec, replaces=old):
                return await self._start(spec, old)
            case Withdraw():
                route = self.store.routes.get_route(self.host)
                if route is not None:
                    self.store.routes.set_route(self.host, self.host, RouteState.HOLDING,
                                                route.port, route.generation_id, expected=route)
                # Withdrawing needs no check of our own route: one the router refused is
                # not served at all, which is withdrawn too.
                return await self._publish(StepKind.WITHDRAW, serving=False)
            case StopReplaced(spec=spec, old=old):
                self._say(f"stopping {spec.name} (hold mode)")
                self.store.generations.add_inhibition(old.id, Inhibition.REPLACEMENT_PENDING,
                                                      self.op.id)
                # The route holds new requests now; the ones that reached the old web
                # before the withdraw are answered by it before it stops, not cut.
                await self._drain(spec, old)
                await self._stop(old, StepKind.STOP)
            case BeginHoldExec(evidence=evidence):
                failpoints.hit("hold.stopped")
                self.gate("before the hold exec")
                if evidence:
                    # Written before anything of the new build runs: from here on, a
                    # failure or a crash must not bring the old build back under data it
                    # may have migrated.
                    await self.steps.run(StepKind.HOLD_EXEC, nothing)
                    self._executed = True
            case Activate():
                await self._activate(prior, plan.overlap)
            case Publish():
                refused = await self._publish(StepKind.PUBLISH, serving=True)
                if refused is None:
                    self._say("published")
                return refused
            case Settle(window_s=window_s):
                return await self._settle(window_s)
            case Verify():
                self.gate("before the result counts")
            case MarkGood():
                failpoints.hit("good.before")
                self.store.builds.mark_build_good(self.target.app, self.target.build_digest)
            case Retire(spec=spec, old=old):
                await self._retire(spec, old)
            case _:
                assert_never(step)
        return None

    def _prior(self) -> dict[str, Generation]:
        prior: dict[str, Generation] = {}
        for active in self.store.generations.list_active(self.host):
            gen = self.store.generations.get_generation(active.generation_id)
            if gen is not None and gen.state is not GenState.GONE:
                prior[active.service] = gen
        return prior

    async def _start(self, spec: ServiceSpec, old: Generation | None) -> Failed | None:
        self._say(f"starting {spec.name}")
        started = await start_generation(
            store=self.store, home=self.home, supervisor=self.supervisor, op_id=self.op.id,
            instance=self.host, target=self.target, spec=spec,
            before_gen=old.id if old else None, gate=self.gate,
        )
        if isinstance(started, StartFailed):
            return Failed(str(started))
        self._say(f"{spec.name} ready (pid {self.store.local.presence(started.id).pid})")
        self._candidates[spec.name] = started
        return None

    async def _activate(self, prior: dict[str, Generation], overlap: frozenset[str]) -> None:
        """ACTIVE, route, retirement marks (and the release row) in one write, the
        store's install; the caller publishes."""
        candidates = self._candidates

        async def install() -> Done:
            try:
                written = self.store.install(
                    self.host, schedule_rev=self.rev, candidates=candidates,
                    retiring=[old.id for s, old in prior.items()
                              if s in candidates and s in overlap],
                    retire_reason=Inhibition.RETIREMENT_PENDING, op_id=self.op.id,
                    release=self.release)
            except StaleSchedule as exc:
                raise Superseded("before the install") from exc
            self._released = self._released or written is not None
            return Done()

        writes_release = ("release.before",) if self.release is not None else ()
        await self.steps.run(
            StepKind.ACTIVATE, install, before=("activate.before", *writes_release),
            after=("activate.after",),
            detail=", ".join(f"{s}={g.id}" for s, g in candidates.items()))

    async def _publish(self, kind: StepKind, *, serving: bool) -> Failed | None:
        """A publish step; when it puts this instance's route `serving`, a refusal of
        that route fails the attempt (RouteRefused names it), and only this attempt."""
        async def publish() -> Done | Failed:
            try:
                await self.publisher.publish(self.host if serving else None)
            except OperationError as exc:
                return Failed(exc.message)
            return Done()

        return await self.steps.run(kind, publish)

    async def _settle(self, window_s: float) -> Failed | None:
        services = self.target.manifest.services
        candidates = self._candidates
        if window_s > 0:
            self._say(f"settling for {window_s:g}s")

        async def settle() -> Done | Failed:
            outcomes = await asyncio.gather(*(
                self.supervisor.settle(gen, services[s].settle_s)
                for s, gen in candidates.items()))
            crashed = [s for s, o in zip(candidates, outcomes, strict=True)
                       if o is SettleOutcome.CRASHED]
            if crashed:
                return Failed(f"{', '.join(crashed)} exited during the settle window")
            return Done()

        return await self.steps.run(StepKind.SETTLE, settle, detail=f"{window_s:g}s")

    async def _retire(self, spec: ServiceSpec, old: Generation) -> None:
        """Drain and stop an old generation an overlap swap left running."""
        failpoints.hit("retire.before")
        await self._drain(spec, old)
        await self._stop(old, StepKind.RETIRE)

    async def _drain(self, spec: ServiceSpec, old: Generation) -> None:
        """Bounded drain of an old web the route no longer sends new requests to: the
        ones in flight to its port finish before it is stopped."""
        if (old_port := self.store.local.presence(old.id).port) is not None:
            drained = await self.publisher.drained(old_port, DRAIN_BOUND_S)
            if not drained:
                self._say(f"{spec.name}: requests still in flight after "
                          f"{DRAIN_BOUND_S:g}s; stopping it anyway")

    async def _stop(self, gen: Generation, kind: StepKind) -> None:
        async def stop() -> Done | Failed:
            latest = self.store.generations.get_generation(gen.id) or gen
            if await self.supervisor.stop(latest, stop_grace_s(self.store, gen)):
                return Done()
            pid = self.store.local.presence(gen.id).pid
            return Failed(f"generation {gen.id} (pid {pid}) survived SIGKILL")

        failed = await self.steps.run(kind, stop, service=gen.service, before_gen=gen.id)
        if failed is not None:
            raise OperationError(failed.reason,
                                 hint="the process is stuck in the kernel; check `ps`")

    # -- failure ---------------------------------------------------------------------

    async def _recover(self, plan: AttemptPlan, prior: dict[str, Generation], reason: str,
                       activated: bool) -> Result:
        """Put in place what the table says takes a failed attempt's place."""
        match fallback(self.cause, plan.mode, self._executed):
            case Fallback.DOWN:
                await self._go_down(reason)
                return Result(Outcome.DOWN, f"{reason}; the instance stays down (a hold-mode "
                              "release that executed is never fallen back)",
                              released=self._released)
            case Fallback.RESPAWN_REPLACED:
                return await self._fall_back(prior, reason, activated, self._replaced)
            case Fallback.LAST_GOOD:
                last_good = targets.last_good(self.store, self.target.app,
                                              self.target.build_digest)
                return await self._fall_back(prior, reason, activated, last_good)
            case other:
                assert_never(other)

    async def _fall_back(self, prior: dict[str, Generation], reason: str, activated: bool,
                         replacement: Target | None) -> Result:
        """Start `replacement` for each service whose old generation is gone, and put
        ACTIVE and the route back on what runs; with nothing to go back to, the
        candidates ACTIVE still names are stopped."""
        alive = {s: g for s, g in prior.items() if self._alive(g)}
        restarted: dict[str, Generation] = {}
        for spec, old in respawns(self.target.manifest, alive,
                                  replacement.manifest if replacement else None, prior):
            assert replacement is not None  # respawns() plans nothing without one
            self._say(f"starting {spec.name} of v{replacement.release} again")
            started = await start_generation(
                store=self.store, home=self.home, supervisor=self.supervisor,
                op_id=self.op.id, instance=self.host, target=replacement, spec=spec,
                before_gen=old.id if old else None)
            if isinstance(started, StartFailed):
                self._say(f"the fallback failed too: {started}")
            else:
                restarted[spec.name] = started
        # Read again: an old generation may have died while the fallback started.
        alive = {s: g for s, g in prior.items() if self._alive(g)}
        back = {service: gen.id for service, gen in alive.items()
                if activated or service in restarted}
        back.update({service: gen.id for service, gen in restarted.items()})
        changed = self.store.fall_back(
            self.host, active=back, unmark=[gen.id for gen in prior.values()],
            unmark_reason=Inhibition.RETIREMENT_PENDING,
            web=restarted.get("web") or alive.get("web"))
        if changed:
            try:
                await self.publisher.publish(self.host)
            except OperationError as exc:
                self._say(f"could not republish: {exc.message}")
        if activated:
            # A service whose candidate is still ACTIVE had nothing to go back to: stop it
            # rather than leave a failed build published (boot would restart it).
            stale = [g for s, g in self._active_gens().items()
                     if s not in restarted and not (prior.get(s) and self._alive(prior[s]))]
            if stale:
                await self._stop_instance_for_good(stale, reason)
                reason += "; no good build to fall back to, so the instance is stopped"
        return Result(Outcome.FAILED, reason, released=self._released)

    def _active_gens(self) -> dict[str, Generation]:
        found: dict[str, Generation] = {}
        for active in self.store.generations.list_active(self.host):
            gen = self.store.generations.get_generation(active.generation_id)
            if gen is not None:
                found[active.service] = gen
        return found

    async def _stop_instance_for_good(self, gens: list[Generation], reason: str) -> None:
        await self._take_out_of_service(
            InstanceState.STOPPED, f"v{self.target.release} failed: {reason}", gens,
            StepKind.STOP_NO_FALLBACK)

    async def _go_down(self, reason: str) -> None:
        """Stop everything of the instance and keep it down, saying why."""
        why = f"hold-mode release v{self.target.release} failed after it executed: {reason}"
        await self._take_out_of_service(InstanceState.DOWN, why,
                                        self.store.generations.live_generations(self.host),
                                        StepKind.STOP_DOWN)

    async def _take_out_of_service(self, state: InstanceState, why: str,
                                   gens: list[Generation], kind: StepKind) -> None:
        """Record why, gate the route (503, not a dead port), then stop `gens`."""
        if self.store.take_out_of_service(self.host, state, why):
            try:
                await self.publisher.publish()
            except OperationError as exc:
                self._say(f"could not republish: {exc.message}")
        for gen in gens:
            if gen.state is not GenState.GONE:
                await self._stop(gen, kind)

    def _alive(self, gen: Generation) -> bool:
        latest = self.store.generations.get_generation(gen.id)
        return latest is not None and latest.state is not GenState.GONE and (
            self.supervisor.is_watched(gen.id) or self.supervisor.adopt(latest))
