"""`keelway install-service`: a systemd unit that runs this keelway's control plane.

The unit keeps keelway's design, that the router and the apps outlive the control plane:
- `ExecStop=` is `keelway down --keep-apps`, and `KillMode=process` has systemd signal
  only the control plane, so `systemctl restart keelway` (an upgrade, a changed flag)
  replaces the control plane alone and the new one adopts the router and the apps,
  as it does after a crash. `keelway down` is still what stops them all.
- `Restart=always`: a control plane that dies is started again; it finishes or undoes
  whatever the crash interrupted (the journal) before it serves.
- `Delegate=yes`: keelway makes and removes cgroups for each generation and build step
  (keelway/runtime/tree.py), which systemd must leave alone.
- `LimitNOFILE=`: the router holds two descriptors per proxied connection; each app's
  own limit is set by keelway (`--default-nofile`), not inherited from here.
- `TasksMax=infinity`: where no cgroup is writable, the apps' processes count against
  this unit; their bound is keelway's `pids` limit per process tree.

Nothing is written with `--print`, and a different unit already there is replaced only
with `--force`: the file is written whole or not at all (temp, fsync, rename).
"""

from __future__ import annotations

import os
import pwd
import sys
from pathlib import Path

import click

from keelway.cli.base import cli, json_option
from keelway.cli.output import emit_json, fail, fail_json
from keelway.durable import write_atomic
from keelway.home import Home

UNIT_NAME = "keelway.service"
DEFAULT_UNIT_DIR = Path("/etc/systemd/system")
NOFILE = 1048576
# A unit file holds no secret (config values live in the store), and systemd and its
# tools read units as any user.
UNIT_MODE = 0o644


class UnitRefused(ValueError):
    """A value the unit cannot carry (a line break would start another directive)."""


def _word(text: str, dollar: bool = True) -> str:
    """One word of an Exec or Environment line as systemd reads it back: quoted when it
    holds whitespace or quotes, `%` (specifiers) and, on Exec lines, `$` (variables)
    doubled so that neither is expanded."""
    if any(ch in text for ch in "\n\r\0"):
        raise UnitRefused(f"{text!r} holds a line break or NUL, which a unit cannot carry")
    said = text.replace("%", "%%")
    if dollar:
        said = said.replace("$", "$$")
    if said and not any(ch.isspace() or ch in "\"'\\;" for ch in said):
        return said
    return '"' + said.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unit_text(python: str, user: str, home: Path, up_args: list[str]) -> str:
    """The unit, from its values alone (no I/O)."""
    keelway = [_word(python), "-m", "keelway.cli.main"]
    start = " ".join([*keelway, "up", *(_word(a) for a in up_args)])
    stop = " ".join([*keelway, "down", "--keep-apps"])
    return "\n".join([
        "# keelway's control plane, written by `keelway install-service`.",
        "# A restart replaces the control plane alone: the router and the apps serve on",
        "# and the new one adopts them. `keelway down` stops them all.",
        "[Unit]",
        f"Description=keelway control plane ({home})",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"User={user}",
        f"Environment={_word(f'KEELWAY_HOME={home}', dollar=False)}",
        f"ExecStart={start}",
        # `-`: a control plane already gone is no failure of the stop.
        f"ExecStop=-{stop}",
        "Restart=always",
        "RestartSec=2s",
        "KillMode=process",
        "Delegate=yes",
        f"LimitNOFILE={NOFILE}",
        "TasksMax=infinity",
        "TimeoutStopSec=90s",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ])


@cli.command("install-service")
@click.option("--user", default=None, metavar="USER",
              help="Who the control plane runs as (default: you). root gives each "
                   "tenant a uid of its own.")
@click.option("--home", "home_dir", default=None, metavar="DIR",
              help="Its KEELWAY_HOME (default: this shell's, else the user's default).")
@click.option("--unit-dir", default=str(DEFAULT_UNIT_DIR), metavar="DIR",
              help=f"Where the unit is written (default: {DEFAULT_UNIT_DIR}).")
@click.option("--print", "print_only", is_flag=True,
              help="Print the unit and write nothing.")
@click.option("--force", is_flag=True, help="Replace a different unit already there.")
@click.argument("up_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- UP_FLAGS...]")
@json_option
def install_service(user: str | None, home_dir: str | None, unit_dir: str,
                    print_only: bool, force: bool, up_args: tuple[str, ...],
                    as_json: bool) -> None:
    """Write a systemd unit that runs `keelway up` in the foreground with the flags
    after `--`, as USER with its home; then say how to enable it."""

    def refuse(message: str, hint: str) -> None:
        if as_json:
            fail_json("bad-request", message, hint)
        fail(message, hint)

    user = user or pwd.getpwuid(os.geteuid()).pw_name
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        refuse(f"there is no user {user!r} on this box",
               f"create it first (`useradd --system {user}`), or name another with --user")
        return
    home = _home_of(home_dir, account)
    if home is None:
        refuse(f"which home should {user}'s keelway use?",
               "name it with --home DIR (e.g. /var/lib/keelway)")
        return
    if "-d" in up_args:
        refuse("the unit runs `keelway up` in the foreground; -d would detach it from "
               "systemd", "drop -d from the flags after --")
    try:
        # The flags are read as `up` reads them, so a typo fails here, not at boot.
        up = cli.commands["up"]
        up.make_context("up", list(up_args))
        text = unit_text(sys.executable, user, home, list(up_args))
    except click.ClickException as exc:
        refuse(f"the flags after -- are not `keelway up`'s: {exc.format_message()}",
               "see `keelway up --help`")
        return
    except UnitRefused as exc:
        refuse(str(exc), "give the value without it")
        return
    path = Path(unit_dir) / UNIT_NAME
    unit_name = UNIT_NAME.removesuffix(".service")
    enable = f"systemctl daemon-reload && systemctl enable --now {unit_name}"
    written = False
    if not print_only:
        try:
            before: str | None = path.read_text()
        except FileNotFoundError:
            before = None
        if before is not None and before != text and not force:
            refuse(f"{path} exists and differs from the unit this would write",
                   "see the new one with --print; replace it with --force")
        if not Path(unit_dir).is_dir():
            refuse(f"{unit_dir} is not a directory", "name one with --unit-dir")
        if before != text:
            try:
                write_atomic(path, text.encode(), UNIT_MODE)
            except PermissionError:
                refuse(f"no permission to write {path}", "run it as root (sudo)")
            written = True
    if as_json:
        emit_json({"path": str(path), "written": written, "printed": print_only,
                   "unit": text, "user": user, "home": str(home), "next": enable})
        return
    if print_only:
        click.echo(text, nl=False)
        return
    click.echo(f"{'wrote' if written else 'unchanged:'} {path}")
    if account.pw_uid != 0:
        click.echo(f"runs as {user}: tenants share that uid (run as root for a uid each)")
    click.echo(f"next: {enable}")
    click.echo(f"then: `systemctl status {unit_name}`, `journalctl -u {unit_name}`; "
               "a `keelway up -d` running for that home now must stop first "
               "(`keelway down --keep-apps`)")


def _home_of(home_dir: str | None, account: pwd.struct_passwd) -> Path | None:
    """The home the unit names: --home; else, for a unit that runs as you, the one
    `keelway up` would use now (keelway/home.py); None: another user's must be named."""
    if home_dir is not None:
        return Path(home_dir).expanduser().absolute()
    if account.pw_uid == os.geteuid():
        return Home.from_env().root
    return None
