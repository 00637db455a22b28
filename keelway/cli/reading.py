"""Commands that only read: status, logs, events, ops, releases (`apps` lists in
keelway/cli/apps.py)."""

from __future__ import annotations

import json
import sys
import time
import urllib.parse
from typing import Any

import click

from keelway.cli.base import answered, api_command, cli, client
from keelway.cli.client import ApiLost, ApiUnavailable
from keelway.cli.output import (
    ago,
    emit_json,
    fail,
    page_line,
    page_query,
    paging_options,
    state_counts,
    table,
)


@cli.command()
@click.argument("app", required=False)
@paging_options
@api_command
def status(app: str | None, show_all: bool, page: int | None, as_json: bool) -> None:
    """Instances, processes, builds and leftovers (of APP, or of every app): each app's
    instances counted by state and those that need attention first, then a page of its
    instances (--page K, or --all for every one). --json answers every instance unless
    --page asks for a page.

    Example: keelway status blog --page 2
    """
    query = "&".join(filter(None, [f"app={urllib.parse.quote(app)}" if app else "",
                                   page_query(show_all, page, as_json)]))
    data = client().request("GET", "/v1/status" + (f"?{query}" if query else ""))
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
    pages = [item["page"] for item in data["apps"] if item.get("page")]
    if pages and all(p["number"] > p["pages"] for p in pages):
        fail(f"there is no page {pages[0]['number']}: "
             + ", ".join(f"{item['name']} has {item['page']['pages']}"
                         for item in data["apps"]),
             f"`keelway status{' ' + app if app else ''} --page 1`, or `--all`")
    for item in data["apps"]:
        _app_status(item)
    for left in data["leftovers"]:
        click.echo(f"leftover: {left['instance']} {left['service']} generation {left['id']} "
                   f"(pid {left['pid']}); `keelway stop` and `keelway start` clear it")


def _app_status(item: dict[str, Any]) -> None:
    """One app: its summary and what needs attention, then its page of instances."""
    name, summary = item["name"], item["summary"]
    newest = item["release"]
    # The newest release, and whether anything runs it (one that failed runs nowhere).
    if newest and summary["instances"] and newest not in summary["releases"]:
        newest = f"newest {newest} runs nowhere"
    click.echo(f"{name} ({newest or 'no release'}): {state_counts(summary)}")
    # Every instance that needs attention, whichever page shows its row: a paged answer
    # carries the first of them whole, an unpaged one has them among its instances.
    flagged = item.get("attention")
    if flagged is None:
        flagged = [inst for inst in item["instances"] if inst.get("attention")]
    for inst in flagged:
        for line in _attention(inst, name):
            click.echo(line)
    if summary["attention"] > len(flagged):
        click.echo(f"and {summary['attention'] - len(flagged)} more need attention: "
                   f"`keelway status {name} --all`")
    rows = []
    notes = []
    for inst in item["instances"]:
        notes += _said(inst)
        for proc in inst["processes"] or [None]:
            rows.append((
                inst["host"], inst.get("label", inst["state"]), inst["release"] or "-",
                proc["service"] if proc else "-",
                f"{proc['id']}{'' if _named(proc) else ' (leftover)'}" if proc else "-",
                (proc["pid"] or "-") if proc else "-", (proc["port"] or "-") if proc else "-",
                proc["state"] if proc else "-",
                *_used(proc),
            ))
    if rows:
        table(None, ["instance", "state", "release", "service", "gen", "pid", "port",
                     "process", "mem", "cpu"], rows)
    if more := page_line(item.get("page"), f"keelway status {name}"):
        click.echo(more)
    rollout = item.get("rollout")
    if rollout:
        click.echo(f"rollout of {rollout['release']}: {rollout['state']} at cohort "
                   f"{rollout['cohort']} of {rollout['cohorts']}"
                   + (f" ({rollout['reason']})" if rollout["reason"] else "")
                   + f"; `keelway rollout status {name}`")
    for note in notes:
        click.echo(note)


def _attention(inst: dict[str, Any], app: str) -> list[str]:
    """What a person should do about the instance, a line for each reason the API gave
    (keelway/api/status.py decides which; this only words them)."""
    host, codes = inst["host"], inst.get("attention") or []
    lines = []
    if "down" in codes:
        lines.append(f"{host} is down: {inst.get('down_reason') or 'its release failed'}; "
                     f"deploy a fix, `keelway rollback {app}` or `keelway start`")
    if "crashed" in codes:
        for crash in inst.get("crashed", []):
            at = crash["retry_at"]
            lines.append(f"{host} {crash['service']}: crashed, next retry at "
                         f"{time.strftime('%H:%M:%S', time.localtime(at))} (in "
                         f"{max(0, round(at - time.time()))}s; crash {crash['failures']} "
                         "in a row)")
        if not inst.get("crashed"):
            lines.append(f"{host}: {inst['label']}; `keelway logs {app} --instance {host}`")
    if (fence := inst.get("fence")) and "fenced" in codes:
        lines.append(f"{host} is fenced at generation {fence['generation']}"
                     + (f" ({fence['reason']})" if fence["reason"] else "")
                     + f": nothing wakes or starts it; `keelway unfence {host}`")
    if (closed := inst.get("failed_closed")) and "failed-closed" in codes:
        lines.append(f"{host} is failed closed, leftover {', '.join(closed['leftovers'])}: "
                     f"{closed['next']}")
    if (drill := inst.get("drill")) and "drill-failed" in codes:
        # The message names the copy that failed (`snapshot: …`, `replica: …`).
        where = "snapshots" if drill["message"].startswith("snapshot") else "replicas"
        lines.append(f"{host}: the last restore drill failed: {drill['message']}; "
                     f"`keelway db {where} {host}`")
    for name in inst.get("certificates_expiring") or []:
        left = (inst.get("certificates") or {}).get(name, time.time()) - time.time()
        lines.append(f"{name}: its certificate "
                     + ("has expired" if left <= 0 else
                        f"expires in {max(1, int(left // 86400))} days")
                     + "; `keelway certs list`")
    for held in inst.get("certificate_failures") or []:
        lines.append(f"{held['name']}: no certificate from the CA yet ({held['failures']} "
                     f"tries): {held['error']}; `keelway certs renew {held['name']}`")
    last = inst.get("last_operation")
    if last and "operation-failed" in codes:
        lines.append(f"{host}: last {last['kind']} {last['state']}"
                     + (f": {last['error']}" if last["error"] else ""))
    elif "failed" in codes and "down" not in codes:
        # Failed by an older release than its latest operation: its label says which.
        lines.append(f"{host}: {inst['label']}; `keelway ops {app} --instance {host}`")
    return lines


def _said(inst: dict[str, Any]) -> list[str]:
    """What else a shown row's instance has to say, none of it a call to act."""
    host = inst["host"]
    lines = []
    if inst.get("aliases"):
        lines.append(f"{host} also serves {', '.join(inst['aliases'])}")
    if inst.get("pending_release"):
        lines.append(f"{host}: {inst['pending_release']} starts at its next wake")
    last = inst.get("last_operation")
    if last and last["state"] == "running":
        lines.append(f"{host}: last {last['kind']} running")
    return lines


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
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines as they come.")
@click.option("--service", default=None,
              help="Only this service (web, worker, job.NAME, or router: the access log).")
@click.option("--instance", default=None, help="Only this instance.")
@click.option("-n", "--lines", default=100, show_default=True, type=click.IntRange(min=0),
              help="How many of the newest lines, of all sources together.")
@click.option("--since", default=None, metavar="DURATION|TIME",
              help="Only lines from this long ago (30s, 10m, 2h, 1d) or this time on "
                   "(ISO 8601; local time unless it names a zone).")
@api_command
def logs(app: str, follow: bool, service: str | None, instance: str | None, lines: int,
         since: str | None, as_json: bool) -> None:
    """Print the app's logs: every instance's services and its router access log,
    merged in time order, each line prefixed `INSTANCE SERVICE |` (a colour per source
    on a terminal). A service line's time is the control plane's sample of its file, at
    most about a second after it was written; an access-log line carries its own."""
    params = {"lines": str(lines), "follow": "1" if follow else "0"}
    if service:
        params["service"] = service
    if instance:
        params["instance"] = instance
    if since is not None:
        try:
            params["since"] = f"{since_time(since, time.time()):.3f}"
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--since") from None
    colour = not as_json and sys.stdout.isatty()
    try:
        for item in client(None).stream(
                "GET", f"/v1/apps/{app}/logs?{urllib.parse.urlencode(params)}"):
            if as_json:
                click.echo(json_line(item))
                continue
            source = item["service"] if item["generation"] is None else (
                f"{item['service']}.{item['generation']}")
            prefix = f"{item['instance']} {source} |"
            if colour:
                prefix = click.style(prefix, fg=_source_colour(item["instance"], source))
            click.echo(f"{prefix} {item['line']}")
    except KeyboardInterrupt:
        pass


_COLOURS = ("cyan", "green", "yellow", "magenta", "blue", "red", "bright_cyan",
            "bright_green", "bright_yellow", "bright_magenta", "bright_blue")


def _source_colour(instance: str, source: str) -> str:
    # A stable colour per source, the same in every run (hash() of a str is salted).
    key = f"{instance} {source}".encode()
    return _COLOURS[sum(key) * 31 % len(_COLOURS)]


_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_time(text: str, now: float) -> float:
    """`--since` as unix seconds: a duration back from `now` (`90s`, `10m`, `1h30m`,
    `2d`) or an ISO 8601 time (local unless it names a zone). ValueError says why not."""
    import datetime
    import re

    parts = re.fullmatch(r"(?:\d+[smhd])+", text.strip())
    if parts is not None:
        return now - sum(int(n) * _UNITS_S[unit]
                         for n, unit in re.findall(r"(\d+)([smhd])", text))
    try:
        moment = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is neither a duration (10m, 2h, 1d) "
                         "nor an ISO time (2025-05-01T12:00)") from None
    return moment.timestamp()  # a naive time is taken as local, as a person means it


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
