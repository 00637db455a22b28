"""What the API shows: plain dicts built from records. No secrets ever pass here:
the instance env file is never read by this module, and config values are shown only
by the config endpoints (not status)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from keelway.api.instance_state import (
    RELEASING,
    SERVICE,
    InstanceStatus,
    decide,
    label,
)
from keelway.journal import REPLICA
from keelway.reconcile.plan import leftovers as unconverged
from keelway.runtime.identities import Identities
from keelway.runtime.router_supervisor import RouterHealth
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.lifecycle import GenState, OpState
from keelway.store.records import Event, Generation, Instance, Operation, Presence
from keelway.store.rollouts import OPEN as OPEN_ROLLOUTS


def generation_view(gen: Generation, presences: Mapping[int, Presence]) -> dict[str, Any]:
    # A process proven gone has no pid (it may name another process by now) and holds
    # no port (its claim went with the proof): `presences` need hold only the live.
    seen = presences.get(gen.id) if gen.state is not GenState.GONE else None
    return {
        "id": gen.id, "service": gen.service, "state": gen.state.value,
        "pid": seen.pid if seen else None, "port": seen.port if seen else None,
        "release": f"v{gen.release}", "build": gen.build_digest[:12],
        "started_at": gen.created_at, "exit_code": gen.exit_code,
    }


def instance_status(store: Store, inst: Instance) -> InstanceStatus:
    """The instance's state by the one rule (keelway/api/instance_state.py), read from
    the store."""
    active: dict[str, Generation] = {}
    for row in store.generations.list_active(inst.host):
        if (gen := store.generations.get_generation(row.generation_id)) is not None:
            active[row.service] = gen
    return decide(inst, active, store.generations.pending_retries(inst.host),
                  store.ops.latest_operation_of(inst.host, RELEASING),
                  store.ops.latest_operation_of(inst.host, SERVICE), store.clock.now())


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
    statuses = {inst.host: instance_status(store,
                                           inst) for inst in store.instances.list_instances(app)}
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


def status_view(store: Store, http_port: int | None, app_filter: str | None,
                live_ops: set[int] | None = None) -> dict[str, Any]:
    apps = [a for a in store.apps.list_apps() if app_filter is None or a.name == app_filter]
    pinned = store.builds.pinned_builds()
    out: list[dict[str, Any]] = []
    leftovers: list[dict[str, Any]] = []
    presences = store.local.presences(g.id for g in store.generations.live_generations())
    for app in apps:
        drills = last_drills(store, app.name)
        releases = store.builds.list_releases(app.name)
        instances = []
        for inst in store.instances.list_instances(app.name):
            active = {a.service: a.generation_id for a in store.generations.list_active(inst.host)}
            live = store.generations.live_generations(inst.host)
            route = store.routes.get_route(inst.host)
            latest = store.ops.latest_operation(inst.host)
            services = []
            for _service, gen_id in sorted(active.items()):
                gen = store.generations.get_generation(gen_id)
                if gen is not None:
                    services.append(generation_view(gen, presences) | {"active": True})
            for gen in live:
                if gen.id not in active.values():
                    item = generation_view(gen, presences) | {"active": False}
                    services.append(item)
                    # A generation its live operation attends (a one-off run) is no
                    # leftover, though ACTIVE does not name it; nor is the replicator,
                    # which its own record names (keelway/data/replicas.py).
                    if gen.service == REPLICA:
                        continue
                    if gen.op_id is None or gen.op_id not in (live_ops or set()):
                        leftovers.append({"instance": inst.host, **item})
            url = f"http://{inst.host}:{http_port}/" if http_port else f"http://{inst.host}/"
            stuck = unconverged(latest, set(active.values()),
                                latest is not None and latest.id in (live_ops or set()))
            failed_closed = None
            if stuck:
                failed_closed = {
                    "operation": latest.id if latest else None,
                    "leftovers": sorted({f"{s.service} generation {s.after_gen}"
                                         for s in stuck}),
                    "warnings": latest.warnings if latest else [],
                    "next": "stop the leftover process, then `keelway reconcile`",
                }
            status = instance_status(store, inst)
            # The crash loops waiting out their backoff, as the state rule counts them.
            crashed = [{"service": r.service, "generation": r.generation_id,
                        "failures": r.failures, "retry_at": r.retry_at}
                       for r in status.crashed]
            instances.append({
                **state_view(status, inst),
                "host": inst.host, "url": url, "crashed": crashed,
                "aliases": [a.host for a in store.instances.list_aliases(inst.host)],
                "down_reason": inst.down_reason, "failed_closed": failed_closed,
                "route": ({"state": route.state.value, "port": route.port} if route else None),
                "fence": ({"generation": fence.generation, "held": fence.held,
                           "reason": fence.reason}
                          if (fence := store.instances.get_fence(inst.host)) is not None else None),
                # An import in effect, or being rolled back (never `env_before`: secrets).
                "seed": ({"seed": seed.seed, "state": seed.state}
                         if (seed := store.imports.get_import(inst.host)) is not None else None),
                "processes": services,
                "drill": drills.get(inst.host),
                "last_operation": operation_view(latest, with_steps=False) if latest else None,
            })
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
            "instances": instances,
            "builds": [
                {"digest": b.digest, "good": b.good, "pinned": (b.app, b.digest) in pinned}
                for b in store.builds.list_builds(app.name)
            ],
        })
    return {"apps": out, "leftovers": leftovers}


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
    ]
