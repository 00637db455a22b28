"""Replicas of instance databases: `db replicas` and `db drill` (the one `db restore`
command, --from-replica too, is in keelway/cli/data.py)."""

from __future__ import annotations

import sys

import click

from keelway.cli.base import answered, api_command, client, instance_path
from keelway.cli.data import db


@db.command()
@click.argument("host")
@api_command
def replicas(host: str, as_json: bool) -> None:
    """What HOST's replica holds: its files, latest position and time, and lag."""
    data = client().request("GET", instance_path(host, "replica"))
    if answered(data, as_json):
        return
    click.echo(f"{host}: {data['url']}")
    click.echo(f"  replicating: {'yes' if data['replicating'] else 'no'}")
    files = ", ".join(f"level {lvl}: {n}" for lvl, n in sorted(data["files"].items()))
    click.echo(f"  files: {files or 'none'}")
    click.echo(f"  latest: txid {data['latest_txid']} at {data['latest_at']}")
    behind = data["behind_txids"]
    click.echo(f"  behind: {'?' if behind is None else behind} transactions")


@db.command()
@click.argument("host", required=False)
@api_command
def drill(host: str | None, as_json: bool) -> None:
    """Restore the newest snapshot and the latest replica of HOST (or of every
    instance) to temp files and verify both; exit 1 if any fails."""
    data = client().request("POST", "/v1/drill", {"host": host})
    if not answered(data, as_json):
        for item in data["results"]:
            copies = []
            for copy in ("snapshot", "replica"):
                said = item[copy]
                copies.append(f"{copy} " + ("skipped (" + said["skipped"] + ")"
                                            if said["ok"] is None else "ok" if said["ok"]
                                            else f"FAILED: {said['reason']}"))
            click.echo(f"{item['host']}: {'; '.join(copies)}")
    if not data["ok"]:
        sys.exit(1)
