"""An instance's data by hand: `keelway db snapshot|snapshots|verify|restore|kept|forget`."""

from __future__ import annotations

import datetime
from typing import Any

import click

from keelway.cli.base import answered, api_command, cli, client, instance_path
from keelway.cli.plans import dry_run_option


def _path(host: str, *rest: str) -> str:
    return instance_path(host, "snapshots", *rest)


def _when(epoch_s: float) -> str:
    return datetime.datetime.fromtimestamp(epoch_s, tz=datetime.UTC).strftime(
        "%Y-%m-%d %H:%M:%S UTC")


def _line(snap: dict[str, Any]) -> str:
    release = f"v{snap['release']}" if snap.get("release") is not None else "-"
    return (f"{snap['id']}  {_when(snap['taken_at'])}  {snap['size']:>12} bytes  "
            f"{release:>5}  schema {snap['schema_version']}  sha256 {snap['sha256'][:12]}")


@cli.group()
def db() -> None:
    """An instance's database: snapshots, replicas, verification, restore, drills."""


@db.command()
@click.argument("host")
@api_command
def snapshot(host: str, as_json: bool) -> None:
    """Take a verified snapshot of the instance's database now."""
    data = client(None).request("POST", _path(host), {})
    if not answered(data, as_json):
        click.echo(f"snapshot {data['id']} of {host}: {data['size']} bytes, verified")


@db.command()
@click.argument("host")
@api_command
def snapshots(host: str, as_json: bool) -> None:
    """List the instance's stored snapshots, oldest first."""
    data = client(None).request("GET", _path(host))
    if answered(data, as_json):
        return
    if not data["snapshots"]:
        click.echo(f"{host} has no snapshots")
    for snap in data["snapshots"]:
        click.echo(_line(snap))


@db.command()
@click.argument("host")
@click.argument("snap_id", metavar="SNAPSHOT")
@api_command
def verify(host: str, snap_id: str, as_json: bool) -> None:
    """Fetch a snapshot and check it: its sha256 and SQLite's integrity check."""
    data = client(None).request("POST", _path(host, snap_id, "verify"), {})
    if not answered(data, as_json):
        click.echo(f"snapshot {snap_id} of {host} is ok (sha256 {data['sha256'][:12]}, "
                   "integrity ok)")


@db.command()
@click.argument("host")
@click.argument("snap_id", metavar="[SNAPSHOT]", required=False)
@click.option("--from-replica", "from_replica", is_flag=True,
              help="From the instance's continuous replica instead of a snapshot.")
@click.option("--at", default=None, metavar="TIME",
              help="With --from-replica: the replica as of TIME (ISO 8601).")
@dry_run_option
@api_command
def restore(host: str, snap_id: str | None, from_replica: bool, at: str | None,
            dry_run: bool, as_json: bool) -> None:
    """Replace the instance's database with a verified copy, a SNAPSHOT or (with
    --from-replica) its replica: requests are held while it stops, swaps the file and
    starts again. The replaced database is kept in the instance's data dir (and a file
    replica set aside), every one until removed with `keelway db forget` or, past the
    retention, by `keelway gc`; `keelway db kept` lists them."""
    if from_replica == (snap_id is not None):
        raise click.UsageError("say where from: a SNAPSHOT id, or --from-replica")
    if at is not None and not from_replica:
        raise click.UsageError("--at goes with --from-replica")
    if from_replica:
        data = client(None).request("POST", instance_path(host, "restore-replica"),
                                    {"at": at, "dry_run": dry_run})
    else:
        assert snap_id is not None
        data = client(None).request("POST", _path(host, snap_id, "restore"),
                                    {"dry_run": dry_run})
    if answered(data, as_json, dry_run):
        return
    source = f"snapshot {data['snapshot']['id']}" if data["snapshot"] else "its replica"
    click.echo(f"restored {host} from {source} ({data['size_bytes']} bytes, verified); "
               f"it is {data['state']}")
    _say_kept(host, data["kept"], data["retention_s"])


def _kept_path(host: str, *rest: str) -> str:
    return instance_path(host, "kept", *rest)


def _say_kept(host: str, copies: list[dict[str, Any]], retention_s: float) -> None:
    if not copies:
        click.echo(f"{host} keeps no replaced database or replica")
        return
    click.echo(f"kept (until `keelway db forget {host} COPY`, or `keelway gc` after "
               f"{retention_s / 86400:g} days):")
    for copy in copies:
        click.echo(f"  {copy['id']}  {copy['kind']:<8}  kept {_when(copy['kept_at'])}  "
                   f"{copy['disk_bytes']:>12} bytes  {copy['path']}")


@db.command()
@click.argument("host")
@api_command
def kept(host: str, as_json: bool) -> None:
    """List the copies restores kept: each database one replaced, each file replica one
    set aside."""
    data = client(None).request("GET", _kept_path(host))
    if not answered(data, as_json):
        _say_kept(host, data["kept"], data["retention_s"])


@db.command()
@click.argument("host")
@click.argument("copy_id", metavar="COPY")
@api_command
def forget(host: str, copy_id: str, as_json: bool) -> None:
    """Remove one copy a restore kept (its id as `keelway db kept` lists it)."""
    data = client(None).request("POST", _kept_path(host, copy_id, "forget"), {})
    if not answered(data, as_json):
        click.echo(f"removed {data['kind']} {data['id']} of {host} ({data['path']})")
