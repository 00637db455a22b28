"""Scheduled jobs: `keelway jobs APP` lists them and their recent runs; `keelway jobs
run APP NAME [--instance H]` runs one now (keelway/deploy/jobs.py).

    keelway jobs blog
    keelway jobs run blog nightly --instance acme.blog.localhost
"""

from __future__ import annotations

import time
import urllib.parse
from typing import Any

import click

from keelway.cli.base import answered, api_command, cli, client
from keelway.cli.output import ago, table


class _JobsGroup(click.Group):
    """`keelway jobs APP` is `keelway jobs list APP`: the listing is what a bare `jobs`
    asks for, as `heroku ps` and `fly machines` have it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            args = ["list", *args]
        return super().parse_args(ctx, args)


@cli.group(cls=_JobsGroup)
def jobs() -> None:
    """Scheduled jobs ([jobs.NAME] in keelway.toml): `keelway jobs APP` lists them."""


@jobs.command("list")
@click.argument("app")
@api_command
def list_jobs(app: str, as_json: bool) -> None:
    """The app's jobs, when each runs next, and the recent runs.

    Example: keelway jobs blog
    """
    data = client().request("GET", f"/v1/apps/{urllib.parse.quote(app, safe='')}/jobs")
    if answered(data, as_json):
        return
    if not data["jobs"]:
        click.echo(f"{app} has no scheduled jobs (declare one as [jobs.NAME] in keelway.toml)")
    else:
        table(None, ["job", "schedule", "runs on", "overlap", "missed", "next run"],
              [_job_row(j) for j in data["jobs"]])
    runs = data["runs"]
    if runs:
        click.echo("")
        table(None, ["job", "instance", "scheduled", "state", "started", "outcome"],
              [_run_row(r) for r in runs[:20]])


def _job_row(job: dict[str, Any]) -> list[str]:
    hosts = job["hosts"]
    where = hosts[0] if job["instances"] == "one" and hosts else f"{len(hosts)} instances"
    running = f" ({len(job['running'])} running)" if job["running"] else ""
    zone = "" if job["timezone"] == "UTC" else f" {job['timezone']}"
    return [job["name"], f"{job['schedule']}{zone}", where + running, job["overlap"],
            job["missed"], _when(job["next_run"])]


def _run_row(run: dict[str, Any]) -> list[str]:
    scheduled = "by hand" if run["by_hand"] else _when(run["scheduled"])
    outcome = run["error"] or ("exit code 0" if run["state"] == "succeeded" else "")
    return [run["job"] or "?", run["instance"], scheduled, run["state"],
            ago(run["started_at"]), outcome]


def _when(at: float | None) -> str:
    if at is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))


@jobs.command("run")
@click.argument("app")
@click.argument("name")
@click.option("--instance", default=None, help="Run it on this instance only.")
@api_command
def run_job(app: str, name: str, instance: str | None, as_json: bool) -> None:
    """Run a job now, where its schedule runs it (or on one instance).

    Its overlap rule applies; the outcome is in `keelway jobs APP`.

    Example: keelway jobs run blog nightly --instance acme.blog.localhost
    """
    path = (f"/v1/apps/{urllib.parse.quote(app, safe='')}/jobs/"
            f"{urllib.parse.quote(name, safe='')}/run")
    data = client().request("POST", path, {"instance": instance})
    if answered(data, as_json):
        return
    hosts = data["hosts"]
    where = ", ".join(hosts) if len(hosts) <= 3 else f"{len(hosts)} instances"
    click.echo(f"{name} started on {where}; see `keelway jobs {app}` and "
               f"`keelway logs {app} --service job.{name}`")
