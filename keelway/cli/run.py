"""`keelway run APP [--instance H] -- CMD...`: a one-off process, on this terminal.

The daemon spawns the command (in the instance's ACTIVE build, its working dir and its
whole environment); this process lends it descriptors 0, 1 and 2 over the run socket
(keelway/run_wire.py) and then only relays signals and waits for the exit code, which
it exits with. The command's I/O never passes through keelway.

The limitation, honestly: the child has the terminal as its stdio (isatty() is true,
termios works, so prompts can hide a password and line editing works), but not as its
controlling terminal, which stays this CLI's session's. So Ctrl-C, Ctrl-\\ and window
size changes reach the child only because this CLI forwards them; /dev/tty cannot be
opened in the child; a shell there has no job control; and Ctrl-Z is ignored here
(suspending this CLI would leave the child reading the terminal beside your shell).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import termios
from collections.abc import Iterator
from types import FrameType
from typing import Any, NoReturn

import click

from keelway import run_wire
from keelway.cli.base import api_call, cli, client, json_option
from keelway.cli.output import EXIT_LOST, fail, fail_json
from keelway.cli.plans import dry_run_option, echo_plan
from keelway.home import Home
from keelway.run_wire import Exited, Forward, Lines, Refused, RunRequest, Started, WireError

_IGNORED = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("app")
@click.option("--instance", "host", default=None, metavar="HOST",
              help="The instance to run in (needed when the app has several).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED,
                metavar="[--] CMD...")
@dry_run_option
@json_option
def run(app: str, host: str | None, command: tuple[str, ...], dry_run: bool,
        as_json: bool) -> None:
    """Run CMD once in an instance's build and environment, on this terminal.

    Put `--` before CMD when it has options of its own. Exits with CMD's exit code
    (128+N for a signal N); the run is journaled (`keelway ops APP`). With --json, a
    refusal prints JSON on stdout as usual, and the outcome of a run prints on stderr
    (stdout is the command's)."""
    if dry_run:
        _dry_run(app, host, command, as_json=as_json)
        return
    home = Home.from_env()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(home.run_socket))
    except (FileNotFoundError, ConnectionRefusedError):
        _refuse(as_json, "not-running", f"keelway is not running for {home.root}",
                "start it with `keelway up -d`")
    tty = os.isatty(0)
    request = RunRequest(app, host, command, tty, os.environ.get("TERM") if tty else None)
    saved = _terminal_state()
    line = run_wire.encode(request)
    # Forwarding starts before the request goes: the command may run (and the user press
    # Ctrl-C) before the started line is here. A signal arriving meanwhile waits until
    # the request is whole, so its line never lands inside the request's.
    forwarded = [signal.Signals[name] for name in sorted(run_wire.FORWARDED)]
    signal.pthread_sigmask(signal.SIG_BLOCK, forwarded)
    _forward_signals(sock)
    try:
        sent = socket.send_fds(sock, [line], [0, 1, 2])
        if sent < len(line):  # a long command line may not fit in one send
            sock.sendall(line[sent:])
    except BrokenPipeError:
        pass  # the daemon answered (a refusal) and closed already: its answer is read next
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, forwarded)
    lines = Lines()
    messages = _messages(sock, lines)
    first = next(messages, None)
    if isinstance(first, Refused):
        _refuse(as_json, first.code, first.message, first.hint)
    if not isinstance(first, Started):
        _lost(as_json, command, started=False)
    try:
        end = next(messages, None)
    finally:
        _restore_terminal(saved)
    if not isinstance(end, Exited):
        _lost(as_json, command, started=True)
    if as_json:
        click.echo(json.dumps({"run": {"exit_code": end.code, "pid": first.pid,
                                       "instance": first.instance,
                                       "release": f"v{first.release}"}}), err=True)
    sys.exit(end.code)


def _messages(sock: socket.socket, lines: Lines) -> Iterator[run_wire.Message]:
    """Messages from the daemon until it closes the socket (or says garbage)."""
    while True:
        try:
            data = sock.recv(65536)
        except OSError:
            return
        if not data:
            return
        try:
            yield from lines.feed(data)
        except WireError:
            return


def _forward_signals(sock: socket.socket) -> None:
    """Signals the terminal sends this process go to the child's session instead.
    The handler only sends one line: the main thread is blocked in recv meanwhile."""

    def forward(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            sock.sendall(run_wire.encode(Forward(signal.Signals(signum).name)))

    for name in sorted(run_wire.FORWARDED):
        signal.signal(signal.Signals[name], forward)
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)


def _terminal_state() -> list[Any] | None:
    """The terminal's modes, to put back whatever the child leaves them in (a command
    killed at a password prompt would leave echo off)."""
    if not os.isatty(0):
        return None
    try:
        return termios.tcgetattr(0)
    except termios.error:
        return None


def _restore_terminal(saved: list[Any] | None) -> None:
    if saved is not None:
        with contextlib.suppress(termios.error, OSError):
            termios.tcsetattr(0, termios.TCSADRAIN, saved)


def _refuse(as_json: bool, code: str, message: str, hint: str | None) -> NoReturn:
    if as_json:
        fail_json(code, message, hint)
    fail(message, hint)


def _lost(as_json: bool, command: tuple[str, ...], started: bool) -> NoReturn:
    program = os.path.basename(command[0])
    message = (f"the control plane went away while {program} ran; keelway stops it when "
               "it comes back" if started else
               f"the control plane closed the run of {program} before it started")
    hint = "see $KEELWAY_HOME/logs/keelway.log"
    if as_json:
        click.echo(json.dumps({"error": {"code": "lost", "message": message, "hint": hint}}),
                   err=True)
        sys.exit(EXIT_LOST)
    fail(message, hint, EXIT_LOST)


@api_call
def _dry_run(app: str, host: str | None, command: tuple[str, ...], as_json: bool) -> None:
    """The plan the run would run; nothing starts. Only the program's name is sent,
    never its arguments (one may be a secret)."""
    program = [os.path.basename(command[0])] if command else []
    echo_plan(client(None).request("POST", f"/v1/apps/{app}/run-plan",
                                   {"instance": host, "argv": program}), as_json)
