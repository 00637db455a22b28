"""`keelway domains`: the aliases of an instance (add, remove, list). Every one takes
--json."""

from __future__ import annotations

import click

from keelway.cli.base import api_call, cli, client, json_option
from keelway.cli.output import emit_json


@cli.group()
def domains() -> None:
    """Aliases of an instance: more hosts that serve the same instance."""


@domains.command("add")
@click.argument("host")
@click.argument("aliases", nargs=-1, required=True)
@json_option
@api_call
def domains_add(host: str, aliases: tuple[str, ...], as_json: bool) -> None:
    """Serve instance HOST at ALIASES too."""
    data = client(None).request("POST", f"/v1/instances/{host}/domains",
                                {"aliases": list(aliases)})
    if as_json:
        emit_json(data)
        return
    click.echo(f"{host} is served at {', '.join([host, *data['aliases']])}")


@domains.command("remove")
@click.argument("host")
@click.argument("aliases", nargs=-1, required=True)
@json_option
@api_call
def domains_remove(host: str, aliases: tuple[str, ...], as_json: bool) -> None:
    """Stop serving instance HOST at ALIASES."""
    data = client(None).request("POST", f"/v1/instances/{host}/domains/remove",
                                {"aliases": list(aliases)})
    if as_json:
        emit_json(data)
        return
    click.echo(f"{host} is served at {', '.join([host, *data['aliases']])}")


@domains.command("list")
@click.argument("host")
@json_option
@api_call
def domains_list(host: str, as_json: bool) -> None:
    """The aliases of instance HOST."""
    data = client().request("GET", f"/v1/instances/{host}/domains")
    if as_json:
        emit_json(data)
        return
    click.echo(f"{host} (app {data['app']})")
    for alias in data["aliases"]:
        click.echo(f"  {alias}")
