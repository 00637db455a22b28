"""Commands that only read: status, logs, events, ops, releases (`apps` lists in
keelway/cli/apps.py)."""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import Any

import click

from keelway.cli.base import answered, api_command, cli, client
from keelway.cli.client import ApiLost, ApiUnavailable
from keelway.cli.output import ago, emit_json, table

# A certificate this close to its end is said in `status`.
CERT_WARN_S = 14 * 86400


@cli.command()
@click.argument("app", required=False)
@api_command
def status(app: str | None, as_json: bool) -> None:
    """Instances, processes, builds and leftovers (of APP, or of every app)."""
    query = f"?app={app}" if app else ""
    data = client().request("GET", f"/v1/status{query}")
    if answered(data, as_json):
        return
    if data.get("router"):
        _router_health(data["router"])
    if (isolation := data.get("isolation")) and not isolation["uid_per_instance"]:
        click.echo(f"tenants share a uid: {isolation['shared_because']}")
    if limits := data.get("limits"):
        # Only what this box cannot enforce: the rest is `keelway doctor`'s to detail.
        loose = [name for name, said in limits.items() if said["enforced_by"] is None
                 and said["value"]]
        if loose:
            click.echo(f"not enforced on this box: {', '.join(loose)} limits "
                       "(`keelway doctor` says why)")
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
            for name, expires in (inst.get("certificates") or {}).items():
                # Only what needs a person: the rest is `keelway certs list`'s.
                left = None if expires is None else expires - time.time()
                if left is not None and left < CERT_WARN_S:
                    notes.append(f"{name}: its certificate "
                                 + ("has expired" if left <= 0 else
                                    f"expires in {max(1, int(left // 86400))} days")
                                 + "; `keelway certs list`")
            for held in inst.get("certificate_failures") or []:
                notes.append(f"{held['name']}: no certificate from the CA yet "
                             f"({held['failures']} tries): {held['error']}; "
                             f"`keelway certs renew {held['name']}`")
            if inst.get("pending_release"):
                notes.append(f"{inst['host']}: {inst['pending_release']} starts at its next "
                             "wake")
            if last and last["state"] != "succeeded":
                notes.append(f"{inst['host']}: last {last['kind']} {last['state']}"
                             + (f": {last['error']}" if last["error"] else ""))
            for proc in inst["processes"] or [None]:
                rows.append((
                    inst["host"], inst.get("label", inst["state"]), inst["release"] or "-",
                    proc["service"] if proc else "-",
                    f"{proc['id']}{'' if _named(proc) else ' (leftover)'}" if proc else "-",
                    (proc["pid"] or "-") if proc else "-", (proc["port"] or "-") if proc else "-",
                    proc["state"] if proc else "-",
                    *_used(proc),
                ))
        newest = item["release"]
        # The newest release, and whether anything runs it (one that failed runs nowhere).
        if newest and item["instances"] and all(i["release"] != newest
                                                for i in item["instances"]):
            newest = f"newest {newest} runs nowhere"
        table(f"{item['name']} ({newest or 'no release'})",
              ["instance", "state", "release", "service", "gen", "pid", "port", "process",
               "mem", "cpu"],
              rows)
        rollout = item.get("rollout")
        if rollout:
            click.echo(f"rollout of {rollout['release']}: {rollout['state']} at cohort "
                       f"{rollout['cohort']} of {rollout['cohorts']}"
                       + (f" ({rollout['reason']})" if rollout["reason"] else "")
                       + f"; `keelway rollout status {item['name']}`")
        for note in notes:
            click.echo(note)
    for left in data["leftovers"]:
        click.echo(f"leftover: {left['instance']} {left['service']} generation {left['id']} "
                   f"(pid {left['pid']}); `keelway stop` and `keelway start` clear it")


def _used(proc: dict[str, Any] | None) -> tuple[str, str]:
    """A live process's memory and CPU time so far, as `status` shows them."""
    if proc is None or proc.get("memory_bytes") is None:
        return "-", "-"
    cpu = proc.get("cpu_s")
    size = proc["memory_bytes"] / 1024 / 1024
    return (f"{size / 1024:.1f}G" if size >= 1024 else f"{size:.0f}M",
            f"{cpu:.1f}s" if cpu is not None else "-")


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
@api_command
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
@click.option("-n", "--lines", "count", default=100, show_default=True,
              type=click.IntRange(min=0), help="How many of the newest events.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events.")
@api_command
def events(app: str, count: int, follow: bool, as_json: bool) -> None:
    """What happened to the app: operations, exits, restarts."""
    data = client().request("GET", f"/v1/apps/{app}/events?limit={count}")
    if as_json and not follow:
        emit_json(data)
        return
    try:
        last = max(_print_events(data["events"], as_json), int(data.get("last", 0)))
        while follow:
            last = _print_events(_next_events(app, last), as_json) or last
    except KeyboardInterrupt:
        pass


# How long one poll of a follower waits for a new event (the API's long poll).
FOLLOW_WAIT_S = 5


def _next_events(app: str, after: int) -> list[dict[str, Any]]:
    """The events after `after`, waiting for one for up to FOLLOW_WAIT_S. A control
    plane that went away is said as ApiLost (cli/base.py says what that means), as a
    stream cut short would be: a follower cannot tell the two apart."""
    try:
        data = client(FOLLOW_WAIT_S + 30).request(
            "GET", f"/v1/apps/{app}/events?after={after}&limit=1000&wait={FOLLOW_WAIT_S}")
    except ApiUnavailable as exc:
        raise ApiLost("the control plane went away", "GET") from exc
    events: list[dict[str, Any]] = data["events"]
    return events


def _print_events(found: list[dict[str, Any]], as_json: bool) -> int:
    """Print events; the id of the last one (0 if there were none)."""
    for event in found:
        if as_json:
            click.echo(json_line(event))
        else:
            click.echo(f"{_clock(event['at'])}  {event['instance'] or '-'}  {event['kind']}: "
                       f"{event['message']}")
    return int(found[-1]["id"]) if found else 0


def _clock(at: float) -> str:
    """A moment as this box's local time, the day too when it was not today."""
    if time.strftime("%Y-%m-%d", time.localtime(at)) == time.strftime("%Y-%m-%d"):
        return time.strftime("%H:%M:%S", time.localtime(at))
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _took(duration_s: float | None) -> str:
    if duration_s is None:
        return "running"
    return f"{duration_s:.2f}s" if duration_s < 60 else f"{duration_s / 60:.1f}min"


@cli.command()
@click.argument("app")
@click.option("--instance", default=None)
@click.option("-n", "--lines", "count", default=50, show_default=True,
              type=click.IntRange(min=0), help="How many of the newest operations.")
@api_command
def ops(app: str, instance: str | None, count: int, as_json: bool) -> None:
    """The operation journal, step by step: when each began and how long it took."""
    query = f"?limit={count}" + (f"&instance={urllib.parse.quote(instance)}" if instance
                                 else "")
    data = client().request("GET", f"/v1/apps/{app}/ops{query}")
    if answered(data, as_json):
        return
    for op in data["operations"]:
        line = (f"op {op['id']} {op['kind']} {op['instance'] or '(the app)'}: {op['state']}"
                f"  {_clock(op['created_at'])}, {_took(op.get('duration_s'))}")
        click.echo(line + (f" ({op['error']})" if op["error"] else ""))
        for warning in op["warnings"]:
            click.echo(f"    ! {warning}")
        for step in op["steps"]:
            err = f" - {step['error']}" if step["error"] else ""
            detail = f" [{step['detail']}]" if step["detail"] else ""
            when = (f"  {_clock(step['started_at'])} {_took(step['duration_s'])}"
                    if "started_at" in step else "")
            click.echo(f"    {step['seq']:>2}. {step['name']}: {step['state']}{when}"
                       f"{detail}{err}")


def source_text(source: dict[str, str] | None) -> str:
    """Where a release's build came from, in a few words."""
    if not source:
        return "-"
    match source.get("kind"):
        case "git":
            ref = source.get("ref", "HEAD")
            return f"git {source['commit'][:12]}" + (f" ({ref})" if ref != "HEAD" else "")
        case "tarball":
            digest = source.get("sha256")
            return "tarball" + (f" sha256:{digest[:12]}" if digest else "")
        case "directory":
            return f"directory {source['digest'][:12]}"
        case _:
            return str(source.get("kind", "-"))


@cli.command()
@click.argument("app")
@api_command
def releases(app: str, as_json: bool) -> None:
    """The app's numbered releases: which one each instance runs, which failed, and
    where each one's build came from."""
    data = client().request("GET", f"/v1/apps/{app}/releases")
    if answered(data, as_json):
        return
    rows = []
    for r in data["releases"]:
        marks = []
        if r.get("current"):
            marks.append(f"current ({', '.join(r['current'])})")
        if r.get("failed_on"):
            marks.append(f"failed on {', '.join(r['failed_on'])}")
        rows.append((r["version"], "; ".join(marks) or "-", r["build"],
                     source_text(r.get("source")), r["description"], ago(r["created_at"])))
    if rows:
        table(None, ["release", "status", "build", "source", "description", "created"], rows)
    for failure in data.get("unreleased_failures", []):
        click.echo(f"{failure['version']} (build {failure['build']}) failed on "
                   f"{failure['instance']} before it was released; `keelway ops {app}` "
                   f"shows operation {failure['operation']}")
    if not rows and not data.get("unreleased_failures"):
        click.echo(f"{app} has no releases yet: `keelway deploy {app} PATH`")
