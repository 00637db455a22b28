"""`keelway apps`: list, create, destroy. Every one takes --json."""

from __future__ import annotations

import click

from keelway.cli.base import answered, api_command, cli, client
from keelway.cli.output import plural, table
from keelway.cli.plans import dry_run_option


@cli.group(invoke_without_command=True)
@click.pass_context
@api_command
def apps(ctx: click.Context, as_json: bool) -> None:
    """List apps; `apps create APP`, `apps destroy APP --yes`."""
    if ctx.invoked_subcommand is not None:
        return
    data = client().request("GET", "/v1/apps")
    if answered(data, as_json):
        return
    if not data["apps"]:
        click.echo("no apps yet: deploy one with `keelway deploy NAME PATH`")
        return
    table(None, ["app", "release", "instances"],
          [(a["name"], a["release"] or "-", ", ".join(a["instances"])) for a in data["apps"]])


@apps.command("create")
@click.argument("app")
@api_command
def apps_create(app: str, as_json: bool) -> None:
    """Create APP with no instances, so config can be set before its first deploy."""
    data = client().request("POST", "/v1/apps", {"app": app})
    if answered(data, as_json):
        return
    click.echo(f"created {app}; next: `keelway config {app} set K=V`, "
               f"`keelway instances add {app} HOST`, `keelway deploy {app} PATH`")


@apps.command("destroy")
@click.argument("app")
@click.option("--yes", is_flag=True, help="Yes, stop and remove everything of APP.")
@click.option("--purge-data", is_flag=True, help="Remove the instances' data dirs too.")
@dry_run_option
@api_command
def apps_destroy(app: str, yes: bool, purge_data: bool, dry_run: bool,
                 as_json: bool) -> None:
    """Stop and remove every instance of APP, its routes, builds and records (data dirs
    stay unless --purge-data); the name can then be used again."""
    data = client(None).request("POST", f"/v1/apps/{app}/destroy",
                                {"yes": yes, "purge_data": purge_data, "dry_run": dry_run})
    if answered(data, as_json, dry_run):
        return
    kept = "" if purge_data else "; data dirs kept"
    click.echo(f"destroyed {app} ({plural(len(data['instances']), 'instance', 'instances')})"
               f"{kept}")
