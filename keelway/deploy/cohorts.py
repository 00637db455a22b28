"""A rollout's cohorts and the judgement of each one's bake (issue #19), pure: no store,
no clock, no router; the rollout operation reads those and hands the figures in.

Invariants this module keeps:

- every instance is in exactly one cohort, the awake ones in the order given (the first
  is the canary), each cohort at most as big as `cohort_sizes` says; parked instances
  are never woken by a rollout, so they are not judged: they take the release last, in
  one group of their own, once every awake cohort passed (a release no awake instance
  proved never reaches a parked one's next wake, unless none is awake at all);
- a bake is judged only on responses the router counted between its two reports: when
  its incarnation changed (a router restart) nothing can be told, and the bake starts
  over rather than pass or fail on half the figures;
- "no traffic" (no response during bake) is its own outcome, resolved by the app's
  `on_no_traffic`, never silently a pass or a failure;
- an error is a 5xx for the cohort's instances: the app's own, or the router's for
  them (502 down, 503 gated, 504 too slow): an instance that does not answer fails the
  same budget as one that answers 500.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import Enum

from keelway.builds.manifest import Amount, NoTraffic, RolloutSpec, cohort_sizes
from keelway.router.counts import NONE, InstanceCounts, ResponseCounts


@dataclass(frozen=True)
class Cohort:
    """Hosts that take the release together; `judged`: whether a bake follows (not for
    parked instances, which serve nothing until their wake)."""

    hosts: tuple[str, ...]
    judged: bool = True


def plan_cohorts(awake: Sequence[str], parked: Collection[str],
                 spec: RolloutSpec) -> list[Cohort]:
    """The cohorts of a rollout over `awake` (in order: the first is the canary) and
    `parked` instances (sorted into one last group, unjudged)."""
    cohorts = []
    at = 0
    for size in cohort_sizes(spec, len(awake)):
        cohorts.append(Cohort(tuple(awake[at:at + size])))
        at += size
    if parked:
        cohorts.append(Cohort(tuple(sorted(parked)), judged=False))
    return cohorts


class CohortVerdict(Enum):
    PASSED = "passed"  # within the budget
    FAILED = "failed"  # over it: the rollout halts
    NO_TRAFFIC = "no-traffic"  # no response; `on_no_traffic` said to pass
    WAIT = "wait"  # no response yet, and the app waits for some; bake goes on
    HALT = "halt"  # no response, and the app halts for a person to decide
    RESTART = "restart"  # the router restarted meanwhile: bake again from now


@dataclass(frozen=True)
class Judgement:
    """What a cohort's bake came to, and the figures it was judged on (shown by
    `rollout status`)."""

    verdict: CohortVerdict
    responses: int
    errors: int
    budget: Amount
    by_host: dict[str, InstanceCounts]

    @property
    def halts(self) -> bool:
        return self.verdict in (CohortVerdict.FAILED, CohortVerdict.HALT)

    @property
    def done(self) -> bool:
        """Whether the next cohort may start."""
        return self.verdict in (CohortVerdict.PASSED, CohortVerdict.NO_TRAFFIC)

    def said(self) -> str:
        if self.verdict is CohortVerdict.RESTART:
            return "the router restarted during bake: its figures start again"
        if self.responses == 0:
            return {CohortVerdict.NO_TRAFFIC: "no request during bake (on_no_traffic = pass)",
                    CohortVerdict.WAIT: "no request yet (on_no_traffic = wait)",
                    CohortVerdict.HALT: "no request during bake (on_no_traffic = halt)"}[
                        self.verdict]
        share = 100 * self.errors / self.responses
        within = "within" if self.verdict is CohortVerdict.PASSED else "over"
        return (f"{self.errors} of {self.responses} responses 5xx ({share:.1f}%), "
                f"{within} the budget of {self.budget}")


def errors_of(counts: InstanceCounts) -> int:
    return counts.app_5xx() + counts.router_5xx()


def judge(before: ResponseCounts, after: ResponseCounts, hosts: Collection[str],
          spec: RolloutSpec) -> Judgement:
    """The verdict on a bake of `hosts` from the router's report `before` it to the one
    `after` it."""
    since = after.since(before)
    if since is None:
        return Judgement(CohortVerdict.RESTART, 0, 0, spec.max_5xx, {})
    by_host = {host: since.get(host, NONE) for host in sorted(hosts)}
    responses = sum(counts.total() for counts in by_host.values())
    errors = sum(errors_of(counts) for counts in by_host.values())
    if responses == 0:
        verdict = {NoTraffic.PASS: CohortVerdict.NO_TRAFFIC, NoTraffic.WAIT: CohortVerdict.WAIT,
                   NoTraffic.HALT: CohortVerdict.HALT}[spec.on_no_traffic]
    elif spec.max_5xx.allows(errors, responses):
        verdict = CohortVerdict.PASSED
    else:
        verdict = CohortVerdict.FAILED
    return Judgement(verdict, responses, errors, spec.max_5xx, by_host)
