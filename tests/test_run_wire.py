"""The wire protocol of `keelway run`, as transcripts: messages both ways, framing, the
refusal of anything that is not exactly a message, and the lent descriptors arriving
over a real unix socket pair."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from keelway import run_wire
from keelway.api.run_server import _recv_fds
from keelway.run_wire import (
    Exited,
    Forward,
    Lines,
    Refused,
    RunRequest,
    Started,
    WireError,
    decode,
    encode,
    exit_code,
)

EVERY_MESSAGE = [
    RunRequest("blog", None, ("python3", "manage.py", "migrate"), False),
    RunRequest("blog", "acme.blog.test", ("sh",), True, "xterm-256color"),
    Forward("SIGINT"),
    Started(4242, "blog.test", 3),
    Refused("not-found", "no app named blog", "see `keelway apps`"),
    Refused("bad-request", "blog.test is fenced", None),
    Exited(0),
    Exited(130),
]


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_every_message_reads_back_as_itself_from_one_line(message: run_wire.Message) -> None:
    line = encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode(line) == message


def test_a_conversation_split_anywhere_frames_into_the_same_messages() -> None:
    stream = b"".join(encode(m) for m in EVERY_MESSAGE)
    for cut in (1, 7, 64):
        lines = Lines()
        got = [m for i in range(0, len(stream), cut) for m in lines.feed(stream[i:i + cut])]
        assert got == EVERY_MESSAGE


@pytest.mark.parametrize("line", [
    b"not json",
    b"[1, 2]",
    b'{"type": "shell", "cmd": "rm -rf /"}',
    b'{"signal": "SIGINT"}',
    b'{"type": "signal", "signal": "SIGKILL"}',  # only what a terminal sends is forwarded
    b'{"type": "signal", "signal": "SIGINT", "extra": 1}',
    b'{"type": "run", "app": "blog", "instance": null, "argv": [], "tty": false,'
    b' "term": null}',
    b'{"type": "run", "app": "blog", "instance": null, "argv": [""], "tty": false,'
    b' "term": null}',
    b'{"type": "run", "app": "blog", "instance": null, "argv": ["a\\u0000b"], "tty": false,'
    b' "term": null}',
    b'{"type": "run", "app": "blog", "instance": null, "argv": ["ls"], "tty": "yes",'
    b' "term": null}',
    b'{"type": "run", "app": 7, "instance": null, "argv": ["ls"], "tty": false, "term": null}',
    b'{"type": "started", "pid": true, "instance": "a.test", "release": 1}',
    b'{"type": "exited", "code": "0"}',
    b'\xff\xfe',
])
def test_a_line_that_is_not_exactly_one_message_is_refused(line: bytes) -> None:
    with pytest.raises(WireError):
        decode(line)


def test_a_line_longer_than_the_bound_is_refused_before_its_newline() -> None:
    lines = Lines()
    with pytest.raises(WireError):
        list(lines.feed(b"x" * (run_wire.MAX_LINE_BYTES + 1)))


def test_a_signal_ending_the_child_exits_as_a_shell_reports_it() -> None:
    assert [exit_code(c) for c in (0, 3, -2, -9, -15)] == [0, 3, 130, 137, 143]
    assert Forward("SIGWINCH").signum.name == "SIGWINCH"


def test_the_lent_descriptors_arrive_with_the_request_and_still_work(tmp_path: Path) -> None:
    # A transcript over a real socket pair: the CLI's side sends as keelway/cli/run.py
    # does, the daemon's side reads as keelway/api/run_server.py does.
    cli_side, daemon_side = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    daemon_side.setblocking(False)
    read_end, write_end = os.pipe()
    out = tmp_path / "out"
    request = RunRequest("blog", None, ("true",), False)
    with cli_side, daemon_side, open(out, "wb") as stdout:
        socket.send_fds(cli_side, [encode(request)],
                        [read_end, stdout.fileno(), stdout.fileno()])
        data, fds = asyncio.run(_recv_fds(daemon_side))
        try:
            assert [decode(line) for line in data.splitlines()] == [request]
            assert len(fds) == run_wire.STDIO_FDS
            os.write(write_end, b"in")
            assert os.read(fds[0], 2) == b"in"  # the same pipe, not a copy of its data
            os.write(fds[1], b"out")
        finally:
            for fd in (*fds, read_end, write_end):
                os.close(fd)
    assert out.read_bytes() == b"out"
