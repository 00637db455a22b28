"""Scale to zero and fences by hand: `park`, `freeze`, `wake`, `fence`, `unfence`."""

from __future__ import annotations

import click

from keelway.cli.base import answered, api_command, cli, client, instance_path
from keelway.cli.output import plural
from keelway.cli.plans import dry_run_option


@cli.command()
@click.argument("host")
@dry_run_option
@api_command
def park(host: str, dry_run: bool, as_json: bool) -> None:
    """Scale an instance to zero: stop its processes; its next request wakes it."""
    data = client(None).request("POST", instance_path(host, "park"), {"dry_run": dry_run})
    if answered(data, as_json, dry_run):
        return
    if data["parked"]:
        count = data.get("processes_stopped", len(data["stopped"]))
        click.echo(f"parked {host} (stopped {plural(count, 'process', 'processes')})")
    else:
        click.echo(f"{host} is parked already")


@cli.command()
@click.argument("host")
@dry_run_option
@api_command
def freeze(host: str, dry_run: bool, as_json: bool) -> None:
    """Freeze an instance: its processes stopped in place, memory kept; its next request
    thaws it in milliseconds.

    Example: keelway freeze acme.blog.localhost
    """
    data = client(None).request("POST", instance_path(host, "freeze"), {"dry_run": dry_run})
    if answered(data, as_json, dry_run):
        return
    click.echo(f"froze {host}" if data["frozen"] else f"{host} is frozen already")


@cli.command()
@click.argument("host")
@dry_run_option
@api_command
def wake(host: str, dry_run: bool, as_json: bool) -> None:
    """Wake a parked instance and wait until it serves."""
    data = client(None).request("POST", instance_path(host, "wake"),
                                {"wait": True, "dry_run": dry_run})
    if not answered(data, as_json, dry_run):
        click.echo(f"woke {host}" if data["woke"] else f"{host} is awake already")


@cli.command()
@click.argument("host")
@click.option("--reason", default=None, help="Why, as status and the events show it.")
@api_command
def fence(host: str, reason: str | None, as_json: bool) -> None:
    """Fence an instance: nothing wakes, starts or restarts it until it is unfenced."""
    data = client().request("POST", instance_path(host, "fence"), {"reason": reason})
    if not answered(data, as_json):
        click.echo(f"fenced {host} at generation {data['generation']}")


@cli.command()
@click.argument("host")
@api_command
def unfence(host: str, as_json: bool) -> None:
    """Lift the instance's current fence generation."""
    current = client().request("GET", instance_path(host, "fence"))
    data = current | {"lifted": False}
    if current["held"]:
        data = client().request("POST", instance_path(host, "unfence"),
                                {"generation": current["generation"]})
    if answered(data, as_json):
        return
    if data["lifted"]:
        click.echo(f"unfenced {host} (generation {data['generation']} lifted)")
    elif data["held"]:
        click.echo(f"{host} was fenced again meanwhile, at generation {data['generation']}; "
                   "it stays fenced")
    else:
        click.echo(f"{host} is not fenced")
