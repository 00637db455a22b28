"""One attempt: replace what one instance runs with a target, by mode and by cause.

The order of effects, per SPEC §4 Deployer:
  overlap: candidate on a new port -> ready -> ACTIVE + route -> publish -> settle ->
           build good -> drain and stop the old generation (retirement-pending meanwhile)
  hold:    withdraw traffic -> replacement-pending on the old -> stop it, proven gone ->
           [hold exec] -> release command -> candidate -> ready -> ACTIVE -> publish -> settle
When it fails (the fallback table):
  restart, config     -> respawn what it replaced;
  release, overlap    -> the old generation keeps serving, or the last good build is
                         started, or with none the instance stops;
  release, hold, once it executed -> nothing falls back: the instance goes down.
Supersession: the attempt holds the instance's schedule revision and re-checks it before
the spawn, at the spawn, before the install (inside the ACTIVE transaction) and before
the result counts; a superseded attempt never marks a build good, never writes a
release, and leaves traffic to the newer attempt.
Candidates that end unpublished are removed by the reconciler, one path for failures
and crashes alike.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from keelway import failpoints
from keelway.builds.manifest import Mode, ServiceSpec
from keelway.deploy.errors import AppFailed, OperationError
from keelway.deploy.instances import (
    StartFailed,
    Target,
    run_release_command,
    services_in_order,
    start_generation,
)
from keelway.deploy.publisher import Publisher
from keelway.home import Home
from keelway.reconcile.plan import HOLD_EXEC_STEP, REPLACEMENT_PENDING, RETIREMENT_PENDING
from keelway.runtime.supervisor import SettleOutcome, Supervisor
from keelway.store import StaleSchedule, Store
from keelway.store.lifecycle import GenState, InstanceState, RouteState, StepState
from keelway.store.records import Generation, Operation, ReleaseDraft

failpoints.declare("activate.before", "release.before", "activate.after", "hold.stopped",
                   "good.before", "retire.before")

DRAIN_BOUND_S = 10.0
Progress = Callable[[str], None]


class Cause(enum.StrEnum):
    RELEASE = "release"  # deploy, rollback: fall back to the last good build
    CONFIG = "config"  # respawn what it replaced
    RESTART = "restart"  # respawn what it replaced


class Outcome(enum.Enum):
    DONE = "done"
    FAILED = "failed"
    DOWN = "down"
    SUPERSEDED = "superseded"


@dataclass
class Result:
    outcome: Outcome
    reason: str | None = None
    generations: dict[str, int] = field(default_factory=dict)
    released: bool = False


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
    # RESTART/CONFIG: the target it replaced; RELEASE: the last good build, if any.
    fallback: Target | None
    rev: int
    # The rollout's release row: written in the install of the first instance that
    # installs, so ACTIVE never names a release that has no row.
    release: ReleaseDraft | None
    progress: Progress
    _executed: bool = False
    _released: bool = False

    def gate(self, point: str) -> None:
        inst = self.store.get_instance(self.host)
        if inst is None or inst.schedule_rev != self.rev:
            raise Superseded(point)

    def _say(self, message: str) -> None:
        self.progress(f"{self.host}: {message}")

    async def run(self) -> Result:
        prior = self._prior()
        specs = services_in_order(self.target.manifest)
        hold = [s for s in specs if s.mode is Mode.HOLD]
        overlap = [s for s in specs if s.mode is Mode.OVERLAP]
        candidates: dict[str, Generation] = {}
        activated = False
        try:
            self.gate("before the attempt")
            if self.target.manifest.release_command and not hold:
                self._say("running the release command")
                await self._release_command()
            for spec in overlap:
                candidates[spec.name] = await self._start(spec, prior.get(spec.name))
            if hold:
                await self._stop_for_hold(hold, prior)
                if self.target.manifest.release_command:
                    self._say("running the release command")
                    await self._release_command()
                for spec in hold:
                    candidates[spec.name] = await self._start(spec, prior.get(spec.name))
            await self._activate(candidates, prior, overlap)
            # From the ACTIVE transaction on, a failure must put back what it replaced,
            # a failed publish included: ACTIVE already names the candidates.
            activated = True
            await self._publish("publish", serving=True)
            self._say("published")
            await self._settle(candidates)
            self.gate("before the result counts")
        except Superseded as exc:
            if not activated:
                await self._recover(prior, str(exc), activated)
            self._say(str(exc))
            return Result(Outcome.SUPERSEDED, str(exc), released=self._released)
        except (StartFailed, AppFailed) as exc:
            reason = str(exc) if isinstance(exc, StartFailed) else exc.message
            self._say(f"failed: {reason}")
            return await self._recover(prior, reason, activated)
        if self.cause is not Cause.RESTART:
            failpoints.hit("good.before")
            self.store.mark_build_good(self.target.app, self.target.build_digest)
        await self._retire(prior, overlap, candidates)
        return Result(Outcome.DONE, generations={s: g.id for s, g in candidates.items()},
                      released=self._released)

    def _prior(self) -> dict[str, Generation]:
        prior: dict[str, Generation] = {}
        for active in self.store.list_active(self.host):
            gen = self.store.get_generation(active.generation_id)
            if gen is not None and gen.state is not GenState.GONE:
                prior[active.service] = gen
        return prior

    async def _start(self, spec: ServiceSpec, old: Generation | None) -> Generation:
        self._say(f"starting {spec.name}")
        gen = await start_generation(
            store=self.store, home=self.home, supervisor=self.supervisor, op_id=self.op.id,
            instance=self.host, target=self.target, spec=spec,
            before_gen=old.id if old else None, gate=self.gate,
        )
        self._say(f"{spec.name} ready (pid {gen.pid})")
        return gen

    async def _release_command(self) -> None:
        await run_release_command(
            store=self.store, home=self.home, supervisor=self.supervisor, op_id=self.op.id,
            instance=self.host, target=self.target, gate=self.gate)

    async def _stop_for_hold(self, hold: list[ServiceSpec], prior: dict[str, Generation]) -> None:
        """Withdraw traffic from hold-mode services and prove their old generations gone."""
        if any(s.name == "web" for s in hold) and self.store.get_route(self.host):
            route = self.store.get_route(self.host)
            assert route is not None
            self.store.set_route(self.host, self.host, RouteState.HOLDING, route.port,
                                 route.generation_id, expected=route)
            # Withdrawing needs no check of our own route: one the router refused is not
            # served at all, which is withdrawn too.
            await self._publish("withdraw traffic", serving=False)
        for spec in hold:
            old = prior.get(spec.name)
            if old is None:
                continue
            self._say(f"stopping {spec.name} (hold mode)")
            self.store.add_inhibition(old.id, REPLACEMENT_PENDING, self.op.id)
            await self._stop(old, spec.stop_grace_s, f"stop {spec.name}")
        failpoints.hit("hold.stopped")
        self.gate("before the hold exec")
        if self.cause is Cause.RELEASE:
            # Written before anything of the new build runs: from here on, a failure or a
            # crash must not bring the old build back under data it may have migrated.
            seq = self.store.begin_step(self.op.id, HOLD_EXEC_STEP)
            self.store.finish_step(self.op.id, seq, StepState.SUCCEEDED)
            self._executed = True

    async def _activate(self, candidates: dict[str, Generation], prior: dict[str, Generation],
                        overlap: list[ServiceSpec]) -> None:
        """ACTIVE, route, retirement marks (and the release row) in one transaction; the
        caller publishes."""
        seq = self.store.begin_step(self.op.id, "activate", detail=", ".join(
            f"{s}={g.id}" for s, g in candidates.items()))
        failpoints.hit("activate.before")
        overlap_names = {s.name for s in overlap}
        if self.release is not None:
            failpoints.hit("release.before")
        try:
            written = self.store.install(
                self.host, schedule_rev=self.rev, candidates=candidates,
                retiring=[old.id for s, old in prior.items()
                          if s in candidates and s in overlap_names],
                retire_reason=RETIREMENT_PENDING, op_id=self.op.id, release=self.release)
        except StaleSchedule as exc:
            raise Superseded("before the install") from exc
        self._released = self._released or written is not None
        failpoints.hit("activate.after")
        self.store.finish_step(self.op.id, seq, StepState.SUCCEEDED)

    async def _publish(self, name: str, *, serving: bool) -> None:
        """A publish step; when it puts this instance's route `serving`, a refusal of
        that route fails the attempt (RouteRefused names it), and only this attempt."""
        seq = self.store.begin_step(self.op.id, name)
        try:
            await self.publisher.publish(self.host if serving else None)
        except OperationError as exc:
            self.store.finish_step(self.op.id, seq, StepState.FAILED, error=exc.message)
            raise AppFailed(exc.message, exc.hint) from exc
        self.store.finish_step(self.op.id, seq, StepState.SUCCEEDED)

    async def _settle(self, candidates: dict[str, Generation]) -> None:
        services = self.target.manifest.services
        window = max((services[s].settle_s for s in candidates), default=0.0)
        if window > 0:
            self._say(f"settling for {window:g}s")
        seq = self.store.begin_step(self.op.id, "settle", detail=f"{window:g}s")
        outcomes = await asyncio.gather(*(
            self.supervisor.settle(gen, services[s].settle_s) for s, gen in candidates.items()))
        crashed = [s for s, o in zip(candidates, outcomes, strict=True)
                   if o is SettleOutcome.CRASHED]
        if crashed:
            error = f"{', '.join(crashed)} exited during the settle window"
            self.store.finish_step(self.op.id, seq, StepState.FAILED, error=error)
            raise AppFailed(error)
        self.store.finish_step(self.op.id, seq, StepState.SUCCEEDED)

    async def _retire(self, prior: dict[str, Generation], overlap: list[ServiceSpec],
                      candidates: dict[str, Generation]) -> None:
        """Drain and stop the old generations an overlap swap left running."""
        for spec in overlap:
            old = prior.get(spec.name)
            if old is None or spec.name not in candidates:
                continue
            failpoints.hit("retire.before")
            if old.port is not None:
                # Bounded drain: the router already sends new requests to the candidate;
                # the ones in flight to the old port finish before it is stopped.
                drained = await self.publisher.drained(old.port, DRAIN_BOUND_S)
                if not drained:
                    self._say(f"{spec.name}: requests still in flight after "
                              f"{DRAIN_BOUND_S:g}s; stopping it anyway")
            await self._stop(old, spec.stop_grace_s, f"retire {spec.name}")

    async def _stop(self, gen: Generation, grace_s: float, name: str) -> None:
        seq = self.store.begin_step(self.op.id, name, service=gen.service, before_gen=gen.id)
        latest = self.store.get_generation(gen.id) or gen
        if await self.supervisor.stop(latest, grace_s):
            self.store.finish_step(self.op.id, seq, StepState.SUCCEEDED)
            return
        error = f"generation {gen.id} (pid {gen.pid}) survived SIGKILL"
        self.store.finish_step(self.op.id, seq, StepState.FAILED, error=error)
        raise OperationError(error, hint="the process is stuck in the kernel; check `ps`")

    # -- failure ---------------------------------------------------------------------

    async def _recover(self, prior: dict[str, Generation], reason: str,
                       activated: bool) -> Result:
        if self.cause is Cause.RELEASE and self._executed:
            await self._go_down(reason)
            return Result(Outcome.DOWN, f"{reason}; the instance stays down (a hold-mode "
                          "release that executed is never fallen back)", released=self._released)
        replacement = self.fallback
        restarted: dict[str, Generation] = {}
        for spec in services_in_order(self.target.manifest):
            old = prior.get(spec.name)
            if old is not None and self._alive(old):
                continue
            if replacement is None or spec.name not in replacement.manifest.services:
                continue
            self._say(f"starting {spec.name} of v{replacement.release} again")
            try:
                restarted[spec.name] = await start_generation(
                    store=self.store, home=self.home, supervisor=self.supervisor,
                    op_id=self.op.id, instance=self.host, target=replacement,
                    spec=replacement.manifest.services[spec.name],
                    before_gen=old.id if old else None)
            except StartFailed as exc:
                self._say(f"the fallback failed too: {exc}")
        alive = {service: gen for service, gen in prior.items() if self._alive(gen)}
        back = {service: gen.id for service, gen in alive.items()
                if activated or service in restarted}
        back.update({service: gen.id for service, gen in restarted.items()})
        changed = self.store.fall_back(
            self.host, active=back, unmark=[gen.id for gen in prior.values()],
            unmark_reason=RETIREMENT_PENDING, web=restarted.get("web") or alive.get("web"))
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
        for active in self.store.list_active(self.host):
            gen = self.store.get_generation(active.generation_id)
            if gen is not None:
                found[active.service] = gen
        return found

    async def _stop_instance_for_good(self, gens: list[Generation], reason: str) -> None:
        await self._take_out_of_service(
            InstanceState.STOPPED, f"v{self.target.release} failed: {reason}", gens,
            "no fallback")

    async def _go_down(self, reason: str) -> None:
        """Stop everything of the instance and keep it down, saying why."""
        why = f"hold-mode release v{self.target.release} failed after it executed: {reason}"
        await self._take_out_of_service(InstanceState.DOWN, why,
                                        self.store.live_generations(self.host), "down")

    async def _take_out_of_service(self, state: InstanceState, why: str,
                                   gens: list[Generation], label: str) -> None:
        """Record why, gate the route (503, not a dead port), then stop `gens`."""
        inst = self.store.get_instance(self.host)
        if inst is not None:
            self.store.set_instance_state(inst, state, why)
        if (route := self.store.get_route(self.host)) is not None:
            self.store.set_route(self.host, self.host, RouteState.GATED, None, None,
                                 expected=route)
            try:
                await self.publisher.publish()
            except OperationError as exc:
                self._say(f"could not republish: {exc.message}")
        for gen in gens:
            if gen.state is not GenState.GONE:
                spec = self.target.manifest.services.get(gen.service)
                await self._stop(gen, spec.stop_grace_s if spec else 10.0,
                                 f"stop {gen.service} ({label})")

    def _alive(self, gen: Generation) -> bool:
        latest = self.store.get_generation(gen.id)
        return latest is not None and latest.state is not GenState.GONE and (
            self.supervisor.is_watched(gen.id) or self.supervisor.adopt(latest))
