"""Readiness of a web (SPEC §3): its health path answers non-5xx, asked with its
instance's Host; READY=1 on its notify socket only makes the probe go out at once. A
web that never gets ready fails with what the probe last saw. Real processes on
loopback, a real store; the deadline is a real second or two."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

from keelway.app_path import SYSTEM_PATH
from keelway.clock import SystemClock
from keelway.home import Home
from keelway.runtime.health import Answered, NotListening, describe, listening_on
from keelway.runtime.notify import NotifyListener
from keelway.runtime.ports import pick_free_port
from keelway.runtime.supervisor import Readiness, ReadyOutcome, Supervisor
from keelway.store import Store
from keelway.store.records import Generation

HOST = "one.test"

# A web that says READY=1 as soon as it listens (as gunicorn's arbiter does), then
# answers every request with a 500 and the start of an error page.
READY_THEN_500 = '''
import os, socket
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"ImproperlyConfigured: SECRET_KEY is not set\\n" + b"x" * 4000
        self.send_response(500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

server = HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler)
note = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
note.sendto(b"READY=1", os.environ["NOTIFY_SOCKET"])
server.serve_forever()
'''

# A web that serves its own instance's Host and refuses (5xx) any other, as an app with
# a list of allowed hosts behind a strict proxy does.
SERVES_ITS_HOST = '''
import os
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.headers["Host"] == os.environ["KEELWAY_INSTANCE"]
        self.send_response(200 if ok else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
'''

# A web that listens on a port of its own, not $PORT.
FIXED_PORT = '''
import os, socket, time
sock = socket.socket()
sock.bind(("127.0.0.1", int(os.environ["FIXED_PORT"])))
sock.listen()
time.sleep(60)
'''


async def _no_restart(_gen: Generation, _code: int | None) -> None:
    return None


def _ready(store: Store, home: Home, tmp_path: Path, code: str, timeout_s: float,
           extra_env: dict[str, str] | None = None) -> tuple[Readiness, int]:
    """Spawn `code` as a web of HOST, wait for it to be ready, stop it."""
    (tmp_path / "app.py").write_text(textwrap.dedent(code))

    async def scenario() -> tuple[Readiness, int]:
        supervisor = Supervisor(store, home, SystemClock(), _no_restart)
        port = pick_free_port(store.local.port_claimed)
        gen = store.plan_generation(app="hello", instance=HOST, service="web",
                                                release=1,
                                                build_digest="d" * 64, op_id=None, port=port)
        notify = NotifyListener(home.notify_socket(gen.id))
        notify.open()
        env = {"PATH": SYSTEM_PATH, "PORT": str(port), "KEELWAY_INSTANCE": HOST,
               "NOTIFY_SOCKET": str(notify.path), **(extra_env or {})}
        try:
            gen = await supervisor.spawn(gen, "python3 app.py", tmp_path, env)
            readiness = await asyncio.wait_for(
                supervisor.wait_ready(gen, "/health", timeout_s, notify.ready, host=HOST),
                timeout=timeout_s + 10)
        finally:
            notify.close()
            assert await supervisor.stop(store.generations.get_generation(gen.id) or gen,
                                         grace_s=1.0)
            await supervisor.shutdown()
        return readiness, port

    return asyncio.run(scenario())


def test_ready_1_does_not_make_a_web_ready_while_its_health_path_answers_500(
    store: Store, home: Home, tmp_path: Path
) -> None:
    readiness, _port = _ready(store, home, tmp_path, READY_THEN_500, timeout_s=1.0)
    assert readiness.outcome is ReadyOutcome.TIMED_OUT
    assert readiness.said.startswith(f"GET /health (Host: {HOST}) answered 500: "
                                     '"ImproperlyConfigured: SECRET_KEY is not set xxx')
    assert len(readiness.said) < 300  # the first bytes of the body, not the page


def test_the_health_probe_asks_with_the_instance_host(
    store: Store, home: Home, tmp_path: Path
) -> None:
    readiness, _port = _ready(store, home, tmp_path, SERVES_ITS_HOST, timeout_s=5.0)
    assert readiness == Readiness(ReadyOutcome.READY, "GET /health answered 200")


def test_a_web_listening_on_another_port_than_port_fails_saying_where_it_listens(
    store: Store, home: Home, tmp_path: Path
) -> None:
    fixed = pick_free_port(lambda _port: False)
    readiness, port = _ready(store, home, tmp_path, FIXED_PORT, timeout_s=1.0,
                             extra_env={"FIXED_PORT": str(fixed)})
    assert readiness == Readiness(
        ReadyOutcome.TIMED_OUT,
        f"it is listening on 127.0.0.1:{fixed}, not $PORT (127.0.0.1:{port})")


def test_a_web_that_listens_nowhere_fails_saying_the_connection_was_refused(
    store: Store, home: Home, tmp_path: Path
) -> None:
    readiness, port = _ready(store, home, tmp_path, "import time; time.sleep(60)\n",
                             timeout_s=0.5)
    assert readiness == Readiness(
        ReadyOutcome.TIMED_OUT,
        f"connection to 127.0.0.1:{port} ($PORT) refused: nothing listens there")


def test_a_web_that_exits_before_it_is_ready_says_its_exit_code(
    store: Store, home: Home, tmp_path: Path
) -> None:
    readiness, _port = _ready(store, home, tmp_path, "raise SystemExit(3)\n", timeout_s=5.0)
    assert readiness == Readiness(ReadyOutcome.EXITED,
                                  "exited before it was ready (exit code 3)")


def test_listening_ports_are_read_for_ipv4_and_ipv6_sockets_of_the_given_processes(
    tmp_path: Path
) -> None:
    # A /proc of one process holding two listening sockets and a connected one.
    proc = tmp_path / "proc"
    (proc / "7" / "fd").mkdir(parents=True)
    for fd, inode in (("3", "111"), ("4", "222"), ("5", "333"), ("6", "pipe:[9]")):
        target = f"socket:[{inode}]" if inode.isdigit() else inode
        (proc / "7" / "fd" / fd).symlink_to(target)
    (proc / "net").mkdir()
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"  # noqa: E501
    (proc / "net" / "tcp").write_text(
        head
        + "   0: 0100007F:1388 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 111 1\n"
        + "   1: 0100007F:1389 0100007F:D431 01 00000000:00000000 00:00000000 00000000 0 0 333 1\n"
        + "   2: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 999 1\n")
    (proc / "net" / "tcp6").write_text(
        head
        + "   0: 00000000000000000000000001000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 222 1\n")  # noqa: E501
    assert listening_on([7], proc=proc) == [("127.0.0.1", 5000), ("[::1]", 8000)]


def test_what_the_probe_saw_is_said_for_each_kind_of_answer() -> None:
    where = {"port": 4000, "path": "/up", "host": HOST}
    assert describe(Answered(502), listening=[], **where) == f"GET /up (Host: {HOST}) answered 502"
    assert describe(Answered(500, b"boom\n\x00  again"), listening=[], **where) == (
        f'GET /up (Host: {HOST}) answered 500: "boom again"')
    assert describe(NotListening(), listening=[("0.0.0.0", 5000)], **where) == (
        "it is listening on 0.0.0.0:5000, not $PORT (127.0.0.1:4000)")
