"""keelway's Prometheus series, built at scrape time from one `Scrape` (pure).

Owns the names, labels and help of every series /metrics answers, and the instance cap.
Whoever reads the figures (keelway/api/scrape.py: the store and the router) hands them
over as plain values; this module decides nothing about where they come from.

Rules:
- Nothing is counted here: every counter is a count something durable already keeps
  (the router's tallies for its incarnation, the operations journal), read when
  Prometheus asks. A request costs the router nothing for /metrics, and no figure is
  counted twice, in the router and again here.
- Prometheus's naming: base units (`_seconds`), counters end in `_total`, a
  histogram's buckets are cumulative and end at +Inf.
- The instance label is capped: by default every per-instance figure is summed per app
  (`instance` omitted), so 10,000 tenants are as many series as their apps;
  `per_instance` (`keelway up --metrics-per-instance`) adds the label back.
- A family whose source could not be read is left out whole rather than answered at
  zero: a zero would read as "no traffic", a gap reads as "unknown" (and
  `keelway_router_up` says 0).

A leaf (it imports nothing of keelway), so the router could report into it one day.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

# Caddy's request-duration buckets (seconds): what its users' dashboards expect.
REQUEST_BUCKETS_S: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# A wake starts processes and waits for them to be ready: tenths of a second to a
# minute, where the request buckets would put nearly every wake in the last three.
WAKE_BUCKETS_S: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
# Every state the one status rule (keelway/api/instance_state.py) can show, each
# answered even at 0 so a dashboard's sum by state has every term.
INSTANCE_STATES: Final = ("running", "frozen", "parked", "stopped", "crashed", "failed",
                          "no release")


@dataclass(frozen=True)
class Histogram:
    """Counts at or under each bound of `bounds_s` (cumulative), `count` in all and
    `sum_s` together: one label set's histogram as its source keeps it."""

    bounds_s: tuple[float, ...]
    within: tuple[int, ...]
    count: int
    sum_s: float

    def plus(self, other: Histogram) -> Histogram:
        if other.bounds_s != self.bounds_s:
            raise ValueError("histograms of different buckets do not add up")
        return Histogram(self.bounds_s,
                         tuple(a + b for a, b in zip(self.within, other.within, strict=True)),
                         self.count + other.count, self.sum_s + other.sum_s)


@dataclass(frozen=True)
class InstanceTraffic:
    """One instance's answers as its router counted them since it started:
    `responses` by (source, class): source `app` (the upstream's status) or `router`
    (one it wrote itself: 502, 503, 504, ...), class `2xx` ... `5xx` or `other`."""

    app: str
    instance: str
    responses: Mapping[tuple[str, str], int]
    in_flight: int = 0
    duration: Histogram | None = None


@dataclass(frozen=True)
class LastDrill:
    app: str
    instance: str
    ok: bool
    at: float


@dataclass(frozen=True)
class Scrape:
    """Every figure of one scrape. `traffic` is None when the router did not answer
    (its families are then left out); the rest comes from the store."""

    per_instance: bool
    traffic: Sequence[InstanceTraffic] | None
    router_started_at: float | None = None
    router_worker_restarts: int = 0
    # (app, instance, state) of every instance, by the one status rule.
    states: Sequence[tuple[str, str, str]] = ()
    # (app, kind, outcome, count): outcome `succeeded`, `failed` or `running`.
    operations: Sequence[tuple[str, str, str, int]] = ()
    wakes: Mapping[str, Histogram] = field(default_factory=dict)
    # (app, state, count): running, paused, halted, done, aborted, superseded.
    rollouts: Sequence[tuple[str, str, int]] = ()
    drills: Sequence[LastDrill] = ()


class ScrapeCollector(Collector):
    """The families of one `Scrape`, built when the registry collects (once per
    scrape: a registry is made per answer, so nothing outlives it)."""

    def __init__(self, scrape: Scrape) -> None:
        self.scrape = scrape

    def collect(self) -> Iterator[Metric]:
        s = self.scrape
        yield from self._router(s)
        yield from self._instances(s)
        yield from self._journal(s)

    def _keys(self) -> tuple[str, ...]:
        return ("app", "instance") if self.scrape.per_instance else ("app",)

    def _key(self, app: str, instance: str) -> tuple[str, ...]:
        return (app, instance) if self.scrape.per_instance else (app,)

    def _router(self, s: Scrape) -> Iterator[Metric]:
        up = GaugeMetricFamily("keelway_router_up",
                               "Whether the router answered on its control socket (1) or not.")
        up.add_metric([], 1.0 if s.traffic is not None else 0.0)
        yield up
        if s.traffic is None:
            return
        if s.router_started_at is not None:
            yield GaugeMetricFamily(
                "keelway_router_start_time_seconds",
                "When the router counting these requests started (unix seconds): its "
                "counters begin at zero then.", value=s.router_started_at)
        yield CounterMetricFamily(
            "keelway_router_worker_restarts", "Router workers that died and were started "
            "again (what each answered after its last report is not counted).",
            value=s.router_worker_restarts)
        keys = self._keys()
        requests = CounterMetricFamily(
            "keelway_http_requests", "Responses the router sent clients, by status class; "
            "source=router for the answers it wrote itself (502, 503, 504).",
            labels=(*keys, "source", "class"))
        counted: dict[tuple[str, ...], int] = {}
        in_flight: dict[tuple[str, ...], int] = {}
        durations: dict[tuple[str, ...], Histogram] = {}
        for t in s.traffic:
            key = self._key(t.app, t.instance)
            for (source, klass), n in t.responses.items():
                counted[(*key, source, klass)] = counted.get((*key, source, klass), 0) + n
            in_flight[key] = in_flight.get(key, 0) + t.in_flight
            if t.duration is not None:
                mine = durations.get(key)
                durations[key] = t.duration if mine is None else mine.plus(t.duration)
        for labels, n in sorted(counted.items()):
            requests.add_metric(list(labels), n)
        yield requests
        open_now = GaugeMetricFamily(
            "keelway_http_requests_in_flight", "Requests open at the router now: being "
            "answered, streaming, tunnelled (WebSocket) or held for a wake.", labels=keys)
        for key, n in sorted(in_flight.items()):
            open_now.add_metric(list(key), n)
        yield open_now
        if durations:
            duration = HistogramMetricFamily(
                "keelway_http_request_duration_seconds", "Time from a request's head "
                "to the end of its response at the router.", labels=keys)
            for key, h in sorted(durations.items()):
                duration.add_metric(list(key), _buckets(h), sum_value=h.sum_s)
            yield duration

    def _instances(self, s: Scrape) -> Iterator[Metric]:
        by_state: dict[tuple[str, str], int] = {}
        apps = sorted({app for app, _, _ in s.states})
        for app in apps:
            for state in INSTANCE_STATES:
                by_state[(app, state)] = 0
        for app, _instance, state in s.states:
            by_state[(app, state)] = by_state.get((app, state), 0) + 1
        instances = GaugeMetricFamily(
            "keelway_instances", "Instances by the state `keelway status` shows.",
            labels=("app", "state"))
        for labels, n in sorted(by_state.items()):
            instances.add_metric(list(labels), n)
        yield instances
        if s.per_instance:
            each = GaugeMetricFamily(
                "keelway_instance_state", "1 for the state each instance is in.",
                labels=("app", "instance", "state"))
            for app, instance, state in sorted(s.states):
                each.add_metric([app, instance, state], 1)
            yield each
        drills = GaugeMetricFamily(
            "keelway_restore_drill_last", "Instances whose last restore drill passed "
            "(result=ok) or failed.", labels=(*self._keys(), "result"))
        drilled: dict[tuple[str, ...], int] = {}
        for d in s.drills:
            key = (*self._key(d.app, d.instance), "ok" if d.ok else "failed")
            drilled[key] = drilled.get(key, 0) + 1
        for drill_labels, n in sorted(drilled.items()):
            drills.add_metric(list(drill_labels), n)
        yield drills
        if s.per_instance:
            at = GaugeMetricFamily("keelway_restore_drill_last_timestamp_seconds",
                                   "When each instance's last restore drill ran.",
                                   labels=("app", "instance"))
            for d in sorted(s.drills, key=lambda d: (d.app, d.instance)):
                at.add_metric([d.app, d.instance], d.at)
            yield at

    def _journal(self, s: Scrape) -> Iterator[Metric]:
        operations = CounterMetricFamily(
            "keelway_operations", "Operations by kind (deploy, rollback, park, wake, "
            "freeze, restart-crashed, certify, ...) and outcome, from the journal; a "
            "failed deploy, rollback or config fell back.",
            labels=("app", "kind", "outcome"))
        for app, kind, outcome, n in sorted(s.operations):
            operations.add_metric([app, kind, outcome], n)
        yield operations
        rollouts = CounterMetricFamily(
            "keelway_rollouts", "Rollouts by where they stand or how they ended.",
            labels=("app", "state"))
        for app, state, n in sorted(s.rollouts):
            rollouts.add_metric([app, state], n)
        yield rollouts
        wakes = HistogramMetricFamily(
            "keelway_wake_duration_seconds", "How long each succeeded wake took, from "
            "its operation's start to its end (a held request waits about this long).",
            labels=("app",))
        for app, h in sorted(s.wakes.items()):
            wakes.add_metric([app], _buckets(h), sum_value=h.sum_s)
        yield wakes


def _buckets(h: Histogram) -> list[tuple[str, float]]:
    return [*((_le(b), float(n)) for b, n in zip(h.bounds_s, h.within, strict=True)),
            ("+Inf", float(h.count))]


def _le(bound: float) -> str:
    # As prometheus_client writes its own bounds: 1.0, 0.005, 10.0.
    return repr(float(bound))


def exposition(scrape: Scrape) -> bytes:
    """The text format Prometheus scrapes, for one `Scrape`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ScrapeCollector(scrape))
    return generate_latest(registry)


CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
