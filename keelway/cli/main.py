"""The `keelway` command. Every command has --json; errors say what to do next.

Only click and the stdlib are imported at start; the daemon (aiohttp, uvloop) is
imported by `up` alone, and rich only when a table is drawn.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from keelway.cli.client import ApiError, ApiUnavailable, Client
from keelway.cli.output import ago, emit_json, fail, fail_json, table
from keelway.home import Home

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_HTTP = "127.0.0.1:8080"


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(func)


def api_call(func: F) -> F:
    """Turn API and connection failures into one clear error line (or JSON)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = kwargs.get("as_json", False)
        try:
            return func(*args, **kwargs)
        except ApiUnavailable:
            message = f"keelway is not running for {Home.from_env().root}"
            hint = "start it with `keelway up -d`"
            if as_json:
                fail_json("not-running", message, hint)
            fail(message, hint)
        except ApiError as exc:
            if as_json:
                fail_json(exc.code, exc.message, exc.hint)
            fail(exc.message, exc.hint)

    return wrapper  # type: ignore[return-value]


def client(timeout_s: float | None = 30.0) -> Client:
    return Client(Home.from_env().api_socket, timeout_s)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="keelway")
def cli() -> None:
    """keelway: deploy apps to your own box, with zero downtime."""


# -- up / down ---------------------------------------------------------------------


@cli.command()
@click.option("--demo", is_flag=True, help="Also deploy the bundled example app.")
@click.option("-d", "detach", is_flag=True, help="Run in the background.")
@click.option("--http", "http_addr", default=DEFAULT_HTTP, show_default=True,
              help="Where the router listens.")
@click.option("--router-workers", type=click.IntRange(1, 256), default=None,
              help="Router processes on the listening socket (default: one per core).")
@click.option("--trusted-proxy", "trusted", multiple=True, metavar="IP",
              help="A front proxy whose X-Forwarded-* headers are kept (repeatable).")
@json_option
def up(demo: bool, detach: bool, http_addr: str, router_workers: int | None,
       trusted: tuple[str, ...], as_json: bool) -> None:
    """Start the control plane and the router (state in $KEELWAY_HOME)."""
    home = Home.from_env()
    daemon_argv = [sys.executable, "-m", "keelway.api.daemon", "--http", http_addr]
    daemon_argv += ["--demo"] if demo else []
    if router_workers is not None:
        daemon_argv += ["--router-workers", str(router_workers)]
    daemon_argv += [f"--trusted-proxy={ip}" for ip in trusted]
    if not detach:
        # The foreground control plane replaces this process: Ctrl-C reaches it directly.
        os.execv(sys.executable, daemon_argv)
    try:
        running = client(2.0).request("GET", "/v1/ping")
    except (ApiUnavailable, OSError):
        running = None
    if running is not None:
        message = f"keelway is already running for {home.root} (pid {running['pid']})"
        hint = "stop it first with `keelway down`"
        if as_json:
            fail_json("already-running", message, hint, 3)
        fail(message, hint, 3)
    home.ensure()
    log_fd = os.open(home.daemon_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    start = home.daemon_log.stat().st_size
    proc = subprocess.Popen(daemon_argv, stdin=subprocess.DEVNULL,
                            stdout=log_fd, stderr=log_fd, start_new_session=True)
    os.close(log_fd)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            with open(home.daemon_log, "rb") as handle:
                handle.seek(start)
                lines = handle.read().decode(errors="replace").splitlines()
            errors = [ln for ln in lines if ln.startswith("error:")]
            message = errors[-1][len("error: "):] if errors else f"the daemon exited ({code})"
            hint = f"see {home.daemon_log}"
            if as_json:
                fail_json("start-failed", message, hint, code or 1)
            fail(message, hint, code or 1)
        try:
            info = client(2.0).request("GET", "/v1/ping")
            break
        except (ApiUnavailable, OSError):
            time.sleep(0.1)
    else:
        fail("the control plane did not come up in 120s", f"see {home.daemon_log}")
    apps = client().request("GET", "/v1/status")["apps"]
    urls = [i["url"] for a in apps for i in a["instances"]]
    if as_json:
        emit_json({"pid": info["pid"], "http": http_addr, "api_socket": str(home.api_socket),
                   "urls": urls})
        return
    click.echo(f"keelway is running (pid {info['pid']}); router on http://{http_addr}/")
    for url in urls:
        click.echo(f"  {url}")
    click.echo("stop it with `keelway down`")


@cli.command()
@click.option("--keep-apps", is_flag=True, help="Leave the apps' processes running.")
@json_option
@api_call
def down(keep_apps: bool, as_json: bool) -> None:
    """Stop the control plane and the router (and the apps, unless --keep-apps)."""
    home = Home.from_env()
    info = client().request("GET", "/v1/ping")
    client().request("POST", "/v1/shutdown", {"keep_apps": keep_apps})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and home.api_socket.exists():
        time.sleep(0.05)
    # The socket goes first; the process exits after the apps and the router are down.
    while time.monotonic() < deadline and _pid_alive(info["pid"]):
        time.sleep(0.05)
    if as_json:
        emit_json({"stopped": True, "pid": info["pid"], "keep_apps": keep_apps})
    else:
        click.echo("keelway stopped" + (" (apps left running)" if keep_apps else ""))


def _pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# -- deploy ------------------------------------------------------------------------


def run_operation(path: str, body: dict[str, Any], as_json: bool, what: str,
                  app: str) -> dict[str, Any]:
    """POST a streaming operation: progress lines to stderr, then its result or error."""
    for item in client(None).stream("POST", path, body):
        if item["event"] == "progress":
            if not as_json:
                click.echo(f"-> {item['message']}", err=True)
        elif item["event"] == "error":
            err = item["error"]
            if item.get("replayed") and not as_json:
                click.echo("(replayed: this key already ran)", err=True)
            if as_json:
                fail_json(err["code"], err["message"], err.get("hint"))
            fail(err["message"], err.get("hint"))
        elif item["event"] == "result":
            result: dict[str, Any] = item["result"]
            if as_json:
                emit_json(result | ({"replayed": True} if item.get("replayed") else {}))
            else:
                if item.get("replayed"):
                    click.echo("(replayed: this key already ran)", err=True)
                click.echo(f"{what}")
                for inst in result.get("instances", []):
                    click.echo(f"  {inst['release']}  {inst['url']}")
            return result
    fail(f"the control plane closed the {path} request without a result",
         f"see `keelway ops {app}` and $KEELWAY_HOME/logs/keelway.log")


key_option = click.option("--key", default=None,
                          help="Idempotency key: a repeat replays the recorded outcome.")


@cli.command()
@click.argument("app")
@click.argument("source", type=click.Path())
@click.option("--host", "hosts", multiple=True, help="A hostname to serve (repeatable).")
@click.option("--ref", default=None, help="Deploy this git ref of SOURCE.")
@click.option("--git", "use_git", is_flag=True, help="Deploy SOURCE's git HEAD, not its files.")
@click.option("--mode", type=click.Choice(["overlap", "hold"]), default=None,
              help="Swap every service this way (default: per service, from keelway.toml).")
@key_option
@json_option
@api_call
def deploy(app: str, source: str, hosts: tuple[str, ...], ref: str | None, use_git: bool,
           mode: str | None, key: str | None, as_json: bool) -> None:
    """Build SOURCE (a directory, tarball or git repo) and release it to APP."""
    path = Path(source).expanduser().absolute()
    if not path.exists():
        message, hint = f"{source} does not exist", "give a directory, a tarball or a git repo"
        if as_json:
            fail_json("bad-request", message, hint)
        fail(message, hint)
    body = {"app": app, "source": str(path), "hosts": list(hosts), "ref": ref, "git": use_git,
            "key": key, "mode": mode}
    run_operation("/v1/deploy", body, as_json, f"deployed {app}", app)


@cli.command()
@click.argument("app")
@click.option("--instance", default=None, help="Only this hostname.")
@key_option
@json_option
@api_call
def restart(app: str, instance: str | None, key: str | None, as_json: bool) -> None:
    """Start new processes of what APP runs (overlap or hold per service)."""
    run_operation(f"/v1/apps/{app}/restart", {"instance": instance, "key": key}, as_json,
                  f"restarted {app}", app)


@cli.command()
@click.argument("app")
@click.argument("release", required=False)
@key_option
@json_option
@api_call
def rollback(app: str, release: str | None, key: str | None, as_json: bool) -> None:
    """Release the build and config of an older release (default: the one before)."""
    number: int | None = None
    if release is not None:
        digits = release[1:] if release.startswith("v") else release
        if not digits.isdigit():
            message, hint = f"{release!r} is not a release", "name one like v3"
            if as_json:
                fail_json("bad-request", message, hint)
            fail(message, hint)
        number = int(digits)
    run_operation(f"/v1/apps/{app}/rollback", {"to": number, "key": key}, as_json,
                  f"rolled back {app}", app)


@cli.group(invoke_without_command=True)
@click.argument("app")
@json_option
@click.pass_context
@api_call
def config(ctx: click.Context, app: str, as_json: bool) -> None:
    """Show APP's config vars, or change them: `config APP set K=V`, `config APP unset K`."""
    ctx.obj = app
    if ctx.invoked_subcommand is not None:
        return
    data = client().request("GET", f"/v1/apps/{app}/config")
    if as_json:
        emit_json(data)
        return
    if not data["config"]:
        click.echo(f"{app} has no config vars; set one with `keelway config {app} set K=V`")
    for name, value in sorted(data["config"].items()):
        click.echo(f"{name}={value}")


@config.command("set")
@click.argument("pairs", nargs=-1, required=True)
@key_option
@json_option
@click.pass_obj
@api_call
def config_set(app: str, pairs: tuple[str, ...], key: str | None, as_json: bool) -> None:
    """Set K=V (a new release; processes restart per mode)."""
    values: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            message, hint = f"{pair!r} is not K=V", "write NAME=value"
            if as_json:
                fail_json("bad-request", message, hint)
            fail(message, hint)
        values[name] = value
    run_operation(f"/v1/apps/{app}/config", {"set": values, "key": key}, as_json,
                  f"set {', '.join(values)} on {app}", app)


@config.command("unset")
@click.argument("names", nargs=-1, required=True)
@key_option
@json_option
@click.pass_obj
@api_call
def config_unset(app: str, names: tuple[str, ...], key: str | None, as_json: bool) -> None:
    """Remove config vars (a new release)."""
    run_operation(f"/v1/apps/{app}/config", {"unset": list(names), "key": key}, as_json,
                  f"unset {', '.join(names)} on {app}", app)


@cli.command()
@click.option("--dry-run", is_flag=True, help="Only say what it would do.")
@json_option
@api_call
def reconcile(dry_run: bool, as_json: bool) -> None:
    """Converge every instance, as boot does (leftovers, interrupted operations)."""
    data = client(None).request("POST", "/v1/reconcile", {"dry_run": dry_run})
    if as_json:
        emit_json(data)
        return
    verb = "would" if dry_run else "did"
    quiet = True
    for item in data["instances"]:
        for action in item["actions"]:
            click.echo(f"{item['instance']}: {verb} {action}")
            quiet = False
        if item["error"]:
            click.echo(f"{item['instance']}: {item['error']}")
            quiet = False
    if quiet:
        click.echo("nothing to do: every instance is converged")


# -- reading -----------------------------------------------------------------------


@cli.command()
@json_option
@api_call
def apps(as_json: bool) -> None:
    """List apps."""
    data = client().request("GET", "/v1/apps")
    if as_json:
        emit_json(data)
        return
    if not data["apps"]:
        click.echo("no apps yet: deploy one with `keelway deploy NAME PATH`")
        return
    table(None, ["app", "release", "instances"],
          [(a["name"], a["release"] or "-", ", ".join(a["instances"])) for a in data["apps"]])


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
    if not data["apps"]:
        click.echo("no apps yet: deploy one with `keelway deploy NAME PATH`")
    for item in data["apps"]:
        rows = []
        notes = []
        for inst in item["instances"]:
            last = inst["last_operation"]
            if inst.get("down_reason"):
                notes.append(f"{inst['host']} is down: {inst['down_reason']}; deploy a fix, "
                             f"`keelway rollback {item['name']}` or `keelway start`")
            if inst.get("failed_closed"):
                closed = inst["failed_closed"]
                notes.append(f"{inst['host']} is failed closed, leftover "
                             f"{', '.join(closed['leftovers'])}: {closed['next']}")
            if last and last["state"] != "succeeded":
                notes.append(f"{inst['host']}: last {last['kind']} {last['state']}"
                             + (f": {last['error']}" if last["error"] else ""))
            for proc in inst["processes"] or [None]:
                rows.append((
                    inst["host"], inst["state"], inst["release"] or "-",
                    proc["service"] if proc else "-",
                    f"{proc['id']}{'' if proc['active'] else ' (leftover)'}" if proc else "-",
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
    import json

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
        line = f"op {op['id']} {op['kind']} {op['instance']}: {op['state']}"
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


# -- mutations ---------------------------------------------------------------------


def _instance_command(verb: str) -> Callable[..., None]:
    @click.argument("app")
    @click.option("--instance", default=None, help="Only this hostname.")
    @json_option
    @api_call
    def command(app: str, instance: str | None, as_json: bool) -> None:
        data = client(None).request("POST", f"/v1/apps/{app}/{verb}", {"instance": instance})
        if as_json:
            emit_json(data)
            return
        done = data["stopped" if verb == "stop" else "started"]
        click.echo(f"{verb}{'ped' if verb == 'stop' else 'ed'} {', '.join(done) or 'nothing'}")

    command.__doc__ = f"{verb.capitalize()} the app's instances (or one with --instance)."
    return command


cli.command("stop")(_instance_command("stop"))
cli.command("start")(_instance_command("start"))


@cli.command()
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@json_option
@api_call
def gc(dry_run: bool, as_json: bool) -> None:
    """Remove staged builds that no release or process names."""
    data = client(None).request("POST", "/v1/gc", {"dry_run": dry_run})
    if as_json:
        emit_json(data)
        return
    verb = "would remove" if dry_run else "removed"
    if not data["removed"]:
        click.echo("nothing to remove")
    for item in data["removed"]:
        click.echo(f"{verb} {item['app']} build {item['digest'][:12]}")


@cli.group()
def router() -> None:
    """The router (data plane) process."""


@router.command("restart")
@json_option
@api_call
def router_restart(as_json: bool) -> None:
    """Replace the router process without dropping a connection (socket handoff)."""
    data = client(60.0).request("POST", "/v1/router/restart")
    if as_json:
        emit_json(data)
        return
    click.echo(f"router restarted: pid {data['old_pid']} handed over to pid {data['new_pid']}")


def main() -> None:
    cli(prog_name="keelway")


if __name__ == "__main__":
    main()
