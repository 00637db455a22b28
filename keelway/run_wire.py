"""The wire protocol of `keelway run`: the CLI lends its terminal to a process the daemon
spawns, over the home's run socket (Home.run_socket, 0600).

Why not the HTTP API: the child's stdio must be the user's terminal itself (a TTY when
there is one), and what it prints (a secret, a password prompt) must never pass through
the control plane or its API. So the CLI sends its descriptors 0, 1 and 2 with the
first message (SCM_RIGHTS), and nothing else of the child's I/O ever crosses the socket.

One JSON object per line, each with a `type`; a message is valid by construction (the
decoder refuses a line that is not exactly one known message), so neither side reads a
free dict. The conversation:

    CLI                                      daemon
    run {app, instance, argv, tty, term} + fds ->
                                          <- started {pid, instance, release}
                                             or refused {code, message, hint}
    signal {signal}  (0..n)              ->
                                          <- exited {code}

`exited.code` is what the CLI exits with: the child's exit status, or 128+N when a
signal N ended it (as a shell reports it). The CLI closing the socket is a hangup: the
daemon stops the child's whole tree and proves it gone. A leaf module (stdlib only): the
CLI imports it and must start fast.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from signal import Signals
from typing import Any

# A request line carries the argv; anything longer than this is not a command line.
MAX_LINE_BYTES = 256 * 1024
# Descriptors the CLI lends: stdin, stdout, stderr, in that order.
STDIO_FDS = 3
# The signals the CLI forwards to the child's session; any other name is refused.
FORWARDED = frozenset({"SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGWINCH"})


class WireError(Exception):
    """The peer sent something that is not a message of this protocol."""


@dataclass(frozen=True)
class RunRequest:
    app: str
    instance: str | None
    argv: tuple[str, ...]
    tty: bool
    # The CLI's TERM when its stdin is a terminal: the child's programs need it to draw.
    term: str | None = None


@dataclass(frozen=True)
class Forward:
    """A signal the user sent the CLI, for the child's session."""

    signal: str

    @property
    def signum(self) -> Signals:
        return Signals[self.signal]


@dataclass(frozen=True)
class Started:
    """The command runs: what the daemon says, and what `Runs.run` hands its caller
    (one record, so the message is the run's own facts, not a copy of them)."""

    pid: int
    instance: str
    release: int


@dataclass(frozen=True)
class Refused:
    code: str
    message: str
    hint: str | None


@dataclass(frozen=True)
class Exited:
    code: int


Message = RunRequest | Forward | Started | Refused | Exited

_TYPES: dict[str, type[Message]] = {
    "run": RunRequest, "signal": Forward, "started": Started, "refused": Refused,
    "exited": Exited,
}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def encode(message: Message) -> bytes:
    body = asdict(message)
    if isinstance(message, RunRequest):
        body["argv"] = list(message.argv)
    return json.dumps({"type": _NAMES[type(message)], **body},
                      separators=(",", ":")).encode() + b"\n"


def exit_code(returncode: int) -> int:
    """A child's status as a shell reports it: a signal N is 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def _str(body: dict[str, Any], name: str, optional: bool = False) -> Any:
    value = body.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise WireError(f"`{name}` must be a string")
    return value


def _int(body: dict[str, Any], name: str) -> int:
    value = body.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise WireError(f"`{name}` must be an integer")
    return value


def decode(line: bytes) -> Message:
    """One line (without or with its newline) as a message; WireError if it is not one."""
    try:
        body = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError("not a JSON line") from exc
    if not isinstance(body, dict):
        raise WireError("not a JSON object")
    kind = body.pop("type", None)
    cls = _TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise WireError(f"unknown message type {kind!r}")
    expected = {"run": {"app", "instance", "argv", "tty", "term"}, "signal": {"signal"},
                "started": {"pid", "instance", "release"},
                "refused": {"code", "message", "hint"}, "exited": {"code"}}[kind]
    if set(body) != expected:
        raise WireError(f"a {kind} message has exactly {', '.join(sorted(expected))}")
    if cls is RunRequest:
        argv = body["argv"]
        if (not isinstance(argv, list) or not argv or argv[0] == ""
                or not all(isinstance(a, str) and "\0" not in a for a in argv)):
            raise WireError("`argv` must be a non-empty list of strings without NUL")
        if not isinstance(body["tty"], bool):
            raise WireError("`tty` must be true or false")
        return RunRequest(_str(body, "app"), _str(body, "instance", optional=True),
                          tuple(argv), body["tty"], _str(body, "term", optional=True))
    if cls is Forward:
        name = _str(body, "signal")
        if name not in FORWARDED:
            raise WireError(f"signal {name!r} is not forwarded")
        return Forward(name)
    if cls is Started:
        return Started(_int(body, "pid"), _str(body, "instance"), _int(body, "release"))
    if cls is Refused:
        return Refused(_str(body, "code"), _str(body, "message"),
                       _str(body, "hint", optional=True))
    return Exited(_int(body, "code"))


class Lines:
    """Bytes in, whole lines out: the framing, with no I/O (fed by either side)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[Message]:
        """Every whole message `data` completes; WireError on a line too long or bad."""
        self._buffer += data
        while (end := self._buffer.find(b"\n")) >= 0:
            line = bytes(self._buffer[:end])
            del self._buffer[:end + 1]
            yield decode(line)
        if len(self._buffer) > MAX_LINE_BYTES:
            raise WireError(f"a line longer than {MAX_LINE_BYTES} bytes")
