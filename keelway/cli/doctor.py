"""`keelway doctor`: what needs a person on this box, each finding with what to do.
Exits 1 when one does, so a provisioning script can stop on it.

With the control plane up, the checks are its (keelway/api/doctor.py). With it down,
the CLI runs those that need nothing but the box (keelway/home_checks.py: the home's
permissions, its disk, whether the router that outlives the control plane still
answers and listens) and says the control plane is not running: a doctor is most
wanted when the daemon will not start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from keelway import home_checks
from keelway.cli.base import api_command, cli, client
from keelway.cli.client import ApiUnavailable
from keelway.cli.output import EXIT_FAILED, emit_json
from keelway.home import Home
from keelway.home_checks import Check, Severity

_MARKS = {Severity.OK.value: "ok  ", Severity.WARN.value: "warn", Severity.FAIL.value: "FAIL"}


@cli.command()
@api_command
def doctor(as_json: bool) -> None:
    """What needs a person on this box, and what to do: the router and its ports, disk
    space, the home's permissions, what the box enforces between tenants, instances
    failed closed, leftovers, stale replicas, failed drills, certificates near their
    end. Exits 1 when something needs a person."""
    home = Home.from_env()
    try:
        checks: list[dict[str, Any]] = client(60.0).request("GET", "/v1/doctor")["checks"]
        running = True
    except ApiUnavailable:
        checks, running = [c.view() for c in alone(home)], False
    if as_json:
        emit_json({"control_plane": running, "checks": checks})
    else:
        for check in checks:
            mark = _MARKS.get(check.get("severity", ""), "ok  " if check["ok"] else "FAIL")
            click.echo(f"{mark} {check['check']}: {check['detail']}")
            if check.get("fix"):
                click.echo(f"     fix: {check['fix']}")
    if home_checks.needs_person(checks):
        raise SystemExit(EXIT_FAILED)


def alone(home: Home) -> list[Check]:
    """What the CLI checks by itself while no control plane answers for `home`."""
    daemon = Check("control plane", Severity.FAIL,
                   f"keelway is not running for {home.root}, so only the box was checked",
                   "`keelway up -d` (or `systemctl start keelway` where "
                   "`keelway install-service` installed it); $KEELWAY_HOME/logs/keelway.log "
                   "says why an earlier one stopped")
    checks = [daemon]
    if home.root.exists():
        checks += home_checks.router_checks(
            home_checks.router_pid(home.router_socket), home.router_socket,
            home_checks.recorded_listeners(home.router_settings))
    return [*checks, home_checks.disk_check(_existing(home)),
            home_checks.permission_check(home.root, home.tenant_traversed)
            if home.root.exists() else
            Check("home permissions", Severity.OK, f"{home.root} does not exist yet")]


def _existing(home: Home) -> Path:
    """The home, or its nearest existing parent (before the first `up`): the disk it
    will be on."""
    path = home.root
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
