"""What the API shows: plain dicts built from records. No secrets ever pass here:
the instance env file is never read by this module, and config values are shown only
by the config endpoints (not status)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from keelway import certs
from keelway.api.instance_state import (
    RELEASING,
    SERVICE,
    InstanceStatus,
    decide,
    label,
)
from keelway.builds.build_step import BUILD_NICE, IONICE
from keelway.home import Home
from keelway.limits import format_size
from keelway.runtime.identities import Identities
from keelway.runtime.limits import build_in_force, in_force
from keelway.runtime.router_supervisor import RouterHealth
from keelway.runtime.supervisor import Supervisor
from keelway.runtime.tree import ProcessTrees
from keelway.store import Store
from keelway.store.imports import ImportJournal
from keelway.store.lifecycle import GenState, OpState, RouteState
from keelway.store.records import (
    Alias,
    CrashRetry,
    Event,
    Fence,
    Generation,
    Instance,
    InstanceView,
    Operation,
    Presence,
)


def generation_view(gen: Generation, presences: Mapping[int, Presence],
                    trees: ProcessTrees | None = None) -> dict[str, Any]:
    """One generation as status shows it; with `trees`, a live one's use of memory and
    CPU (None where the box cannot say)."""
    # A process proven gone has no pid (it may name another process by now) and holds
    # no port (its claim went with the proof): `presences` need hold only the live.
    seen = presences.get(gen.id) if gen.state is not GenState.GONE else None
    used = (trees.usage(gen.id, seen.leader) if trees is not None and seen is not None
            and seen.pid is not None else None)
    return {
        "id": gen.id, "service": gen.service, "state": gen.state.value,
        "pid": seen.pid if seen else None, "port": seen.port if seen else None,
        "release": f"v{gen.release}", "build": gen.build_digest[:12],
        "started_at": gen.created_at, "exit_code": gen.exit_code,
        # Why the kernel ended it, when it did: "killed: out of memory at its 512M limit".
        "exit_cause": gen.exit_cause,
        "memory_bytes": used.memory_bytes if used is not None else None,
        "cpu_s": round(used.cpu_s, 2) if used is not None and used.cpu_s is not None
        else None,
    }


@dataclass(frozen=True)
class Fleet:
    """Every instance's records that `status` shows, read in bulk: a fixed handful of
    queries however many instances there are (one instance at a time, 1,000 instances
    took some 15,000 queries), read without an await between them so they are one
    consistent picture of the one writer's store."""

    views: dict[str, InstanceView]
    active: dict[int, Generation]
    retries: dict[str, list[CrashRetry]]
    releasing: dict[str, Operation]
    service: dict[str, Operation]
    aliases: dict[str, list[Alias]]
    fences: dict[str, Fence]
    imports: dict[str, ImportJournal]
    presences: dict[int, Presence]
    now: float

    @classmethod
    def read(cls, store: Store) -> Fleet:
        views = {v.instance.host: v for v in store.instances.instance_views()}
        retries: dict[str, list[CrashRetry]] = {}
        for retry in store.generations.pending_retries():
            retries.setdefault(retry.instance, []).append(retry)
        aliases: dict[str, list[Alias]] = {}
        for alias in store.instances.list_aliases():
            aliases.setdefault(alias.instance, []).append(alias)
        live = [g.id for v in views.values() for g in v.live]
        return cls(
            views=views, active={g.id: g for g in store.generations.active_generations()},
            retries=retries,
            releasing={op.instance: op for op in store.ops.latest_operations_of(RELEASING)},
            service={op.instance: op for op in store.ops.latest_operations_of(SERVICE)},
            aliases=aliases, fences={f.instance: f for f in store.instances.list_fences()},
            imports={j.instance: j for j in store.imports.list_imports()},
            presences=store.local.presences(live), now=store.clock.now())

    def instances(self, app: str | None = None) -> list[Instance]:
        return [v.instance for v in self.views.values() if app is None or v.instance.app == app]

    def by_app(self) -> dict[str, list[Instance]]:
        """Every instance by its app, in the store's order (app, then host): one pass,
        where `instances(app)` for each of a thousand apps would be a thousand."""
        found: dict[str, list[Instance]] = {}
        for view in self.views.values():
            found.setdefault(view.instance.app, []).append(view.instance)
        return found

    def active_of(self, host: str) -> dict[str, Generation]:
        """The generations ACTIVE names on `host`, by service."""
        return {service: self.active[gen_id]
                for service, gen_id in self.views[host].active.items() if gen_id in self.active}

    def status(self, inst: Instance) -> InstanceStatus:
        """The instance's state by the one rule (keelway/api/instance_state.py)."""
        host = inst.host
        route = self.views[host].route
        return decide(inst, self.active_of(host), self.retries.get(host, []),
                      self.releasing.get(host), self.service.get(host), self.now,
                      frozen=route is not None and route.state is RouteState.FROZEN)


def state_view(status: InstanceStatus, inst: Instance) -> dict[str, Any]:
    """The state fields every view of an instance carries."""
    return {
        "state": status.state.value, "label": label(status),
        # What its record says its user asked for (or `down`, after a hold failure).
        "desired": inst.state.value,
        "release": f"v{status.release}" if status.release is not None else None,
        "serving": f"v{status.serving}" if status.serving is not None else None,
        "pending_release": (f"v{inst.pending_release}" if inst.pending_release is not None
                            else None),
        "next_retry_at": status.next_retry_at,
        "failed_operation": status.failed.value if status.failed is not None else None,
    }


def operation_view(op: Operation, with_steps: bool = True) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": op.id, "app": op.app, "instance": op.instance, "kind": op.kind,
        "state": op.state.value, "error": op.error, "warnings": op.warnings,
        "created_at": op.created_at, "finished_at": op.finished_at,
    }
    view["duration_s"] = _duration(op.created_at, op.finished_at)
    if with_steps:
        view["steps"] = [
            {"seq": s.seq, "name": s.name, "service": s.service, "state": s.state.value,
             "before": s.before_gen, "after": s.after_gen, "error": s.error,
             "detail": s.detail, "started_at": s.started_at, "finished_at": s.finished_at,
             "duration_s": _duration(s.started_at, s.finished_at)}
            for s in op.steps
        ]
    return view


def _duration(started_at: float, finished_at: float | None) -> float | None:
    return round(finished_at - started_at, 3) if finished_at is not None else None


def event_view(event: Event) -> dict[str, Any]:
    return {"id": event.id, "at": event.at, "instance": event.instance, "kind": event.kind,
            "message": event.message}


def unreleased_failures(store: Store, app: str) -> list[dict[str, Any]]:
    """Attempts that failed before their release was written (their processes never
    took traffic, so no release row names them), while no release has taken their
    number since: what `keelway releases` says after a failed first deploy."""
    numbers = {r.number for r in store.builds.list_releases(app)}
    return [{"version": f"v{a.release}", "build": a.build_digest[:12], "instance": a.instance,
             "operation": a.op_id}
            for a in store.ops.release_attempts(app, RELEASING)
            if a.state is OpState.FAILED and a.release not in numbers]


def releases_view(store: Store, app: str) -> list[dict[str, Any]]:
    """The app's releases, newest first: what each ran (its build and where that came
    from), which instances run it now (the release their status shows), and where it
    was tried and failed: the newest operation that started its processes there
    failed, and no instance runs it there."""
    fleet = Fleet.read(store)
    statuses = {inst.host: fleet.status(inst) for inst in fleet.instances(app)}
    failed: dict[tuple[int, str], set[str]] = {}
    for attempt in store.ops.release_attempts(app, RELEASING):
        if attempt.state is OpState.FAILED:
            failed.setdefault((attempt.release, attempt.build_digest), set()).add(
                attempt.instance)
    out = []
    for r in store.builds.list_releases(app):
        # Serving it is what clears a failure there (a restart that took, say); naming
        # it in ACTIVE is not (a release that failed with nothing to fall back to).
        tried = failed.get((r.number, r.build_digest), set())
        failed_on = sorted(h for h in tried if h not in statuses
                           or statuses[h].serving != r.number)
        current = sorted(h for h, st in statuses.items()
                         if st.release == r.number and h not in failed_on)
        out.append({"version": r.label, "number": r.number, "build": r.build_digest[:12],
                    "description": r.description, "created_at": r.created_at,
                    "source": r.source, "current": current, "failed_on": failed_on})
    return out


DRILL_EVENTS = ("drill", "drill-failed")


def last_drills(store: Store, app: str) -> dict[str, dict[str, Any]]:
    """The latest restore drill of each instance of `app`, from its events
    (keelway/deploy/replication.py writes one per drill)."""
    found: dict[str, dict[str, Any]] = {}
    for event in store.ops.list_events(app, limit=500):
        if event.kind in DRILL_EVENTS and event.instance is not None:
            found[event.instance] = {"ok": event.kind == "drill", "at": event.at,
                                     "message": event.message}
    return found


def router_view(health: RouterHealth) -> dict[str, Any]:
    """The router's health for `status`: who serves, since when, and if it is down,
    why and when the next start is tried."""
    return {
        "state": health.state.value, "pid": health.pid, "addr": health.addr,
        "workers": health.workers, "adopted": health.adopted, "up_since": health.up_since,
        "down_since": health.down_since, "restarts": health.restarts,
        "last_restart_reason": health.last_restart_reason,
        "last_restart_at": health.last_restart_at, "next_retry_at": health.next_retry_at,
        "last_error": health.last_error, "death_watch": health.death_watch,
    }


def isolation_view(identities: Identities) -> dict[str, Any]:
    """Whether each tenant runs as a uid of its own, and why not (keelway/identity.py)."""
    return {"uid_per_instance": identities.in_force,
            "shared_because": identities.shared_because}


def certificate_check(home: Home, on: bool) -> dict[str, Any]:
    """Doctor's word on ACME: which names the CA has not issued for, and why."""
    failing = certs.backoffs(home)
    if not on:
        return {"check": "certificates", "ok": True,
                "detail": "no certificates are ordered here (HTTPS or ACME is off)"}
    if not failing:
        return {"check": "certificates", "ok": True,
                "detail": "every name that wanted a certificate from the CA got one"}
    worst = sorted(failing.values(), key=lambda b: b.name)
    return {"check": "certificates", "ok": False,
            "detail": "; ".join(f"{b.name}: {b.error} ({b.failures} tries)" for b in worst[:5])
            + (f"; and {len(worst) - 5} more" if len(worst) > 5 else "")
            + "; see `keelway certs list`, fix the name's DNS or the CA's complaint, then "
              "`keelway certs renew NAME`"}


def doctor_checks(supervisor: Supervisor) -> list[dict[str, Any]]:
    """What this box enforces between tenants, and what it cannot: each check with what
    to do about it."""
    identities = supervisor.identities
    trees = supervisor.trees
    return [
        {"check": "uid per instance", "ok": identities.in_force,
         "detail": ("each instance runs as a uid of its own, each app in a group of its own"
                    if identities.in_force else f"tenants share a uid: "
                    f"{identities.shared_because}")},
        {"check": "process trees", "ok": trees.uses_cgroups,
         "detail": (f"each generation in its own cgroup ({trees.describe()})"
                    if trees.uses_cgroups else
                    "no writable cgroup: a generation's tree is found by scanning /proc, so "
                    "a descendant that calls setsid() and clears its environment escapes a "
                    "stop; run keelway as root on a box with cgroups")},
        *limit_checks(supervisor),
    ]


def limit_checks(supervisor: Supervisor) -> list[dict[str, Any]]:
    """Each limit of a tenant's process tree: its default here and what enforces it,
    or that this box cannot (keelway/runtime/limits.py)."""
    checks = []
    for name, said in in_force(supervisor.limits, supervisor.trees.enforces(),
                               supervisor.identities.in_force).items():
        how = said["enforced_by"]
        value = said["value"] or "none"
        checks.append({
            "check": f"{name} limit", "ok": how is not None,
            "detail": (f"default {value}, enforced by {how}" if how is not None else
                       f"default {value}, not enforced on this box: no {name} controller "
                       "in reach; run keelway as root on a box with cgroup v2 (or v1's "
                       f"{name} hierarchy mounted)")})
    budget = supervisor.trees.apps_budget()
    checks.append({
        "check": "apps' memory together", "ok": budget is not None,
        "detail": (f"every app of this home together at most {format_size(budget)}, so "
                   "keelway, the router and the kernel keep the rest" if budget is not None
                   else "not bounded: no memory controller in reach")})
    return checks + build_limit_checks(supervisor)


def build_limit_checks(supervisor: Supervisor) -> list[dict[str, Any]]:
    """Each limit of a build (an app's [build] may ask for less, never more) and what
    enforces it, and the priority builds run at (keelway/builds/build_step.py)."""
    checks = []
    for name, said in build_in_force(supervisor.build_limits,
                                     supervisor.trees.enforces()).items():
        how = said["enforced_by"]
        checks.append({
            "check": f"build {name} limit", "ok": how is not None,
            "detail": (f"at most {said['value']}, enforced by {how}" if how is not None else
                       f"at most {said['value']}, not enforced on this box: no memory "
                       "controller in reach, and an address-space rlimit would break "
                       "runtimes such as Go and Node; run keelway as root on a box with "
                       "cgroup v2 (or v1's memory hierarchy mounted)")})
    io = ("the idle I/O class" if IONICE is not None else
          "no `ionice` on this box, so build I/O competes with the apps' (install util-linux)")
    weighted = (", each build step's cgroup weighted as nice 10 against the apps'"
                if "cpu" in supervisor.trees.enforces() else "")
    checks.append({"check": "build priority", "ok": True,
                   "detail": f"build steps at nice {BUILD_NICE}{weighted}; {io}"})
    return checks
