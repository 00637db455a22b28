"""`keelway doctor`: what this box enforces between tenants and what it cannot, each
with what to do. Exits 1 when a check fails, so a provisioning script can stop on it."""

from __future__ import annotations

import click

from keelway.cli.base import api_command, cli, client
from keelway.cli.output import EXIT_FAILED, emit_json


@cli.command()
@api_command
def doctor(as_json: bool) -> None:
    """What is wrong with this box, and what to do."""
    checks = client().request("GET", "/v1/doctor")["checks"]
    if as_json:
        emit_json({"checks": checks})
    else:
        for check in checks:
            mark = "ok  " if check["ok"] else "FAIL"
            click.echo(f"{mark} {check['check']}: {check['detail']}")
    if not all(check["ok"] for check in checks):
        raise SystemExit(EXIT_FAILED)
