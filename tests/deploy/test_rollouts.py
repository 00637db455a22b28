"""The rollout driver (keelway/deploy/rollouts.py), daemon-less: the in-memory store, a
fake clock, attempts that only say how they went, and router counts the test writes.
What each test pins is what `rollout status` and a resume after a crash read: the
journal."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence

import pytest

from keelway.builds.manifest import Amount, NoTraffic, RolloutSpec
from keelway.deploy.outcome import Outcome, Result
from keelway.deploy.rollouts import STARTS_PER_TURN, Rollouts, begin_rollout, settle_rolling
from keelway.journal import OpKind
from keelway.router.counts import InstanceCounts, ResponseCounts
from keelway.store.lifecycle import RolloutState
from keelway.store.rollouts import HostState, RolloutJournal
from keelway.testing.clock import FakeClock
from keelway.testing.memory_store import MemoryStore
from tests.deploy.conftest import Records

SPEC = RolloutSpec()  # a canary of 1, then 10%, 50%, 100%, 8 at once, 1% of 5xx
HOSTS = [f"t{i:02}.test" for i in range(20)]


class Router:
    """Counts a test writes: each host's responses so far, by the app's status class."""

    def __init__(self) -> None:
        self.incarnation = "one"
        self.by_host: dict[str, dict[str, int]] = {}
        self.reads = 0

    def serve(self, host: str, status_class: str, n: int = 1) -> None:
        mine = self.by_host.setdefault(host, {})
        mine[status_class] = mine.get(status_class, 0) + n

    async def counts(self) -> ResponseCounts:
        self.reads += 1
        return ResponseCounts(self.incarnation, 0.0, {
            host: InstanceCounts(app=dict(c)) for host, c in self.by_host.items()})


class Fleet:
    """Attempts of the release: each records its host, in order, and how many ran at
    once; `fails` says which hosts fail and why; `on_attempt` lets a test act while a
    host's attempt runs (traffic to it, say)."""

    def __init__(self, fails: dict[str, str] | None = None) -> None:
        self.fails = fails or {}
        self.attempted: list[str] = []
        self.running = 0
        self.most = 0
        self.released = False
        self.on_attempt: Callable[[str], None] = lambda host: None

    async def attempt(self, host: str) -> Result:
        self.attempted.append(host)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0)  # others of the cohort start meanwhile
            self.on_attempt(host)
            if host in self.fails:
                return Result(Outcome.FAILED, self.fails[host])
            self.released = True
            return Result(Outcome.DONE, released=True)
        finally:
            self.running -= 1


def _quiet(_line: str) -> None:
    pass


def _begin(store: MemoryStore, spec: RolloutSpec = SPEC, hosts: list[str] = HOSTS,
           parked: tuple[str, ...] = ()) -> RolloutJournal:
    return begin_rollout(store, "shop", 4, 3, OpKind.CONFIG, hosts, parked, spec)


def _drive(store: MemoryStore, journal: RolloutJournal, fleet: Fleet,
           router: Router | None = None, spec: RolloutSpec = SPEC) -> RolloutJournal:
    clock = FakeClock()
    driver = Rollouts(store, clock, router.counts if router is not None else None)
    return asyncio.run(driver.drive(journal, spec, fleet.attempt, lambda: fleet.released,
                                    _quiet))


@pytest.fixture
def store(records: Records) -> MemoryStore:
    assert isinstance(records.store, MemoryStore)
    return records.store


def test_a_good_release_reaches_every_instance_cohort_by_cohort_in_parallel(
        store: MemoryStore) -> None:
    fleet, router = Fleet(), Router()
    ended = _drive(store, _begin(store), fleet, router)
    assert ended.state is RolloutState.DONE and ended.cohort == 3
    assert ended.in_state(HostState.ROLLED) == HOSTS
    assert fleet.attempted[0] == HOSTS[0]  # the canary first, alone
    assert sorted(fleet.attempted) == HOSTS  # each once
    assert 1 < fleet.most <= SPEC.parallel  # a cohort's instances at once, never more
    # Each cohort that gates another is judged: counts before and after it (1, 1, 8).
    assert router.reads == 6
    assert ended.figures is not None and ended.figures.verdict == "no-traffic"


def test_a_canary_that_fails_halts_with_the_other_nineteen_untouched(
        store: MemoryStore) -> None:
    fleet = Fleet(fails={HOSTS[0]: "web did not settle"})
    ended = _drive(store, _begin(store), fleet, Router())
    assert ended.state is RolloutState.HALTED
    assert ended.reason == f"{HOSTS[0]}: web did not settle"
    assert fleet.attempted == [HOSTS[0]]
    canary = ended.host(HOSTS[0])
    assert canary is not None and canary.state is HostState.FAILED
    assert ended.in_state(HostState.PENDING) == HOSTS[1:]


def test_a_cohort_over_its_5xx_budget_halts_and_keeps_the_figures_it_was_judged_on(
        store: MemoryStore) -> None:
    fleet, router = Fleet(), Router()
    spec = dataclasses.replace(SPEC, bake_s=30.0)

    def traffic(host: str) -> None:  # the second cohort's instance answers badly
        router.serve(host, "2xx", 90)
        router.serve(host, "5xx", 10 if host == HOSTS[1] else 0)

    fleet.on_attempt = traffic
    ended = _drive(store, _begin(store, spec), fleet, router, spec)
    assert ended.state is RolloutState.HALTED and ended.cohort == 1
    assert ended.reason == "10 of 100 responses 5xx (10.0%), over the budget of 1%"
    figures = ended.figures
    assert figures is not None and (figures.cohort, figures.verdict, figures.responses,
                                    figures.errors) == (1, "failed", 100, 10)
    assert [(h.host, h.errors) for h in figures.by_host] == [(HOSTS[1], 10)]
    # The cohort's instance keeps serving the release; no later cohort began.
    assert ended.in_state(HostState.ROLLED) == HOSTS[:2]
    assert ended.in_state(HostState.PENDING) == HOSTS[2:]


def test_a_quiet_cohort_follows_on_no_traffic(store: MemoryStore) -> None:
    halting = dataclasses.replace(SPEC, on_no_traffic=NoTraffic.HALT)
    ended = _drive(store, _begin(store, halting), Fleet(), Router(), halting)
    assert ended.state is RolloutState.HALTED and ended.cohort == 0
    assert ended.reason == "no request during bake (on_no_traffic = halt)"
    passing = dataclasses.replace(SPEC, on_no_traffic=NoTraffic.PASS)
    assert _drive(store, _begin(store, passing), Fleet(), Router(),
                  passing).state is RolloutState.DONE


def test_a_cohort_that_waits_for_traffic_passes_once_it_comes(store: MemoryStore) -> None:
    waiting = dataclasses.replace(SPEC, on_no_traffic=NoTraffic.WAIT, bake_s=5.0)
    router = Router()
    real = router.counts

    async def traffic_later() -> ResponseCounts:
        if router.reads >= 3:  # the canary's bake looked twice and found nothing
            router.serve(HOSTS[0], "2xx", 50)
        return await real()

    router.counts = traffic_later  # type: ignore[method-assign]
    ended = _drive(store, _begin(store, waiting, HOSTS[:2]), Fleet(), router, waiting)
    assert ended.state is RolloutState.DONE
    assert ended.figures is not None and ended.figures.responses == 50


def test_a_router_restart_during_bake_judges_again_from_its_new_counts(
        store: MemoryStore) -> None:
    fleet, router = Fleet(), Router()
    real = router.counts

    async def restarted() -> ResponseCounts:
        if router.reads == 1:  # the bake's end: a new router, counting from zero
            router.incarnation, router.by_host = "two", {}
        return await real()

    router.counts = restarted  # type: ignore[method-assign]
    ended = _drive(store, _begin(store, hosts=HOSTS[:2]), fleet, router)
    assert ended.state is RolloutState.DONE and router.reads == 3


def test_parked_instances_take_the_release_last_and_are_not_judged(store: MemoryStore) -> None:
    fleet, router = Fleet(), Router()
    ended = _drive(store, _begin(store, hosts=HOSTS[:3], parked=("p.test",)), fleet, router)
    assert ended.state is RolloutState.DONE and fleet.attempted[-1] == "p.test"
    assert ended.cohorts[-1].judged is False
    assert ended.in_state(HostState.ROLLED) == [*HOSTS[:3], "p.test"]


def test_the_parked_cohort_is_deferred_in_bulk_and_what_that_passes_over_is_attempted(
        store: MemoryStore) -> None:
    """`defer` takes the parked cohort first, once the release row is written; a host
    it passes over (awake by now, its lock held) gets its own attempt."""
    fleet, asked = Fleet(), []
    parked = ("p1.test", "p2.test", "p3.test")

    async def defer(hosts: Sequence[str]) -> dict[str, Result]:
        asked.append(list(hosts))
        return {h: Result(Outcome.DONE, deferred=True) for h in hosts if h != "p2.test"}

    journal = _begin(store, hosts=HOSTS[:2], parked=parked)
    driver = Rollouts(store, FakeClock(), Router().counts)
    ended = asyncio.run(driver.drive(journal, SPEC, fleet.attempt, lambda: fleet.released,
                                     _quiet, defer))
    assert ended.state is RolloutState.DONE
    assert asked == [list(parked)]  # once, the parked cohort whole
    assert fleet.attempted == [*HOSTS[:2], "p2.test"]
    assert ended.in_state(HostState.ROLLED) == [*HOSTS[:2], *parked]


def test_nothing_is_deferred_in_bulk_before_the_release_row_is_written(
        store: MemoryStore) -> None:
    """Every instance parked: the first one's own attempt writes the release, then the
    rest are deferred in bulk."""
    fleet, asked = Fleet(), []

    async def defer(hosts: Sequence[str]) -> dict[str, Result]:
        asked.append(list(hosts))
        return {h: Result(Outcome.DONE, deferred=True) for h in hosts}

    journal = _begin(store, hosts=[], parked=("p1.test", "p2.test", "p3.test"))
    driver = Rollouts(store, FakeClock(), Router().counts)
    ended = asyncio.run(driver.drive(journal, SPEC, fleet.attempt, lambda: fleet.released,
                                     _quiet, defer))
    assert ended.state is RolloutState.DONE
    assert fleet.attempted == ["p1.test"] and asked == [["p2.test", "p3.test"]]


def test_a_pause_written_meanwhile_stops_the_rollout_before_its_next_cohort(
        store: MemoryStore) -> None:
    fleet = Fleet()
    journal = _begin(store)

    def pause(host: str) -> None:
        if host == HOSTS[0]:
            now = store.rollouts.get_rollout(journal.id)
            assert now is not None
            store.rollouts.move_rollout(now, RolloutState.PAUSED, reason="paused by request")

    fleet.on_attempt = pause
    ended = _drive(store, journal, fleet, Router())
    assert ended.state is RolloutState.PAUSED and fleet.attempted == [HOSTS[0]]
    assert ended.in_state(HostState.ROLLED) == [HOSTS[0]]


def test_a_newer_rollout_supersedes_an_older_one_whose_cohort_is_under_way(
        store: MemoryStore) -> None:
    fleet = Fleet()
    journal = _begin(store)

    def newer(host: str) -> None:
        if host == HOSTS[0]:
            _begin(store)  # a newer release's rollout began meanwhile

    fleet.on_attempt = newer
    ended = _drive(store, journal, fleet, Router())
    assert ended.state is RolloutState.SUPERSEDED and fleet.attempted == [HOSTS[0]]


def test_after_a_crash_a_rolling_host_on_the_release_counts_as_rolled_the_rest_again(
        store: MemoryStore, records: Records) -> None:
    """A resume never redoes an instance that took the release."""
    for host in ("a.test", "b.test"):
        records.instance(host, app="shop")
    records.running("a.test")  # on release 1, which ACTIVE names
    journal = begin_rollout(store, "shop", 1, None, OpKind.DEPLOY, ["a.test", "b.test"], (),
                            SPEC)
    store.rollouts.mark_rollout_hosts(journal.id, ["a.test", "b.test"], HostState.ROLLING)
    settled = settle_rolling(store, store.rollouts.get_rollout(journal.id) or journal)
    assert settled.in_state(HostState.ROLLED) == ["a.test"]
    assert settled.in_state(HostState.PENDING) == ["b.test"]
    fleet = Fleet()
    fleet.released = True
    ended = _drive(store, settled, fleet)
    assert ended.state is RolloutState.DONE and fleet.attempted == ["b.test"]


def test_a_cohort_whose_attempt_fails_in_parallel_halts_and_records_each_outcome(
        store: MemoryStore) -> None:
    fleet = Fleet(fails={HOSTS[5]: "exited 1"})
    ended = _drive(store, _begin(store), fleet, Router())
    assert ended.state is RolloutState.HALTED and ended.cohort == 2
    failed = ended.host(HOSTS[5])
    assert failed is not None and (failed.state, failed.reason) == (HostState.FAILED,
                                                                    "exited 1")
    assert ended.in_state(HostState.ROLLED) == [h for h in HOSTS[:10] if h != HOSTS[5]]
    assert ended.in_state(HostState.PENDING) == HOSTS[10:]


def test_budget_amounts_are_judged_as_counts_too(store: MemoryStore) -> None:
    spec = dataclasses.replace(SPEC, max_5xx=Amount(count=3))
    fleet, router = Fleet(), Router()
    fleet.on_attempt = lambda host: router.serve(host, "5xx", 3)
    assert _drive(store, _begin(store, spec, HOSTS[:2]), fleet, router,
                  spec).state is RolloutState.DONE


def test_a_wide_cohort_begins_a_few_attempts_a_turn_of_the_loop(store: MemoryStore) -> None:
    """200 attempts begun in one turn held the control plane's loop (and every request
    waiting on it) for over a second at a thousand instances: the cohort's attempts
    begin STARTS_PER_TURN a turn, all of them still running at once."""
    hosts = [f"w{i:03}.test" for i in range(100)]
    spec = dataclasses.replace(SPEC, canary=Amount(count=1), cohorts=(Amount(count=100),),
                               parallel=100)
    fleet, begun_in = Fleet(), dict[str, int]()
    fleet.released = True  # the release row is written: the cohort goes in parallel

    async def scenario() -> RolloutJournal:
        turn = 0

        def tick() -> None:
            nonlocal turn
            turn += 1
            loop.call_soon(tick)

        loop = asyncio.get_running_loop()
        loop.call_soon(tick)
        attempt = fleet.attempt

        async def timed(host: str) -> Result:
            begun_in[host] = turn
            await asyncio.sleep(0.05)  # an attempt's spawn, readiness and settle
            return await attempt(host)

        return await Rollouts(store, FakeClock(), None).drive(
            _begin(store, spec, hosts), spec, timed, lambda: True, _quiet)

    ended = asyncio.run(scenario())
    assert ended.state is RolloutState.DONE and sorted(fleet.attempted) == hosts
    per_turn: dict[int, int] = {}
    for turn in begun_in.values():
        per_turn[turn] = per_turn.get(turn, 0) + 1
    assert max(per_turn.values()) <= STARTS_PER_TURN
    assert fleet.most > STARTS_PER_TURN  # paced at the start, parallel after it
