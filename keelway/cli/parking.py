"""Scale to zero and fences by hand: `park`, `wake`, `fence`, `unfence`."""

from __future__ import annotations

import urllib.parse

import click

from keelway.cli.base import api_call, cli, client, json_option
from keelway.cli.output import emit_json, plural
from keelway.cli.plans import dry_run_option, echo_plan


def _path(host: str, verb: str) -> str:
    # Quoted: the API checks the name; a bad one must reach it intact, not as a path.
    return f"/v1/instances/{urllib.parse.quote(host, safe='')}/{verb}"


@cli.command()
@click.argument("host")
@dry_run_option
@json_option
@api_call
def park(host: str, dry_run: bool, as_json: bool) -> None:
    """Scale an instance to zero: stop its processes; its next request wakes it."""
    data = client(None).request("POST", _path(host, "park"), {"dry_run": dry_run})
    if dry_run:
        echo_plan(data, as_json)
    elif as_json:
        emit_json(data)
    elif data["parked"]:
        count = data.get("processes_stopped", len(data["stopped"]))
        click.echo(f"parked {host} (stopped {plural(count, 'process', 'processes')})")
    else:
        click.echo(f"{host} is parked already")


@cli.command()
@click.argument("host")
@dry_run_option
@json_option
@api_call
def wake(host: str, dry_run: bool, as_json: bool) -> None:
    """Wake a parked instance and wait until it serves."""
    data = client(None).request("POST", _path(host, "wake"),
                                {"wait": True, "dry_run": dry_run})
    if dry_run:
        echo_plan(data, as_json)
    elif as_json:
        emit_json(data)
    else:
        click.echo(f"woke {host}" if data["woke"] else f"{host} is awake already")


@cli.command()
@click.argument("host")
@click.option("--reason", default=None, help="Why, as status and the events show it.")
@json_option
@api_call
def fence(host: str, reason: str | None, as_json: bool) -> None:
    """Fence an instance: nothing wakes, starts or restarts it until it is unfenced."""
    data = client().request("POST", _path(host, "fence"), {"reason": reason})
    if as_json:
        emit_json(data)
    else:
        click.echo(f"fenced {host} at generation {data['generation']}")


@cli.command()
@click.argument("host")
@json_option
@api_call
def unfence(host: str, as_json: bool) -> None:
    """Lift the instance's current fence generation."""
    current = client().request("GET", _path(host, "fence"))
    data = current | {"lifted": False}
    if current["held"]:
        data = client().request("POST", _path(host, "unfence"),
                                {"generation": current["generation"]})
    if as_json:
        emit_json(data)
    elif data["lifted"]:
        click.echo(f"unfenced {host} (generation {data['generation']} lifted)")
    elif data["held"]:
        click.echo(f"{host} was fenced again meanwhile, at generation {data['generation']}; "
                   "it stays fenced")
    else:
        click.echo(f"{host} is not fenced")
