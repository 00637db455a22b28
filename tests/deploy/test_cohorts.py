"""A rollout's cohorts and the judgement of a bake (keelway/deploy/cohorts.py), pure."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from keelway.builds.manifest import Amount, NoTraffic, RolloutSpec
from keelway.deploy.cohorts import Cohort, CohortVerdict, judge, plan_cohorts
from keelway.router.counts import InstanceCounts, ResponseCounts

SPEC = RolloutSpec()  # a canary of 1, then 10%, 50%, 100%; 1% of 5xx


def _hosts(n: int) -> list[str]:
    return [f"t{i:03}.test" for i in range(n)]


def test_twenty_awake_instances_go_canary_first_then_by_share() -> None:
    cohorts = plan_cohorts(_hosts(20), (), SPEC)
    assert [len(c.hosts) for c in cohorts] == [1, 1, 8, 10]
    assert cohorts[0].hosts == ("t000.test",) and all(c.judged for c in cohorts)


def test_parked_instances_take_the_release_last_unjudged_and_are_never_a_canary() -> None:
    cohorts = plan_cohorts(_hosts(3), {"z.test", "p.test"}, SPEC)
    assert cohorts[0].hosts == ("t000.test",)
    assert cohorts[-1] == Cohort(("p.test", "z.test"), judged=False)
    only_parked = plan_cohorts([], {"p.test"}, SPEC)
    assert only_parked == [Cohort(("p.test",), judged=False)]


@given(st.integers(0, 300), st.sets(st.integers(0, 50), max_size=5))
def test_every_instance_is_in_exactly_one_cohort_in_order(awake: int, parked: set[int]) -> None:
    hosts = _hosts(awake)
    asleep = {f"p{i}.test" for i in parked}
    cohorts = plan_cohorts(hosts, asleep, SPEC)
    judged = [h for c in cohorts if c.judged for h in c.hosts]
    assert judged == hosts
    assert {h for c in cohorts if not c.judged for h in c.hosts} == asleep
    assert all(c.hosts for c in cohorts)


def _report(incarnation: str, **by_host: dict[str, int]) -> ResponseCounts:
    """Counts per host: keys "2xx"/"5xx" are the app's, "r503" and such the router's."""
    return ResponseCounts(incarnation, 0.0, {
        host: InstanceCounts(app={k: n for k, n in counts.items() if not k.startswith("r")},
                             router={k[1:]: n for k, n in counts.items() if k.startswith("r")})
        for host, counts in by_host.items()})


def test_a_bake_within_the_budget_passes_and_says_its_figures() -> None:
    before = _report("a", one={"2xx": 100})
    after = _report("a", one={"2xx": 1099, "5xx": 1}, other={"5xx": 500})
    judged = judge(before, after, {"one"}, SPEC)
    assert judged.verdict is CohortVerdict.PASSED and judged.done
    assert (judged.responses, judged.errors) == (1000, 1)
    assert judged.said() == "1 of 1000 responses 5xx (0.1%), within the budget of 1%"


def test_the_routers_own_5xx_for_an_instance_count_against_it() -> None:
    after = _report("a", one={"2xx": 90, "r502": 5, "r503": 5})
    judged = judge(_report("a"), after, {"one"}, SPEC)
    assert judged.verdict is CohortVerdict.FAILED and judged.halts and judged.errors == 10
    assert "over the budget of 1%" in judged.said()


def test_a_budget_as_a_count_allows_that_many() -> None:
    spec = RolloutSpec(max_5xx=Amount(count=2))
    assert judge(_report("a"), _report("a", one={"5xx": 2}), {"one"}, spec).verdict is (
        CohortVerdict.PASSED)
    assert judge(_report("a"), _report("a", one={"5xx": 3}), {"one"}, spec).verdict is (
        CohortVerdict.FAILED)


def test_no_traffic_is_its_own_outcome_by_the_apps_rule() -> None:
    quiet = _report("a", other={"2xx": 10})
    for rule, verdict in ((NoTraffic.PASS, CohortVerdict.NO_TRAFFIC),
                          (NoTraffic.WAIT, CohortVerdict.WAIT),
                          (NoTraffic.HALT, CohortVerdict.HALT)):
        judged = judge(_report("a"), quiet, {"one"}, RolloutSpec(on_no_traffic=rule))
        assert judged.verdict is verdict and judged.responses == 0
        assert rule.value in judged.said()
    assert not judge(_report("a"), quiet, {"one"},
                     RolloutSpec(on_no_traffic=NoTraffic.WAIT)).done


def test_a_router_restart_during_bake_judges_nothing_and_bakes_again() -> None:
    judged = judge(_report("a", one={"2xx": 5}), _report("b", one={"5xx": 50}), {"one"},
                   RolloutSpec(max_5xx=Amount(percent=Fraction(1))))
    assert judged.verdict is CohortVerdict.RESTART and not judged.done and not judged.halts
