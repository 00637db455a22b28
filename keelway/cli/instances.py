"""`keelway instances`: add, remove, list. Every one takes --json."""

from __future__ import annotations

import click

from keelway.cli.base import answered, api_command, cli, client, config_pairs
from keelway.cli.output import (
    fail,
    page_line,
    page_query,
    paging_options,
    plural,
    state_counts,
    table,
)
from keelway.cli.plans import dry_run_option


@cli.group()
def instances() -> None:
    """The instances of an app: add, remove, list."""


@instances.command("add")
@click.argument("app")
@click.argument("hosts", nargs=-1, required=True)
@click.option("--config", "pairs", multiple=True, help="K=V of the instances' own config.")
@click.option("--parked", is_flag=True,
              help="Add them parked: nothing runs until a first request wakes each one.")
@dry_run_option
@api_command
def instances_add(app: str, hosts: tuple[str, ...], pairs: tuple[str, ...], parked: bool,
                  dry_run: bool, as_json: bool) -> None:
    """Add instances of APP at HOSTS, laid down whole (data dir, empty database, env file
    with a key) and started on APP's release if it has one (with --parked, started by
    their first request instead). One request for all."""
    config = config_pairs(pairs, as_json)
    data = client(None).request("POST", f"/v1/apps/{app}/instances",
                                {"hosts": list(hosts), "config": config, "parked": parked,
                                 "dry_run": dry_run})
    if answered(data, as_json, dry_run):
        return
    click.echo(f"added {plural(len(data['added']), 'instance', 'instances')} of {app} in "
               f"{data['seconds']}s")
    for item in data["started"]:
        click.echo(f"  {item['host']}: {item['release']} {item['outcome']}")
    failed = [item["host"] for item in data["started"] if item["outcome"] != "done"]
    if failed:
        fail(f"added, but {', '.join(failed)} did not start",
             f"see `keelway logs {app} --instance {failed[0]}` and `keelway ops {app}`")


@instances.command("remove")
@click.argument("app")
@click.argument("host")
@click.option("--purge-data", is_flag=True, help="Remove its data dir and env file too.")
@dry_run_option
@api_command
def instances_remove(app: str, host: str, purge_data: bool, dry_run: bool,
                     as_json: bool) -> None:
    """Stop HOST's processes, withdraw its routes and forget it (data kept unless
    --purge-data)."""
    data = client(None).request("POST", f"/v1/apps/{app}/instances/{host}/remove",
                                {"purge_data": purge_data, "dry_run": dry_run})
    if answered(data, as_json, dry_run):
        return
    click.echo(f"removed {host}" + ("" if purge_data else "; its data dir is kept"))


@instances.command("list")
@click.argument("app")
@paging_options
@api_command
def instances_list(app: str, show_all: bool, page: int | None, as_json: bool) -> None:
    """APP's instances counted by state, those that need attention, then a page of them
    with their state and aliases (--page K, or --all for every one). --json answers
    every instance unless --page asks for a page.

    Example: keelway instances list blog --all
    """
    query = page_query(show_all, page, as_json)
    data = client().request("GET", f"/v1/apps/{app}/instances" + (f"?{query}" if query
                                                                    else ""))
    if answered(data, as_json):
        return
    summary = data["summary"]
    if not summary["instances"]:
        click.echo(f"{app} has no instances: `keelway instances add {app} HOST`")
        return
    shown = data.get("page")
    if shown is not None and shown["number"] > shown["pages"]:
        fail(f"there is no page {shown['number']}: {app} has {shown['pages']}",
             f"`keelway instances list {app} --page 1`, or `--all`")
    click.echo(f"{app}: {state_counts(summary)}")
    flagged = data.get("attention")
    if flagged is None:
        flagged = [i for i in data["instances"] if i.get("attention")]
    for inst in flagged:
        click.echo(f"{inst['host']} needs attention: {', '.join(inst['attention'])}")
    if summary["attention"]:
        more = summary["attention"] - len(flagged)
        click.echo((f"and {more} more; " if more else "") + f"`keelway status {app}` says why")
    table(None, ["instance", "state", "aliases", "own config"],
          [(i["host"], i.get("label", i["state"]) + (" (adding)" if i["adding"] else ""),
            ", ".join(i["aliases"]) or "-", ", ".join(i["config"]) or "-")
           for i in data["instances"]])
    if more_line := page_line(shown, f"keelway instances list {app}"):
        click.echo(more_line)
