"""The real CLI against a control plane that goes away mid-request: a unix-socket server
in the test's home that reads the request and then closes, resets, or cuts its answer
short (the danger faked; everything else is real). Every command says what is known,
names where its request stands, exits EXIT_LOST, never prints a traceback, and with
--json prints a JSON error."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from keelway.cli.base import AFTER_LOST
from keelway.cli.main import cli
from keelway.cli.output import EXIT_LOST

HOST = "one.test"


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head


# How the fake control plane dies, once it has the whole request.
def _close(conn: socket.socket) -> None:
    """Closed without a word: http.client's RemoteDisconnected."""


def _reset(conn: socket.socket) -> None:
    """Closed with the rest of the request unread: the client's read is reset
    (ConnectionResetError), or its send finds the pipe broken."""


def _cut_body(conn: socket.socket) -> None:
    """A status line and headers promising 100 bytes, then 10: an incomplete read."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"apps\": [")


def _cut_stream(conn: socket.socket) -> None:
    """A streamed operation's first progress line, then nothing (no last chunk)."""
    line = b'{"event": "progress", "message": "building"}\n'
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(line), line))


DEATHS = {"close": _close, "reset": _reset, "cut-body": _cut_body, "cut-stream": _cut_stream}


@contextlib.contextmanager
def dying_control_plane(home: Path, how: str) -> Iterator[list[bytes]]:
    """A server on `home`'s API socket that takes each request whole, then dies `how`;
    yields the request heads it saw."""
    home.mkdir(parents=True, exist_ok=True)
    seen: list[bytes] = []
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(home / "api.sock"))
    server.listen(8)
    server.settimeout(0.02)  # how soon the server sees `stop`: each test waits that long
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(10)
                # A reset takes only the start of the request and leaves the rest unread.
                seen.append(conn.recv(16) if how == "reset" else _read_request(conn))
                DEATHS[how](conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(5)
        server.close()
        (home / "api.sock").unlink()


def _keelway(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "keelway.cli.main", *args],
                          env={**os.environ, "KEELWAY_HOME": str(home)},
                          capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


CASES = [
    # (how it dies, the command, what the answer must name as where it stands)
    ("close", ["seed", "import", HOST, "./copy.sqlite3"], f"keelway seed status {HOST}"),
    ("reset", ["seed", "import", HOST, "./copy.sqlite3"], f"keelway seed status {HOST}"),
    ("cut-body", ["seed", "rollback", HOST], f"keelway seed status {HOST}"),
    ("close", ["wake", HOST], "keelway status"),
    ("cut-body", ["park", HOST], "keelway status"),
    ("close", ["restart", "blog", "--instance", HOST], f"keelway ops blog --instance {HOST}"),
    ("cut-stream", ["deploy", "blog", "."], "keelway ops blog"),
    ("close", ["deploy", "blog", "."], "keelway ops blog"),
    ("reset", ["instances", "add", "blog", HOST], "keelway instances list blog"),
    ("close", ["config", "blog", "set", "A=1"], "keelway ops blog"),
    ("close", ["db", "snapshot", HOST], f"keelway db snapshots {HOST}"),
    # A request too big to send before the reset: a broken pipe while sending.
    ("reset", ["config", "blog", "set", *(f"V{i}={'x' * 100_000}" for i in range(5))],
     "keelway ops blog"),
]


@pytest.mark.parametrize(("how", "args", "where"), CASES,
                         ids=[f"{how}-{'-'.join(args[:2])}" for how, args, _ in CASES])
def test_a_command_whose_control_plane_dies_mid_request_says_where_it_stands(
        tmp_path: Path, how: str, args: list[str], where: str) -> None:
    home = tmp_path / "kh"
    with dying_control_plane(home, how) as seen:
        said = _keelway(home, *args)
    assert seen, "the request never reached the fake control plane"
    assert "Traceback" not in said.stderr + said.stdout, said.stderr
    assert said.returncode == EXIT_LOST, (said.returncode, said.stderr)
    assert "may or may not have completed" in said.stderr
    assert f"`{where}` says where it stands once the control plane is back" in said.stderr

    with dying_control_plane(home, how):
        as_json = _keelway(home, *args, "--json")
    assert "Traceback" not in as_json.stderr + as_json.stdout, as_json.stderr
    assert as_json.returncode == EXIT_LOST
    error = json.loads(as_json.stdout)["error"]
    assert error["code"] == "control-plane-lost" and where in error["hint"]


@pytest.mark.parametrize("how", ["close", "reset", "cut-body"])
def test_a_read_whose_control_plane_dies_says_it_changed_nothing(
        tmp_path: Path, how: str) -> None:
    home = tmp_path / "kh"
    for args in (["status"], ["ops", "blog"], ["seed", "status", HOST]):
        with dying_control_plane(home, how):
            said = _keelway(home, *args)
        assert "Traceback" not in said.stderr, said.stderr
        assert said.returncode == EXIT_LOST
        assert "it only read, so nothing was changed" in said.stderr


def _command(words: list[str]) -> list[click.Command]:
    """The commands along `words` from the top group: each group, then the command."""
    found: list[click.Command] = []
    group: click.Command = cli
    for word in words:
        assert isinstance(group, click.Group), words
        sub = group.commands.get(word)
        assert sub is not None, f"no command `keelway {' '.join(words)}`"
        found.append(sub)
        group = sub
    return found


def test_every_follow_up_after_a_lost_request_names_a_command_and_only_its_arguments() -> None:
    for words, template in AFTER_LOST.items():
        params = {p.name: "X" for cmd in _command(words.split()) for p in cmd.params
                  if p.name is not None}
        template.format(**params, on="")  # a KeyError names an argument it does not have
        for follow_up in template.split("` and `"):
            _command(follow_up.split()[1:2])  # the command it points to exists
