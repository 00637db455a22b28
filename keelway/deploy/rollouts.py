"""A release's rollout across an app's instances (issue #19; SPEC §4 Deployer): its
cohorts in turn, each cohort's instances in parallel, each cohort judged before the next
begins, every step of it journaled (keelway/store/rollouts.py) so that a crash, a pause
or a halt leaves it resumable from where it stands.

Invariants this module keeps:

- the fleet is never silently mixed: a rollout ends done (every instance on the
  release), halted or paused (recorded, shown by `rollout status`, waiting for `resume`
  or `abort`), aborted, or superseded by a newer release's rollout;
- no cohort begins before the one before it passed: its instances all took the release
  (an instance's own attempt: start, ready, settle, fallback by mode) and, when another
  cohort follows, the router's 5xx for them from the cohort's start to the end of its
  bake stayed within the budget (keelway/deploy/cohorts.py `judge`); the last cohort
  gates nothing, so nothing bakes after it;
- an instance that took the release is never attempted again: a resumed rollout starts
  only its PENDING hosts, and a ROLLING one (its attempt cut short by a crash) only when
  its records say it is not on the release (`settle_rolling`);
- each write comes between its failpoints: the rollout begun (`rollout.begin.*`), a
  cohort's hosts marked (`rollout.hosts.*`: ROLLING before any attempt, the results
  after), the rollout moved to its next cohort or judged (`rollout.cohort.*`), and its
  end (`rollout.end.*`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from keelway import failpoints
from keelway.builds.manifest import RolloutSpec
from keelway.clock import Clock
from keelway.deploy.cohorts import CohortVerdict, Judgement, errors_of, judge, plan_cohorts
from keelway.deploy.outcome import Outcome, Progress, Result
from keelway.journal import OpKind
from keelway.pacing import TurnGate, paced
from keelway.router.counts import ResponseCounts
from keelway.store import Conflict, IllegalTransition, Store
from keelway.store.lifecycle import InstanceState, RolloutState
from keelway.store.rollouts import (
    Figures,
    HostFigures,
    HostState,
    RolloutCohort,
    RolloutJournal,
)

# Around each write: the rollout begun, a cohort's hosts marked, its move to the next
# cohort or its judgement, and its end.
failpoints.declare(*(f"rollout.{write}.{when}" for write in ("begin", "hosts", "cohort", "end")
                     for when in ("before", "after")))
log = logging.getLogger("keelway.rollouts")

# One instance's attempt of the rollout's release (keelway/deploy/deployer.py).
AttemptHost = Callable[[str], Awaitable[Result]]
# The release deferred on many parked instances at once, in batched writes: the result
# of each host it deferred; a host it passed over is left to its own attempt.
DeferHosts = Callable[[Sequence[str]], Awaitable[dict[str, Result]]]
# The router's response counts now; None when no router answers (a rollout then judges
# a cohort on its instances' own health alone, and says so).
ReadCounts = Callable[[], Awaitable[ResponseCounts | None]]
# Whether the rollout's release row is written yet: until it is, instances take it one
# at a time (the first install writes it), then the cohort's rest in parallel.
ReleaseWritten = Callable[[], bool]

# How many of a cohort's attempts, and of their steps, may begin in one turn of the
# control plane's loop. An attempt's start (journal writes, plan, lay-down, spawn) holds
# the loop some milliseconds at a thousand instances, and a cohort's attempts move in
# step (begun together, their settle windows end together): 200 at once held every
# request for over a second. The same work, 8 a turn, leaves a request at most a turn's
# wait (pacing.TurnGate), and the cohort takes no longer: the loop does the same work.
STARTS_PER_TURN = 8

# How long a bake that waits for traffic (`on_no_traffic = "wait"`) waits at least
# between two looks at the router's counts.
WAIT_LOOK_S = 1.0


def begin_rollout(store: Store, app: str, release: int, previous: int | None, kind: OpKind,
                  awake: Sequence[str], parked: Sequence[str], spec: RolloutSpec,
                  overrides: Mapping[str, str] | None = None) -> RolloutJournal:
    """The rollout journaled, its cohorts planned from `spec` (the app's [rollout] with
    the release's `overrides` over it; parked instances last, unjudged); every open
    rollout of `app` superseded in the same write."""
    cohorts = [RolloutCohort(c.hosts, c.judged) for c in plan_cohorts(awake, parked, spec)]
    failpoints.hit("rollout.begin.before")
    journal = store.rollouts.begin_rollout(app, release, previous, kind, cohorts,
                                           sorted((overrides or {}).items()))
    failpoints.hit("rollout.begin.after")
    return journal


def mark(store: Store, rollout_id: int, hosts: Sequence[str], state: HostState,
         reason: str | None = None) -> None:
    """Hosts' places in a rollout written, between the `rollout.hosts` failpoints."""
    if not hosts:
        return
    failpoints.hit("rollout.hosts.before")
    store.rollouts.mark_rollout_hosts(rollout_id, hosts, state, reason)
    failpoints.hit("rollout.hosts.after")


def move(store: Store, journal: RolloutJournal, state: RolloutState, *,
         cohort: int | None = None, reason: str | None = None,
         figures: Figures | None = None) -> RolloutJournal:
    """Where a rollout stands written, between failpoints: `rollout.end` for a move to
    an end or a stop (done, halted, aborted, ...), `rollout.cohort` for one that goes
    on (a next cohort, a judgement passed, a resume)."""
    point = "rollout.cohort" if state is RolloutState.RUNNING else "rollout.end"
    failpoints.hit(f"{point}.before")
    moved = store.rollouts.move_rollout(journal, state, cohort=cohort, reason=reason,
                                        figures=figures)
    failpoints.hit(f"{point}.after")
    return moved


def settle_rolling(store: Store, journal: RolloutJournal) -> RolloutJournal:
    """After a crash: each ROLLING host's attempt ended as its records say (the boot
    reconciler finished its operation): ROLLED if the instance runs the release (or,
    parked, has it pending), PENDING otherwise, so a resume attempts it again and never
    one that took the release."""
    rolled: list[str] = []
    again: list[str] = []
    for host in journal.in_state(HostState.ROLLING):
        (rolled if on_release(store, host, journal.release) else again).append(host)
    mark(store, journal.id, rolled, HostState.ROLLED)
    mark(store, journal.id, again, HostState.PENDING)
    fresh = store.rollouts.get_rollout(journal.id)
    assert fresh is not None
    return fresh


def on_release(store: Store, host: str, release: int) -> bool:
    """Whether `host` runs release `release` (parked: has it pending for its wake)."""
    inst = store.instances.get_instance(host)
    if inst is None:
        return False
    if inst.state is InstanceState.PARKED and inst.pending_release is not None:
        return inst.pending_release == release
    for active in store.generations.list_active(host):
        gen = store.generations.get_generation(active.generation_id)
        if gen is not None:
            return gen.release == release
    return False


@dataclass(eq=False)
class Rollouts:
    """Drives journaled rollouts: the deployer hands each its attempt."""

    store: Store
    clock: Clock
    counts: ReadCounts | None = None
    # Shared by every rollout this control plane drives, so two apps' cohorts begun
    # together are paced together.
    starts: TurnGate = field(default_factory=lambda: TurnGate(STARTS_PER_TURN))

    async def drive(self, journal: RolloutJournal, spec: RolloutSpec, attempt: AttemptHost,
                    released: ReleaseWritten, progress: Progress,
                    defer: DeferHosts | None = None) -> RolloutJournal:
        """Carry `journal` on from the cohort it stands at to its end, or to where it
        stops (halted, paused, superseded); the rollout as it then stands. `defer`: how
        the parked cohort's hosts take the release in bulk, before any is attempted
        one by one."""
        total = len(journal.cohorts)
        for n in range(journal.cohort, total):
            journal = self._fresh(journal)
            if journal.state is not RolloutState.RUNNING:
                return journal  # paused by a person, or superseded, meanwhile
            if n != journal.cohort:
                # The figures the cohort before passed on stay shown until the next
                # judgement replaces them.
                moved = self._move(journal, RolloutState.RUNNING, cohort=n,
                                   figures=journal.figures)
                if moved is None:
                    return self._fresh(journal)
                journal = moved
            cohort = journal.cohorts[n]
            todo = [h.host for h in journal.hosts
                    if h.cohort == n and h.state in (HostState.PENDING, HostState.ROLLING)]
            gates = cohort.judged and n < total - 1 and self.counts is not None
            before = await self._counts() if gates else None
            if todo:
                progress(f"cohort {n + 1} of {total}: {len(todo)} instance"
                         f"{'' if len(todo) == 1 else 's'}"
                         + (" (parked: the release waits for their wake)"
                            if not cohort.judged else ""))
                stopped = await self._attempt_cohort(
                    journal, todo, spec, attempt, released,
                    None if cohort.judged else defer)
                if stopped is not None:
                    return self._end(journal, *stopped)
            if gates:
                journal = await self._bake(journal, n, cohort, spec, before)
                if journal.state is not RolloutState.RUNNING:
                    return journal
        return self._end(journal, RolloutState.DONE, None)

    async def _attempt_cohort(self, journal: RolloutJournal, todo: list[str],
                              spec: RolloutSpec, attempt: AttemptHost,
                              released: ReleaseWritten,
                              defer: DeferHosts | None) -> tuple[RolloutState, str] | None:
        """Every host of `todo` attempted, at most `spec.parallel` at once (one at a time
        until the release row is written; `defer` first, for the parked cohort); each
        one's state journaled. None if all took
        the release; else how the rollout ends and why: SUPERSEDED when a newer schedule
        made an attempt stand down (the newer release's rollout takes over), HALTED
        with the first failed host otherwise."""
        mark(self.store, journal.id, todo, HostState.ROLLING)
        results: dict[str, Result] = {}
        waiting = list(todo)
        while waiting and not released():
            host = waiting.pop(0)
            results[host] = await attempt(host)
            if results[host].outcome is not Outcome.DONE:
                break  # the cohort fails; the hosts not begun stay ROLLING, then PENDING
        if waiting and defer is not None and released() and all(
                r.outcome is Outcome.DONE for r in results.values()):
            results.update(await defer(waiting))
            waiting = [h for h in waiting if h not in results]
        if waiting and all(r.outcome is Outcome.DONE for r in results.values()):
            gate = asyncio.Semaphore(max(1, spec.parallel))

            async def one(host: str) -> tuple[str, Result]:
                async with gate:
                    await self.starts.turn()
                    with paced(self.starts):  # and each of its steps
                        return host, await attempt(host)

            results.update(await asyncio.gather(*(one(h) for h in waiting)))
        rolled = [h for h in todo if h in results and results[h].outcome is Outcome.DONE]
        failed = [h for h in todo if h in results and results[h].outcome is not Outcome.DONE]
        untried = [h for h in todo if h not in results]
        mark(self.store, journal.id, rolled, HostState.ROLLED)
        for host in failed:
            mark(self.store, journal.id, [host], HostState.FAILED, results[host].reason)
        mark(self.store, journal.id, untried, HostState.PENDING)
        if not failed:
            return None
        first = failed[0]
        said = f"{first}: {results[first].reason or results[first].outcome.value}"
        if any(results[h].outcome is Outcome.SUPERSEDED for h in failed):
            return RolloutState.SUPERSEDED, said
        return RolloutState.HALTED, said

    async def _bake(self, journal: RolloutJournal, n: int, cohort: RolloutCohort,
                    spec: RolloutSpec, before: ResponseCounts | None) -> RolloutJournal:
        """The cohort's judgement on the router's counts since `before` (its start),
        after `spec.bake_s` more: the rollout RUNNING with the figures, or HALTED."""
        while True:
            if spec.bake_s > 0:
                await self.clock.sleep(spec.bake_s)
            after = await self._counts()
            if before is None or after is None:
                if after is None:
                    log.warning("rollout %d: no router counts; cohort %d judged on its "
                                "instances' health alone", journal.id, n + 1)
                return journal
            judgement = judge(before, after, cohort.hosts, spec)
            if judgement.verdict is CohortVerdict.RESTART:
                before = after  # a restarted router: its figures start again
                continue
            if judgement.verdict is CohortVerdict.WAIT:
                now = self._fresh(journal)
                if now.state is not RolloutState.RUNNING:
                    return now  # paused while it waited for traffic
                await self.clock.sleep(max(WAIT_LOOK_S, spec.bake_s))
                continue
            figures = _figures(n, judgement)
            state = RolloutState.HALTED if judgement.halts else RolloutState.RUNNING
            moved = self._move(journal, state, reason=judgement.said() if judgement.halts
                               else None, figures=figures)
            return moved if moved is not None else self._fresh(journal)

    async def _counts(self) -> ResponseCounts | None:
        if self.counts is None:
            return None
        try:
            return await self.counts()
        except Exception as exc:  # a router that does not answer: no figures, said so
            log.warning("rollout: the router's counts could not be read: %s", exc)
            return None

    def _fresh(self, journal: RolloutJournal) -> RolloutJournal:
        fresh = self.store.rollouts.get_rollout(journal.id)
        assert fresh is not None
        return fresh

    def _move(self, journal: RolloutJournal, state: RolloutState, *,
              cohort: int | None = None, reason: str | None = None,
              figures: Figures | None = None) -> RolloutJournal | None:
        """The rollout moved; None if it moved under us (paused by a person, superseded)."""
        try:
            return move(self.store, journal, state, cohort=cohort, reason=reason,
                        figures=figures)
        except (Conflict, IllegalTransition):
            return None

    def _end(self, journal: RolloutJournal, state: RolloutState,
             reason: str | None) -> RolloutJournal:
        fresh = self._fresh(journal)
        ended = self._move(fresh, state, reason=reason, figures=fresh.figures)
        return ended if ended is not None else self._fresh(journal)


def _figures(n: int, judgement: Judgement) -> Figures:
    return Figures(n, judgement.verdict.value, judgement.responses, judgement.errors,
                   str(judgement.budget), judgement.said(),
                   tuple(HostFigures(host, counts.total(), errors_of(counts))
                         for host, counts in judgement.by_host.items()))
