"""`keelway domains`: the aliases of an instance (add, remove, list). Every one takes
--json."""

from __future__ import annotations

from collections.abc import Callable

import click

from keelway.cli.base import answered, api_command, cli, client


@cli.group()
def domains() -> None:
    """Aliases of an instance: more hosts that serve the same instance."""


def _change_arguments(func: Callable[..., None]) -> Callable[..., None]:
    """What `domains add` and `domains remove` both take: HOST, ALIASES... and --json."""
    return click.argument("host")(click.argument("aliases", nargs=-1, required=True)(
        api_command(func)))


@domains.command("add")
@_change_arguments
def domains_add(host: str, aliases: tuple[str, ...], as_json: bool) -> None:
    """Serve instance HOST at ALIASES too."""
    _change(host, "", aliases, as_json)


@domains.command("remove")
@_change_arguments
def domains_remove(host: str, aliases: tuple[str, ...], as_json: bool) -> None:
    """Stop serving instance HOST at ALIASES."""
    _change(host, "/remove", aliases, as_json)


def _change(host: str, verb: str, aliases: tuple[str, ...], as_json: bool) -> None:
    data = client(None).request("POST", f"/v1/instances/{host}/domains{verb}",
                                {"aliases": list(aliases)})
    if answered(data, as_json):
        return
    click.echo(f"{host} is served at {', '.join([host, *data['aliases']])}")


@domains.command("list")
@click.argument("host")
@api_command
def domains_list(host: str, as_json: bool) -> None:
    """The aliases of instance HOST."""
    data = client().request("GET", f"/v1/instances/{host}/domains")
    if answered(data, as_json):
        return
    click.echo(f"{host} (app {data['app']})")
    for alias in data["aliases"]:
        click.echo(f"  {alias}")
