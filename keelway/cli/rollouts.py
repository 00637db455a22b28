"""A release's rollout across an app's instances: `rollout status|pause|resume|abort APP`.

`status` says where the app's latest rollout stands, each instance's place in it and
the figures its last judged cohort was judged on; `pause` stops it before its next
cohort; `resume` carries a halted or paused one on; `abort` takes every instance it
rolled back to the release before it (issue #19, keelway/deploy/rollouts.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from keelway.cli.base import answered, api_command, cli, client
from keelway.cli.operations import key_option, run_operation


@cli.group()
def rollout() -> None:
    """Where a release's rollout stands; pause, resume or abort it."""


def _on_app(name: str) -> Callable[[Callable[..., None]], click.Command]:
    """A `rollout` subcommand on APP, with --json and the API's failures said."""
    def made(func: Callable[..., None]) -> click.Command:
        return rollout.command(name=name)(click.argument("app")(api_command(func)))

    return made


def _shown(method: str, path: str, as_json: bool) -> None:
    data = client().request(method, path)
    if answered(data, as_json):
        return
    if data["rollout"] is None:
        click.echo(f"{path.split('/')[3]} has had no rollout")
        return
    _say(data["rollout"])


@_on_app("status")
def status(app: str, as_json: bool) -> None:
    """Where the app's latest rollout stands, instance by instance."""
    _shown("GET", f"/v1/apps/{app}/rollout", as_json)


@_on_app("pause")
def pause(app: str, as_json: bool) -> None:
    """Stop a running rollout before its next cohort (the cohort under way finishes)."""
    _shown("POST", f"/v1/apps/{app}/rollout/pause", as_json)


def _say(view: dict[str, Any]) -> None:
    click.echo(f"{view['app']} {view['release']} ({view['kind']}): {view['state']}, cohort "
               f"{view['cohort']} of {view['cohorts']}"
               + (f" (from {view['previous']})" if view["previous"] else ""))
    if view["reason"]:
        click.echo(f"  why: {view['reason']}")
    figures = view["figures"]
    if figures:
        click.echo(f"  cohort {figures['cohort'] + 1} judged: {figures['said']}")
        for host in figures["by_host"]:
            click.echo(f"    {host['host']}: {host['errors']} of {host['responses']} 5xx")
    for inst in view["instances"]:
        parked = "" if inst["judged"] else " (parked)"
        reason = f": {inst['reason']}" if inst["reason"] else ""
        click.echo(f"  {inst['cohort']:>3}  {inst['host']}{parked}  {inst['state']}{reason}")


@key_option
@_on_app("resume")
def resume(app: str, key: str | None, as_json: bool) -> None:
    """Carry a halted or paused rollout on: its failed instances and those not begun."""
    run_operation(f"/v1/apps/{app}/rollout/resume", {"key": key}, as_json,
                  f"{app}'s rollout is done", app)


@key_option
@_on_app("abort")
def abort(app: str, key: str | None, as_json: bool) -> None:
    """Take every instance the rollout rolled back to the release before it."""
    run_operation(f"/v1/apps/{app}/rollout/abort", {"key": key}, as_json,
                  f"{app}'s rollout is aborted", app)
