"""Commands that only read: status, logs, events, ops, releases (`apps` lists in
keelway/cli/tenants.py)."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from keelway.cli.base import api_call, cli, client, json_option
from keelway.cli.output import ago, emit_json, table


@cli.command()
@click.argument("app", required=False)
@json_option
@api_call
def status(app: str | None, as_json: bool) -> None:
    """Instances, processes, builds and leftovers (of APP, or of every app)."""
    query = f"?app={app}" if app else ""
    data = client().request("GET", f"/v1/status{query}")
    if as_json:
        emit_json(data)
        return
    if data.get("router"):
        _router_health(data["router"])
    if (isolation := data.get("isolation")) and not isolation["uid_per_instance"]:
        click.echo(f"tenants share a uid: {isolation['shared_because']}")
    if not data["apps"]:
        click.echo("no apps yet: deploy one with `keelway deploy NAME PATH`")
    for item in data["apps"]:
        rows = []
        notes = []
        for inst in item["instances"]:
            last = inst["last_operation"]
            if inst.get("aliases"):
                notes.append(f"{inst['host']} also serves {', '.join(inst['aliases'])}")
            if inst.get("down_reason"):
                notes.append(f"{inst['host']} is down: {inst['down_reason']}; deploy a fix, "
                             f"`keelway rollback {item['name']}` or `keelway start`")
            for crash in inst.get("crashed", []):
                at = crash["retry_at"]
                notes.append(f"{inst['host']} {crash['service']}: crashed, next retry at "
                             f"{time.strftime('%H:%M:%S', time.localtime(at))} (in "
                             f"{max(0, round(at - time.time()))}s; crash {crash['failures']} "
                             "in a row)")
            if (fence := inst.get("fence")) and fence["held"]:
                notes.append(f"{inst['host']} is fenced at generation {fence['generation']}"
                             + (f" ({fence['reason']})" if fence["reason"] else "")
                             + f": nothing wakes or starts it; `keelway unfence "
                             f"{inst['host']}`")
            if inst.get("failed_closed"):
                closed = inst["failed_closed"]
                notes.append(f"{inst['host']} is failed closed, leftover "
                             f"{', '.join(closed['leftovers'])}: {closed['next']}")
            if (drill := inst.get("drill")) and not drill["ok"]:
                # The message names the copy that failed (`snapshot: …`, `replica: …`).
                where = "snapshots" if drill["message"].startswith("snapshot") else "replicas"
                notes.append(f"{inst['host']}: the last restore drill failed: "
                             f"{drill['message']}; `keelway db {where} {inst['host']}`")
            if last and last["state"] != "succeeded":
                notes.append(f"{inst['host']}: last {last['kind']} {last['state']}"
                             + (f": {last['error']}" if last["error"] else ""))
            for proc in inst["processes"] or [None]:
                rows.append((
                    inst["host"], inst["state"], inst["release"] or "-",
                    proc["service"] if proc else "-",
                    f"{proc['id']}{'' if _named(proc) else ' (leftover)'}" if proc else "-",
                    proc["pid"] if proc else "-", proc["port"] if proc else "-",
                    proc["state"] if proc else "-",
                ))
        table(f"{item['name']} ({item['release'] or 'no release'})",
              ["instance", "state", "release", "service", "gen", "pid", "port", "process"],
              rows)
        for note in notes:
            click.echo(note)
    for left in data["leftovers"]:
        click.echo(f"leftover: {left['instance']} {left['service']} generation {left['id']} "
                   f"(pid {left['pid']}); `keelway stop` and `keelway start` clear it")


def _named(proc: dict[str, Any]) -> bool:
    """Whether a record names the process: ACTIVE, or it is the replicator."""
    return bool(proc["active"]) or proc["service"] == "replica"


def _router_health(router: dict[str, Any]) -> None:
    """One line on the router, and a second on its restarts if it had any."""
    where = f"http://{router['addr']}/ ({router['workers']} workers)"
    if router["state"] == "serving":
        click.echo(f"router: serving {where}, pid {router['pid']}"
                   f"{' (adopted)' if router['adopted'] else ''}, started "
                   f"{ago(router['up_since'])}")
    elif router["state"] == "starting":
        click.echo(f"router: starting on {where}")
    else:
        retry = (f"; next try {_when(router['next_retry_at'])}" if router["next_retry_at"]
                 else "")
        error = f"; last error: {router['last_error']}" if router["last_error"] else ""
        click.echo(f"router: DOWN on {where} since {ago(router['down_since'])}{retry}{error}"
                   "; `keelway router restart` tries now")
    if router["restarts"]:
        click.echo(f"  restarts: {router['restarts']}, last {ago(router['last_restart_at'])}: "
                   f"{router['last_restart_reason']}")


def _when(at: float) -> str:
    seconds = max(0, round(at - time.time()))
    return f"in {seconds}s"


@cli.command()
@click.argument("app")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines.")
@click.option("--service", default=None)
@click.option("--instance", default=None)
@click.option("-n", "--lines", default=100, show_default=True)
@json_option
@api_call
def logs(app: str, follow: bool, service: str | None, instance: str | None, lines: int,
         as_json: bool) -> None:
    """Print the app's process output."""
    query = f"?lines={lines}&follow={'1' if follow else '0'}"
    if service:
        query += f"&service={service}"
    if instance:
        query += f"&instance={instance}"
    try:
        for item in client(None).stream("GET", f"/v1/apps/{app}/logs{query}"):
            if as_json:
                click.echo(json_line(item))
            else:
                click.echo(f"{item['instance']} {item['service']}.{item['generation']} | "
                           f"{item['line']}")
    except KeyboardInterrupt:
        pass


def json_line(item: dict[str, Any]) -> str:

    return json.dumps(item, sort_keys=True)


@cli.command()
@click.argument("app")
@json_option
@api_call
def events(app: str, as_json: bool) -> None:
    """What happened to the app: operations, exits, restarts."""
    data = client().request("GET", f"/v1/apps/{app}/events")
    if as_json:
        emit_json(data)
        return
    for event in data["events"]:
        click.echo(f"{ago(event['at']):>8}  {event['instance'] or '-'}  {event['kind']}: "
                   f"{event['message']}")


@cli.command()
@click.argument("app")
@click.option("--instance", default=None)
@json_option
@api_call
def ops(app: str, instance: str | None, as_json: bool) -> None:
    """The operation journal, step by step."""
    query = f"?instance={instance}" if instance else ""
    data = client().request("GET", f"/v1/apps/{app}/ops{query}")
    if as_json:
        emit_json(data)
        return
    for op in data["operations"]:
        line = f"op {op['id']} {op['kind']} {op['instance'] or '(the app)'}: {op['state']}"
        click.echo(line + (f" ({op['error']})" if op["error"] else ""))
        for warning in op["warnings"]:
            click.echo(f"    ! {warning}")
        for step in op["steps"]:
            err = f" - {step['error']}" if step["error"] else ""
            detail = f" [{step['detail']}]" if step["detail"] else ""
            click.echo(f"    {step['seq']:>2}. {step['name']}: {step['state']}{detail}{err}")


@cli.command()
@click.argument("app")
@json_option
@api_call
def releases(app: str, as_json: bool) -> None:
    """The app's numbered releases."""
    data = client().request("GET", f"/v1/apps/{app}/releases")
    if as_json:
        emit_json(data)
        return
    table(None, ["release", "build", "description", "created"],
          [(r["version"], r["build"], r["description"], ago(r["created_at"]))
           for r in data["releases"]])

