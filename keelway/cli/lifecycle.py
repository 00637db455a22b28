"""Running keelway: `up`, `down`, and the router process (`router restart`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import click

from keelway.admin_access import AdminAccessError, required_token
from keelway.cli.base import DEFAULT_HTTP, answered, api_command, cli, client
from keelway.cli.client import ApiError, ApiLost, ApiUnavailable
from keelway.cli.output import EXIT_ALREADY_RUNNING, emit_json, fail, fail_json
from keelway.durable import DISK_FULL_HINT
from keelway.home import Home
from keelway.limits import LimitError, box_build_limits, box_limits, frozen_budget_bytes

_DAEMON_DISK_FULL = 5  # keelway.api.daemon.EXIT_DISK_FULL, which the CLI does not import


@cli.command()
@click.option("--demo", is_flag=True, help="Also deploy the bundled example app.")
@click.option("-d", "detach", is_flag=True, help="Run in the background.")
@click.option("--http", "http_addr", default=None, metavar="ADDR",
              help=f"Where the router listens (default: where it already does, else "
                   f"{DEFAULT_HTTP}).")
@click.option("--router-workers", type=click.IntRange(1, 256), default=None,
              help="Router processes on the listening socket (default: one per core).")
@click.option("--trusted-proxy", "trusted", multiple=True, metavar="IP",
              help="A front proxy whose X-Forwarded-* headers are kept (repeatable).")
@click.option("--hold-timeout", type=click.FloatRange(0.1, 600), default=None,
              metavar="SECONDS",
              help="How long the router holds a request for a wake (default: 30).")
@click.option("--objects", default=None, metavar="s3://BUCKET/PREFIX",
              help="Keep snapshots in S3 (AWS_* variables for the endpoint and keys); "
                   "kept for later `up`s (default: $KEELWAY_HOME/objects).")
@click.option("--max-concurrency", type=click.IntRange(1, 100_000), default=None,
              metavar="N", help="Requests in flight to one instance at once, past which "
                                "its requests get 503 (default: 100).")
@click.option("--https", "https_addr", default=None, metavar="ADDR|off",
              help="Where the router also serves HTTPS (e.g. 0.0.0.0:443), from the "
                   "certificates `keelway certs` keeps; `off` stops it (default: as it "
                   "was).")
@click.option("--admin", "admin_addr", default=None, metavar="ADDR|off",
              help="Serve /metrics and a read-only dashboard there (e.g. 127.0.0.1:9180), "
                   "kept for later `up`s; off loopback KEELWAY_ADMIN_TOKEN must be set; "
                   "`off` stops it (default: as it was).")
@click.option("--metrics-per-instance", is_flag=True,
              help="Label /metrics series by instance too (default: summed per app).")
@click.option("--no-access-log", is_flag=True,
              help="The router writes no access log (default: a line per request in "
                   "each instance's logs, read by `logs APP --service router`).")
@click.option("--frozen-budget", default=None, metavar="SIZE|off",
              help="Memory idle frozen instances may keep together before the one frozen "
                   "longest is parked (default: a quarter of the apps' memory).")
@click.option("--acme-directory", default=None, metavar="URL|off",
              help="The ACME CA HTTPS certificates are ordered from, kept for later "
                   "`up`s; `off` orders none (default: Let's Encrypt).")
@click.option("--acme-email", default=None, metavar="EMAIL",
              help="The contact the CA's account is registered with.")
@click.option("--acme-ca-bundle", default=None, metavar="FILE",
              type=click.Path(exists=True, dir_okay=False, resolve_path=True),
              help="Trust the CA's API by this root (a private or test CA).")
@click.option("--acme-challenge", default=None,
              type=click.Choice(["auto", "http-01", "tls-alpn-01"]),
              help="How names are proven: HTTP-01 on port 80, TLS-ALPN-01 on 443 "
                   "(default: auto, HTTP-01 unless only HTTPS is on 443).")
@click.option("--jobs-at-once", type=click.IntRange(1, 10_000), default=None, metavar="N",
              help="Scheduled jobs' runs under way on the box at once (default: 8).")
@click.option("--default-memory", default=None, metavar="SIZE",
              help="Memory per process tree of a service that sets none (default: 1G).")
@click.option("--default-cpu", default=None, metavar="CPUS",
              help="CPU per process tree, in cores (default: no quota).")
@click.option("--default-pids", default=None, metavar="N",
              help="Processes per process tree (default: 512).")
@click.option("--default-nofile", default=None, metavar="N",
              help="Open files per process (default: 4096).")
@click.option("--build-memory", default=None, metavar="SIZE",
              help="Memory per build step, the most an app's [build] may ask for "
                   "(default: 2G, or half the apps' memory on a smaller box).")
@click.option("--build-timeout", default=None, metavar="DURATION",
              help="Time per build, the most an app's [build] may ask for (default: 30m).")
@click.option("--build-disk", default=None, metavar="SIZE",
              help="Disk a build's tree may grow to, the most an app's [build] may ask "
                   "for (default: 4G).")
@api_command
def up(demo: bool, detach: bool, http_addr: str | None, router_workers: int | None,
       trusted: tuple[str, ...], hold_timeout: float | None, objects: str | None,
       max_concurrency: int | None, https_addr: str | None, jobs_at_once: int | None,
       default_memory: str | None, default_cpu: str | None, default_pids: str | None,
       default_nofile: str | None, build_memory: str | None, build_timeout: str | None,
       build_disk: str | None, acme_directory: str | None, acme_email: str | None,
       acme_ca_bundle: str | None, acme_challenge: str | None, frozen_budget: str | None,
       admin_addr: str | None, metrics_per_instance: bool, no_access_log: bool,
       as_json: bool) -> None:
    """Start the control plane and the router (state in $KEELWAY_HOME)."""
    home = Home.from_env()
    given = {"memory": default_memory, "cpu": default_cpu, "pids": default_pids,
             "nofile": default_nofile}
    build = {"memory": build_memory, "timeout": build_timeout, "disk": build_disk}
    try:
        # refused here, before anything starts, with why
        box_limits(**given)
        box_build_limits(build_memory, build_timeout, build_disk)
        frozen_budget_bytes(frozen_budget, None)
    except LimitError as exc:
        raise click.UsageError(str(exc)) from None
    if admin_addr is not None and admin_addr != "off":
        _check_admin(admin_addr)
    daemon_argv = [sys.executable, "-m", "keelway.api.daemon"]
    daemon_argv += ["--http", http_addr] if http_addr is not None else []
    daemon_argv += ["--demo"] if demo else []
    if router_workers is not None:
        daemon_argv += ["--router-workers", str(router_workers)]
    daemon_argv += [f"--trusted-proxy={ip}" for ip in trusted]
    if hold_timeout is not None:
        daemon_argv += ["--hold-timeout", str(hold_timeout)]
    daemon_argv += ["--objects", objects] if objects is not None else []
    if max_concurrency is not None:
        daemon_argv += ["--max-concurrency", str(max_concurrency)]
    if jobs_at_once is not None:
        daemon_argv += ["--jobs-at-once", str(jobs_at_once)]
    daemon_argv += ["--https", https_addr] if https_addr is not None else []
    daemon_argv += ["--frozen-budget", frozen_budget] if frozen_budget is not None else []
    daemon_argv += ["--admin", admin_addr] if admin_addr is not None else []
    daemon_argv += ["--metrics-per-instance"] if metrics_per_instance else []
    daemon_argv += ["--no-access-log"] if no_access_log else []
    for flag, value in (("directory", acme_directory), ("email", acme_email),
                        ("ca-bundle", acme_ca_bundle), ("challenge", acme_challenge)):
        daemon_argv += [f"--acme-{flag}", value] if value is not None else []
    daemon_argv += [f"--default-{name}={value}" for name, value in given.items()
                    if value is not None]
    daemon_argv += [f"--build-{name}={value}" for name, value in build.items()
                    if value is not None]
    if not detach:
        # The foreground control plane replaces this process: Ctrl-C reaches it directly.
        os.execv(sys.executable, daemon_argv)
    try:
        running = client(2.0).request("GET", "/v1/ping")
    except (ApiUnavailable, ApiLost, OSError):  # none, or one going away: its lock says
        running = None
    if running is not None:
        _already_running(home, running["pid"], as_json)
        return
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
            hint, kind = f"see {home.daemon_log}", "start-failed"
            if code == _DAEMON_DISK_FULL:  # its log line may not have fit on the disk
                message = message if errors else f"the disk is full: {home.root} has no room"
                hint, kind = DISK_FULL_HINT, "disk-full"
            if as_json:
                fail_json(kind, message, hint, code or 1)
            fail(message, hint, code or 1)
        try:
            info = client(2.0).request("GET", "/v1/ping")
            break
        except (ApiUnavailable, ApiLost, OSError):  # not listening yet, or still starting
            time.sleep(0.1)
    else:
        fail("the control plane did not come up in 120s", f"see {home.daemon_log}")
    # `--json` keeps naming every URL (its readers expect them all); the words name a
    # few and count the rest, from one page of each app (keelway/api/status.py).
    status = client().request("GET", "/v1/status" + ("" if as_json else
                                                     f"?page=1&per_page={URLS_SHOWN}"))
    urls = [i["url"] for a in status["apps"] for i in a["instances"]]
    addr = status["router"]["addr"]
    if as_json:
        emit_json({"pid": info["pid"], "http": addr, "api_socket": str(home.api_socket),
                   "urls": urls})
        return
    click.echo(f"keelway is running (pid {info['pid']}); router on http://{addr}/")
    for url in urls[:URLS_SHOWN]:
        click.echo(f"  {url}")
    total = sum(a["summary"]["instances"] for a in status["apps"])
    if total > URLS_SHOWN:
        apps = len(status["apps"])
        click.echo(f"  … and {total - URLS_SHOWN} more instances of {apps} "
                   f"app{'' if apps == 1 else 's'} (`keelway status`)")
    click.echo("stop it with `keelway down`")


# How many URLs `up -d` names before it counts the rest.
URLS_SHOWN = 10


def _already_running(home: Home, pid: int, as_json: bool) -> None:
    """`up -d` with the control plane up: an error, unless its router is down (it
    crashes at start, say, and waits out its backoff); then `up` means start it now."""
    router = client().request("GET", "/v1/status").get("router")
    if router is not None and router["state"] == "down":
        try:
            data = client(60.0).request("POST", "/v1/router/restart")
        except ApiError as exc:
            if as_json:
                fail_json(exc.code, exc.message, exc.hint)
            fail(exc.message, exc.hint)
        if as_json:
            emit_json({"pid": pid, "already_running": True, "router_started": data})
            return
        click.echo(f"keelway is already running (pid {pid}); its router was down: started "
                   f"it again (pid {data['new_pid']}) on http://{router['addr']}/")
        return
    message = f"keelway is already running for {home.root} (pid {pid})"
    hint = "stop it first with `keelway down`"
    if as_json:
        fail_json("already-running", message, hint, EXIT_ALREADY_RUNNING)
    fail(message, hint, EXIT_ALREADY_RUNNING)


def _check_admin(addr: str) -> None:
    """`--admin` refused here, before anything starts, as the control plane would
    refuse it (keelway/admin_access.py): an address others can reach needs the token."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.UsageError(f"--admin: {addr!r} is not HOST:PORT")
    try:
        required_token(host, dict(os.environ))
    except AdminAccessError as exc:
        raise click.UsageError(str(exc)) from None


@cli.command()
@click.option("--keep-apps", is_flag=True,
              help="Leave the apps' processes and the router running (traffic flows on).")
@api_command
def down(keep_apps: bool, as_json: bool) -> None:
    """Stop the control plane, the router and the apps (with --keep-apps, only the
    control plane: the router and the apps serve on, and `up` adopts them)."""
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
        click.echo("keelway stopped" + (" (the router and the apps serve on)" if keep_apps
                                        else ""))


def _pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@cli.group()
def router() -> None:
    """The router (data plane) process."""


@router.command("restart")
@api_command
def router_restart(as_json: bool) -> None:
    """Replace the router process without dropping a connection (socket handoff); a
    dead router is started again at once."""
    data = client(60.0).request("POST", "/v1/router/restart")
    if answered(data, as_json):
        return
    if data["was_dead"]:
        click.echo(f"router started: pid {data['old_pid']} was dead, pid {data['new_pid']} "
                   "serves on the same socket")
        return
    click.echo(f"router restarted: pid {data['old_pid']} handed over to pid {data['new_pid']}")

