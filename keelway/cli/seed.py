"""Seed imports: `seed import H SOURCE`, `seed rollback H`, `seed status H`.

SOURCE is a stored snapshot (`SNAPID`, or `HOST/SNAPID` when two instances hold that id)
or a path to an SQLite file, made absolute here since the daemon does not share this
shell's working directory (`./NAME` is a path even when NAME looks like an id). A
rollback that holds or defers exits 1: the journal keeps the rest.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from keelway import names
from keelway.cli.base import answered, api_command, cli, client, instance_path


def _path(host: str, *verb: str) -> str:
    return instance_path(host, "seed", *verb)


@cli.group()
def seed() -> None:
    """Import a database into an instance, undo it, see where it stands."""


def _say(data: dict[str, Any]) -> None:
    outcome = data["outcome"]
    if outcome == "dry-run":
        click.echo(f"dry run: {data['reason'] or 'would import'}")
        for step in data["plan"]:
            click.echo(f"  - {step}")
        _say_contents(data.get("contents"))
    elif outcome == "imported":
        click.echo(f"imported {data['seed']} into {data['host']}")
        _say_contents(data.get("contents"))
    elif outcome == "rolled-back":
        click.echo(f"rolled back {data['seed']} on {data['host']}")
    else:
        click.echo(f"{data['host']}: {outcome}: {data['reason']}")


def _say_contents(contents: dict[str, Any] | None) -> None:
    """What the import brings: a stale copy (one taken without its -wal) shows here as
    missing tables or rows, which no check of the file itself can tell."""
    if contents is None:
        return
    wal = "with the -wal beside it" if contents["wal"] else "no -wal beside it"
    click.echo(f"the seed ({wal}, {contents['need_bytes']} bytes of data) holds "
               f"{len(contents['tables'])} table(s):")
    for table in contents["tables"]:
        click.echo(f"  {table['name']}: {table['rows']} rows")


@seed.command(name="import")
@click.argument("host")
@click.argument("source")
@click.option("--dry-run", is_flag=True, help="Verify and say what would happen.")
@click.option("--allow-empty", is_flag=True,
              help="Import a seed with no tables (or 0 bytes) on purpose.")
@api_command
def import_(host: str, source: str, dry_run: bool, allow_empty: bool, as_json: bool) -> None:
    """Import SOURCE into instance HOST: a snapshot id of any instance (HOST2/SNAPID
    when two hold it) or a path to an SQLite file, read with the -wal beside it if there
    is one; verified, then stored first. Says what it brings: tables and row counts."""
    try:
        snapshot = names.seed_snapshot(source)
    except names.InvalidName:
        snapshot = None  # not a host: the daemon says so, for the path it then is
    sent = source if snapshot is not None else os.path.abspath(source)
    data = client(None).request("POST", _path(host, "import"),
                                {"source": sent, "dry_run": dry_run,
                                 "allow_empty": allow_empty})
    if not answered(data, as_json):
        _say(data)


@seed.command()
@click.argument("host")
@click.option("--dry-run", is_flag=True, help="Say what the rollback would do.")
@api_command
def rollback(host: str, dry_run: bool, as_json: bool) -> None:
    """Roll back the seed import of HOST, from wherever its journal stands."""
    data = client(None).request("POST", _path(host, "rollback"), {"dry_run": dry_run})
    if not answered(data, as_json):
        _say(data)
    if data["outcome"] not in ("rolled-back", "dry-run", "nothing"):
        sys.exit(1)


@seed.command()
@click.argument("host")
@api_command
def status(host: str, as_json: bool) -> None:
    """The import journaled at HOST, its record, route and marker."""
    data = client().request("GET", _path(host))
    if answered(data, as_json):
        return
    journal = data["journal"]
    if journal is None:
        click.echo(f"{host}: no import journaled")
    else:
        click.echo(f"{host}: import {journal['seed']} is {journal['state']} (fence "
                   f"generation {journal['fence_generation']})")
    record = data["record"]
    if record and record["seed"]:
        click.echo(f"  record: {record['seed']} {record['state']}")
    if data["marker"]:
        click.echo(f"  marker: {data['marker']} at {data['database']}")
