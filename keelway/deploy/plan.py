"""An attempt's plan: the steps that replace what one instance runs, and its fallback.

Pure: decided from records alone (the target's manifest, the generations that run now,
whether the instance has a route, the cause), no I/O; `Attempt` carries a plan out.
The rules (SPEC §4 Deployer, reference/002):
- web first, so an overlap swap of web is verified before any hold-mode worker stops;
- overlap services start their candidates while the old ones serve; hold services
  withdraw traffic (web, when routed), stop and prove their old generations gone, and
  only then start: never two alive;
- the release command runs before anything new starts: up front when nothing is held,
  after the hold stops otherwise (it may migrate data the old build still uses);
- one ACTIVE transaction installs every candidate, then the route is published, then
  the settle window; a restart does not mark its build good (it was good already);
- the old generations of overlap services are drained and retired last.
The fallback of a failed attempt is one table, `FALLBACK`, keyed by (cause, mode,
executed); `executed` is the evidence step HOLD_EXEC, journaled only where the table
tells the two apart, so the crash path (keelway/reconcile/plan.py) reads the same word.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import assert_never

from keelway.builds.manifest import Manifest, Mode, ServiceKind, ServiceSpec
from keelway.journal import Cause
from keelway.store.records import Generation


class Fallback(enum.Enum):
    """What a failed attempt puts in its place."""

    # What the attempt replaced is started again (a restart or a config change).
    RESPAWN_REPLACED = "respawn what it replaced"
    # The last good build, or with none the instance stops (a release that did not
    # execute under hold, or an overlap release: the old generation may still serve).
    LAST_GOOD = "the last good build, or stop"
    # Nothing: a hold-mode release that executed may have migrated data, so the old
    # build must not run on it again; the instance goes down and says so.
    DOWN = "stay down"


FALLBACK: dict[tuple[Cause, Mode, bool], Fallback] = {
    (Cause.RESTART, Mode.OVERLAP, False): Fallback.RESPAWN_REPLACED,
    (Cause.RESTART, Mode.OVERLAP, True): Fallback.RESPAWN_REPLACED,
    (Cause.RESTART, Mode.HOLD, False): Fallback.RESPAWN_REPLACED,
    (Cause.RESTART, Mode.HOLD, True): Fallback.RESPAWN_REPLACED,
    (Cause.CONFIG, Mode.OVERLAP, False): Fallback.RESPAWN_REPLACED,
    (Cause.CONFIG, Mode.OVERLAP, True): Fallback.RESPAWN_REPLACED,
    (Cause.CONFIG, Mode.HOLD, False): Fallback.RESPAWN_REPLACED,
    (Cause.CONFIG, Mode.HOLD, True): Fallback.RESPAWN_REPLACED,
    (Cause.RELEASE, Mode.OVERLAP, False): Fallback.LAST_GOOD,
    (Cause.RELEASE, Mode.OVERLAP, True): Fallback.LAST_GOOD,
    (Cause.RELEASE, Mode.HOLD, False): Fallback.LAST_GOOD,
    (Cause.RELEASE, Mode.HOLD, True): Fallback.DOWN,
}


def fallback(cause: Cause, mode: Mode, executed: bool) -> Fallback:
    return FALLBACK[(cause, mode, executed)]


def fallbacks_of(cause: Cause) -> frozenset[Fallback]:
    """Every fallback the table may choose for an attempt of `cause`."""
    return frozenset(f for (c, _, _), f in FALLBACK.items() if c is cause)


def needs_evidence(cause: Cause, mode: Mode) -> bool:
    """Whether the attempt must journal HOLD_EXEC before it execs anything new: exactly
    when the table's answer depends on it."""
    return fallback(cause, mode, True) is not fallback(cause, mode, False)


# -- the steps -----------------------------------------------------------------------


@dataclass(frozen=True)
class RunReleaseCommand:
    """The manifest's one-shot `release` command, to completion."""


@dataclass(frozen=True)
class StartCandidate:
    spec: ServiceSpec
    replaces: Generation | None


@dataclass(frozen=True)
class Withdraw:
    """The route goes `holding` and is published: the router holds web's requests."""


@dataclass(frozen=True)
class StopReplaced:
    """A hold-mode old generation: marked replacement-pending, stopped, proven gone."""

    spec: ServiceSpec
    old: Generation


@dataclass(frozen=True)
class BeginHoldExec:
    """The supersession check after the hold stops; with `evidence`, the HOLD_EXEC step
    is journaled before anything of the new build runs."""

    evidence: bool


@dataclass(frozen=True)
class Activate:
    """ACTIVE, route, retirement marks (and the release row) in one transaction."""


@dataclass(frozen=True)
class Publish:
    """The route table, with this instance's route serving the candidate."""


@dataclass(frozen=True)
class Settle:
    window_s: float


@dataclass(frozen=True)
class Verify:
    """The supersession check before the result counts."""


@dataclass(frozen=True)
class MarkGood:
    pass


@dataclass(frozen=True)
class Retire:
    """An overlap old generation: drained (bounded), then stopped."""

    spec: ServiceSpec
    old: Generation


AttemptStep = (RunReleaseCommand | StartCandidate | Withdraw | StopReplaced | BeginHoldExec
               | Activate | Publish | Settle | Verify | MarkGood | Retire)


@dataclass(frozen=True)
class AttemptPlan:
    mode: Mode  # HOLD when any service is held: the hold part decides the fallback
    steps: tuple[AttemptStep, ...]
    # Services replaced in overlap: their old generations get retirement-pending at the
    # install and are retired last.
    overlap: frozenset[str]


def services_in_order(manifest: Manifest) -> list[ServiceSpec]:
    """web first: an overlap swap of web is verified before any hold-mode worker stops."""
    specs = list(manifest.services.values())
    return sorted(specs, key=lambda s: (s.kind is not ServiceKind.WEB, s.name))


def plan_attempt(manifest: Manifest, running: dict[str, Generation], cause: Cause,
                 routed: bool) -> AttemptPlan:
    """The steps of one attempt onto `manifest`, replacing `running` (service -> its live
    generation); `routed` says whether the instance has a route to withdraw."""
    specs = services_in_order(manifest)
    hold = [s for s in specs if s.mode is Mode.HOLD]
    overlap = [s for s in specs if s.mode is Mode.OVERLAP]
    mode = Mode.HOLD if hold else Mode.OVERLAP
    release = [RunReleaseCommand()] if manifest.release_command else []
    steps: list[AttemptStep] = []
    if not hold:
        steps += release
    steps += [StartCandidate(s, running.get(s.name)) for s in overlap]
    if hold:
        if routed and any(s.name == "web" for s in hold):
            steps.append(Withdraw())
        steps += [StopReplaced(s, old) for s in hold if (old := running.get(s.name))]
        steps.append(BeginHoldExec(needs_evidence(cause, mode)))
        steps += release
        steps += [StartCandidate(s, running.get(s.name)) for s in hold]
    window = max((s.settle_s for s in specs), default=0.0)
    steps += [Activate(), Publish(), Settle(window), Verify()]
    if cause is not Cause.RESTART:
        steps.append(MarkGood())
    steps += [Retire(s, old) for s in overlap if (old := running.get(s.name))]
    return AttemptPlan(mode, tuple(steps), frozenset(s.name for s in overlap))


def respawns(manifest: Manifest, alive: dict[str, Generation], replacement: Manifest | None,
             replaced: dict[str, Generation]) -> list[tuple[ServiceSpec, Generation | None]]:
    """The fallback's starts: each service of the attempt whose old generation is no
    longer alive, from `replacement` (the build the table chose), when it has that
    service; paired with the generation it replaces."""
    if replacement is None:
        return []
    return [(replacement.services[s.name], replaced.get(s.name))
            for s in services_in_order(manifest)
            if s.name not in alive and s.name in replacement.services]


def describe_step(step: AttemptStep) -> str:
    """One planned step of an attempt as `--dry-run` says it."""
    match step:
        case RunReleaseCommand():
            return "run the release command"
        case StartCandidate(spec=spec, replaces=old):
            return f"start {spec.name}" + (f" (replacing generation {old.id})" if old else "")
        case Withdraw():
            return "withdraw the route (holding)"
        case StopReplaced(spec=spec, old=old):
            return f"stop {spec.name} generation {old.id} (hold mode)"
        case BeginHoldExec(evidence=evidence):
            return "record the execution evidence" if evidence else "check the schedule"
        case Activate():
            return "activate"
        case Publish():
            return "publish"
        case Settle(window_s=window_s):
            return f"settle {window_s:g}s"
        case Verify():
            return "verify"
        case MarkGood():
            return "mark the build good"
        case Retire(spec=spec, old=old):
            return f"retire {spec.name} generation {old.id}"
        case _:
            assert_never(step)


def fallback_of(cause: Cause, mode: Mode) -> str:
    """What the table puts in place of a failed attempt, as `--dry-run` says it."""
    before, after = fallback(cause, mode, False), fallback(cause, mode, True)
    if before is after:
        return before.value
    return f"{before.value} before anything new executes, {after.value} after"
