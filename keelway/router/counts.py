"""Responses to clients per instance, as the router reports and sums them (pure).

The hot path counts into a `Tally` per instance (keelway/router/exchange.py); a process
reports its tallies as `InstanceCounts`, the main process sums its workers' reports and
its own (keelway/router/workers.py), and the control socket answers `ResponseCounts`.

Invariants:

- counts are cumulative for the life of one router (its `incarnation`): within it they
  never go down, across a worker's death too (the main process keeps what the dead
  worker last reported); a new incarnation (a restart, a takeover) begins at zero, so a
  reader compares two reports only when their incarnations match (`since`);
- an answer is the app's (`app`, by status class) when the instance's upstream sent its
  status, the router's own (`router`, by status: 502 upstream down, 503 a route that
  does not serve, a held request that could not wait or an instance at its bound of
  requests in flight, 504 upstream too slow, ...)
  when the router wrote it: a judge can tell an app's 500 from the router's 503;
- a request counts for the instance its route names (`CompiledRoute.instance`, the
  same for every alias), or for none: one with no route (404), the health path, and one
  the router refused to parse or bound (400, 408, 413, 431: the client's doing).
"""

from __future__ import annotations

from typing import Final

import msgspec

APP_CLASSES: Final = ("1xx", "2xx", "3xx", "4xx", "5xx")
# An app may send a status outside 100..599; it is counted, under this name.
OTHER: Final = "other"


def _plus(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    summed = dict(a)
    for key, n in b.items():
        summed[key] = summed.get(key, 0) + n
    return summed


class InstanceCounts(msgspec.Struct, frozen=True):
    """One instance's responses: `app` by status class ("2xx", ..., "other"), `router`
    (its own answers) by status ("503"); a key at zero is left out."""

    app: dict[str, int] = {}
    router: dict[str, int] = {}

    def total(self) -> int:
        return sum(self.app.values()) + sum(self.router.values())

    def app_5xx(self) -> int:
        return self.app.get("5xx", 0)

    def router_5xx(self) -> int:
        return sum(n for status, n in self.router.items() if status.startswith("5"))

    def plus(self, other: InstanceCounts) -> InstanceCounts:
        return InstanceCounts(app=_plus(self.app, other.app),
                              router=_plus(self.router, other.router))

    def minus(self, earlier: InstanceCounts) -> InstanceCounts:
        """What came after `earlier` (a report of the same incarnation)."""
        def less(now: dict[str, int], then: dict[str, int]) -> dict[str, int]:
            return {key: n - then.get(key, 0) for key, n in now.items() if n > then.get(key, 0)}
        return InstanceCounts(app=less(self.app, earlier.app),
                              router=less(self.router, earlier.router))


NONE: Final = InstanceCounts()


def summed(*reports: dict[str, InstanceCounts]) -> dict[str, InstanceCounts]:
    """Reports of several processes (or of one worker's lives) as one."""
    total: dict[str, InstanceCounts] = {}
    for report in reports:
        for instance, counts in report.items():
            mine = total.get(instance)
            total[instance] = counts if mine is None else mine.plus(counts)
    return total


class ResponseCounts(msgspec.Struct, frozen=True):
    """A router's responses per instance (its primary host) since it started: `started_at`
    (unix seconds) and `incarnation` (new for each router process that owns the control
    socket). `worker_restarts`: workers that died and were started again; each one's
    counts are kept as it last reported them (the main process asks on every report),
    so what it answered after its last report, before it died, is missing."""

    incarnation: str
    started_at: float
    instances: dict[str, InstanceCounts]
    worker_restarts: int = 0

    def of(self, instance: str) -> InstanceCounts:
        return self.instances.get(instance, NONE)

    def since(self, earlier: ResponseCounts) -> dict[str, InstanceCounts] | None:
        """Per instance, the responses since `earlier`; None when `earlier` is of another
        incarnation (the router restarted: what came between cannot be told)."""
        if earlier.incarnation != self.incarnation:
            return None
        return {instance: counts.minus(earlier.of(instance))
                for instance, counts in self.instances.items()}


report_encoder: Final = msgspec.json.Encoder()
report_decoder: Final = msgspec.json.Decoder(dict[str, InstanceCounts])
