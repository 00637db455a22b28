"""What `status` and `instances list` answer: every instance of an app counted, the
ones that need a person named, and the instances themselves whole or a page at a time.

Rules:
- One bulk read (views.Fleet, a fixed handful of queries) serves every instance: no
  query is made per instance, and the certificate store is listed once, so a name with
  no certificate costs no stat of its own.
- The summary counts every instance of an app, whatever page is asked: by state (the one
  rule, keelway/api/instance_state.py), by release, and those that need attention.
- Whether an instance needs attention is decided here alone (`needs`), as codes its view
  carries; the CLI words each one and decides nothing.
- A page costs the views of its own instances and of at most a page's worth of those
  that need attention: page 1 of 10,000 parked instances builds 20 views, not 10,000.
- Without a page every instance is shown whole, as `status --json` always was: the
  scripts and tests that read it see every instance and every field.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from keelway import certs
from keelway.api.instance_state import InstanceStatus, Shown, label
from keelway.api.views import (
    Fleet,
    generation_view,
    last_drills,
    operation_view,
    state_view,
)
from keelway.deploy.errors import UserError
from keelway.home import Home
from keelway.journal import REPLICA
from keelway.reconcile.plan import leftovers as unconverged
from keelway.runtime.tree import ProcessTrees
from keelway.store import Store
from keelway.store.lifecycle import InstanceState, OpState
from keelway.store.records import Instance
from keelway.store.rollouts import OPEN as OPEN_ROLLOUTS

# How many instances a page shows unless asked otherwise.
PER_PAGE = 20
# A certificate this close to its end needs a person.
CERT_WARN_S = 14 * 86400


@dataclass(frozen=True)
class Page:
    """Page `number` (from 1) of `size` instances of each app."""

    number: int
    size: int = PER_PAGE

    @classmethod
    def parse(cls, number: str | None, size: str | None) -> Page | None:
        """The page a query asks for (None: every instance); a bad one is a UserError
        that names it, before anything is read."""
        if number is None and size is None:
            return None
        return cls(_positive("page", number, 1), _positive("per_page", size, PER_PAGE))

    def of(self, items: Sequence[Instance]) -> Sequence[Instance]:
        start = (self.number - 1) * self.size
        return items[start:start + self.size]

    def view(self, total: int) -> dict[str, int]:
        return {"number": self.number, "size": self.size,
                "pages": max(1, math.ceil(total / self.size)), "total": total}


def _positive(name: str, text: str | None, default: int) -> int:
    if text is None:
        return default
    if not text.isdigit() or int(text) < 1:
        raise UserError(f"{name} must be a whole number of at least 1, not {text!r}",
                        hint="pages count from 1: `keelway status APP --page 2`")
    return int(text)


@dataclass(frozen=True)
class Seen:
    """What `status` reads beside the store, once per answer: where the router serves,
    the operations live now, the process trees, and the home's certificates (the
    names that have one, and those the CA has not issued for yet)."""

    http_port: int | None
    live_ops: frozenset[int]
    trees: ProcessTrees | None
    certs_dir: Path | None
    cert_names: frozenset[str]
    cert_failures: dict[str, certs.CertBackoff]

    @classmethod
    def read(cls, http_port: int | None, live_ops: set[int] | frozenset[int],
             home_root: Path | None) -> Seen:
        if home_root is None:
            return cls(http_port, frozenset(live_ops), None, None, frozenset(), {})
        home = Home(home_root)
        try:
            names = frozenset(n for n in os.listdir(home.certs_dir) if not n.startswith("."))
        except OSError:  # no certificates yet
            names = frozenset()
        return cls(http_port, frozenset(live_ops), ProcessTrees.found(home_root),
                   home.certs_dir, names, certs.backoffs(home))

    def not_after(self, name: str) -> float | None:
        if self.certs_dir is None or name not in self.cert_names:
            return None
        return certs.not_after(self.certs_dir, name)


@dataclass(frozen=True)
class Needs:
    """Why an instance needs a person (`codes`; none: it does not), with what its view
    shows of the two reasons that take a look of their own to find."""

    codes: list[str]
    failed_closed: dict[str, Any] | None
    expiring: list[str]


@dataclass(frozen=True)
class AppInstances:
    """One app's instances, each with its state by the one rule, and what reading any
    one's whole view needs."""

    fleet: Fleet
    seen: Seen
    drills: dict[str, dict[str, Any]]
    instances: list[Instance]
    statuses: dict[str, InstanceStatus]

    @classmethod
    def of(cls, store: Store, fleet: Fleet, seen: Seen, app: str,
           instances: list[Instance]) -> AppInstances:
        return cls(fleet, seen, last_drills(store, app), instances,
                   {inst.host: fleet.status(inst) for inst in instances})

    def names(self, host: str) -> tuple[str, ...]:
        """The names the instance serves: its host, then its aliases."""
        aliases = self.fleet.aliases.get(host)
        return (host, *(a.host for a in aliases)) if aliases else (host,)

    def failed_closed(self, host: str) -> dict[str, Any] | None:
        view = self.fleet.views[host]
        latest = view.latest
        stuck = unconverged(latest, set(view.active.values()),
                            latest is not None and latest.id in self.seen.live_ops)
        if not stuck or latest is None:
            return None
        return {"operation": latest.id,
                "leftovers": sorted({f"{s.service} generation {s.after_gen}" for s in stuck}),
                "warnings": latest.warnings,
                "next": "stop the leftover process, then `keelway reconcile`"}

    def expiring(self, names: tuple[str, ...]) -> list[str]:
        """Those of `names` whose certificate ends within CERT_WARN_S (or has ended)."""
        if not self.seen.cert_names:  # the common case at density: no certificates here
            return []
        return [name for name in names
                if (at := self.seen.not_after(name)) is not None
                and at - self.fleet.now < CERT_WARN_S]

    def needs(self, inst: Instance) -> Needs:
        """Why the instance needs a person: each reason a code, in the order the CLI
        says them. Asked of every instance for the summary, so each test is a lookup."""
        host = inst.host
        shown = self.statuses[host].state
        fence = self.fleet.fences.get(host)
        drill = self.drills.get(host)
        latest = self.fleet.views[host].latest
        names = self.names(host)
        closed = self.failed_closed(host)
        expiring = self.expiring(names)
        codes = []
        if inst.state is InstanceState.DOWN:
            codes.append("down")
        if shown is Shown.CRASHED:
            codes.append("crashed")
        if shown is Shown.FAILED:
            codes.append("failed")
        if closed is not None:
            codes.append("failed-closed")
        if fence is not None and fence.held:
            codes.append("fenced")
        if drill is not None and not drill["ok"]:
            codes.append("drill-failed")
        if expiring:
            codes.append("certificate-expiring")
        if self.seen.cert_failures and any(n in self.seen.cert_failures for n in names):
            codes.append("certificate-failing")
        if latest is not None and latest.state is OpState.FAILED:
            codes.append("operation-failed")
        return Needs(codes, closed, expiring)

    def view(self, inst: Instance, needs: Needs) -> dict[str, Any]:
        """The instance whole, as `status` shows it."""
        fleet, seen, host = self.fleet, self.seen, inst.host
        view = fleet.views[host]
        active_ids = set(view.active.values())
        services = [generation_view(gen, fleet.presences, seen.trees) | {"active": True}
                    for _service, gen in sorted(fleet.active_of(host).items())]
        services += [generation_view(gen, fleet.presences, seen.trees) | {"active": False}
                     for gen in view.live if gen.id not in active_ids]
        status = self.statuses[host]
        route = view.route
        fence = fleet.fences.get(host)
        seed = fleet.imports.get(host)
        latest = view.latest
        port = f":{seen.http_port}" if seen.http_port else ""
        names = self.names(host)
        return {
            **state_view(status, inst),
            "host": host, "url": f"http://{host}{port}/",
            # The crash loops waiting out their backoff, as the state rule counts them.
            "crashed": [{"service": r.service, "generation": r.generation_id,
                         "failures": r.failures, "retry_at": r.retry_at}
                        for r in status.crashed],
            "aliases": list(names[1:]),
            "down_reason": inst.down_reason, "failed_closed": needs.failed_closed,
            "route": ({"state": route.state.value, "port": route.port} if route else None),
            "fence": ({"generation": fence.generation, "held": fence.held,
                       "reason": fence.reason} if fence is not None else None),
            # An import in effect, or being rolled back (never `env_before`: secrets).
            "seed": {"seed": seed.seed, "state": seed.state} if seed is not None else None,
            "processes": services,
            "drill": self.drills.get(host),
            "last_operation": operation_view(latest, with_steps=False) if latest else None,
            # When the certificate HTTPS serves each of its names with expires (None:
            # it has none), read where status is.
            "certificates": ({name: seen.not_after(name) for name in names}
                             if seen.certs_dir is not None else {}),
            "certificates_expiring": needs.expiring,
            # Its names the CA has not issued for, backing off (deploy/certify.py).
            "certificate_failures": [seen.cert_failures[name].view() for name in names
                                     if name in seen.cert_failures],
            "attention": needs.codes,
        }

    def leftovers(self) -> list[dict[str, Any]]:
        """Live generations no record names: not ACTIVE's, not the replicator (its own
        record names it), not attended by a live operation (a one-off run)."""
        found = []
        for inst in self.instances:
            view = self.fleet.views[inst.host]
            active_ids = set(view.active.values())
            for gen in view.live:
                if gen.id in active_ids or gen.service == REPLICA:
                    continue
                if gen.op_id is None or gen.op_id not in self.seen.live_ops:
                    found.append({"instance": inst.host, **generation_view(
                        gen, self.fleet.presences, self.seen.trees), "active": False})
        return found

    def summary(self, attention: int) -> dict[str, Any]:
        releases = Counter(f"v{s.release}" for s in self.statuses.values()
                           if s.release is not None)
        return {"instances": len(self.instances),
                "states": dict(Counter(s.state.value for s in self.statuses.values())),
                "releases": dict(releases), "attention": attention}

    def shown(self, page: Page | None) -> dict[str, Any]:
        """The app's summary and its instances: every one whole, or page `page` of them
        and, whichever page their rows are on, the first page's worth that need
        attention (the summary counts every one)."""
        needs = {inst.host: self.needs(inst) for inst in self.instances}
        flagged = [inst for inst in self.instances if needs[inst.host].codes]
        out: dict[str, Any] = {"summary": self.summary(len(flagged))}
        if page is None:
            out["instances"] = [self.view(inst, needs[inst.host]) for inst in self.instances]
            return out
        out["instances"] = [self.view(inst, needs[inst.host])
                            for inst in page.of(self.instances)]
        out["attention"] = [self.view(inst, needs[inst.host])
                            for inst in flagged[:page.size]]
        out["page"] = page.view(len(self.instances))
        return out


def status_json(store: Store, http_port: int | None, app_filter: str | None,
                live_ops: set[int], extra: dict[str, object],
                home_root: Path | None = None, page: Page | None = None) -> bytes:
    """`status_view` with `extra` over it, encoded: what `status` answers, made where
    it is read (Store.read_aside), with each live process's use of memory and CPU read
    there too (the home's trees as the box has them: `home_root`)."""
    seen = Seen.read(http_port, live_ops, home_root)
    return msgspec.json.encode(status_view(store, seen, app_filter, page) | extra)


def status_view(store: Store, seen: Seen, app_filter: str | None,
                page: Page | None = None) -> dict[str, Any]:
    apps = [a for a in store.apps.list_apps() if app_filter is None or a.name == app_filter]
    pinned = store.builds.pinned_builds()
    fleet = Fleet.read(store)
    by_app = fleet.by_app()
    out: list[dict[str, Any]] = []
    leftovers: list[dict[str, Any]] = []
    for app in apps:
        shown = AppInstances.of(store, fleet, seen, app.name, by_app.get(app.name, []))
        leftovers += shown.leftovers()
        releases = store.builds.list_releases(app.name)
        rollout = store.rollouts.latest_rollout(app.name)
        out.append({
            "name": app.name,
            "release": releases[0].label if releases else None,
            # Where its latest rollout stands, while it may still act (running, paused,
            # halted): a fleet on two releases says so, and why.
            "rollout": ({"release": f"v{rollout.release}", "state": rollout.state.value,
                         "cohort": rollout.cohort + 1, "cohorts": len(rollout.cohorts),
                         "reason": rollout.reason}
                        if rollout is not None and rollout.state in OPEN_ROLLOUTS else None),
            **shown.shown(page),
            "builds": [
                {"digest": b.digest, "good": b.good, "pinned": (b.app, b.digest) in pinned}
                for b in store.builds.list_builds(app.name)
            ],
        })
    return {"apps": out, "leftovers": leftovers}


def instances_json(store: Store, app: str, http_port: int | None,
                   page: Page | None = None, home_root: Path | None = None) -> bytes:
    """What `instances list` answers: the app's summary (as `status` counts it) and its
    instances, every one or a page; made where it is read (Store.read_aside)."""
    seen = Seen.read(http_port, frozenset(), home_root)
    fleet = Fleet.read(store)
    shown = AppInstances.of(store, fleet, seen, app, fleet.by_app().get(app, []))
    needs = {inst.host: shown.needs(inst).codes for inst in shown.instances}
    listed = shown.instances if page is None else page.of(shown.instances)
    port = f":{http_port}" if http_port else ""
    out: dict[str, Any] = {
        "app": app,
        "summary": shown.summary(sum(1 for codes in needs.values() if codes)),
        "instances": [
            {"host": i.host, "app": i.app, "state": shown.statuses[i.host].state.value,
             "label": label(shown.statuses[i.host]), "desired": i.state.value,
             "adding": i.adding, "aliases": list(shown.names(i.host)[1:]),
             "config": sorted(i.config), "url": f"http://{i.host}{port}/",
             "attention": needs[i.host]}
            for i in listed]}
    if page is not None:
        out["page"] = page.view(len(shown.instances))
        out["attention"] = [{"host": i.host, "attention": needs[i.host]}
                            for i in shown.instances if needs[i.host]][:page.size]
    return msgspec.json.encode(out)
