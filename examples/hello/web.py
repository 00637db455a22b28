"""hello's web service: counts visits in the instance's SQLite database."""

import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from store import connect

INSTANCE = os.environ.get("KEELWAY_INSTANCE", "?")
RELEASE = os.environ.get("KEELWAY_RELEASE", "?")
local = threading.local()


def db():
    if not hasattr(local, "conn"):
        local.conn = connect()
    return local.conn


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without TCP_NODELAY, Nagle and delayed ACKs
    # hold each response for ~40 ms.
    disable_nagle_algorithm = True

    def do_GET(self):
        if self.path == "/health":
            return self.reply(200, "text/plain", b"ok\n")
        if self.path == "/info":
            conn = db()
            beat = conn.execute("SELECT MAX(at), COUNT(*) FROM beats").fetchone()
            body = {
                "instance": INSTANCE, "release": RELEASE, "pid": os.getpid(),
                "generation": os.environ.get("KEELWAY_GENERATION"),
                "last_beat": beat[0], "beats": beat[1],
                "headers": {k.lower(): v for k, v in self.headers.items()},
            }
            return self.reply(200, "application/json", json.dumps(body).encode())
        conn = db()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO visits (n) VALUES (1)")
        count = conn.execute("SELECT COUNT(*) FROM visits").fetchone()[0]
        conn.execute("COMMIT")
        text = f"hello from {INSTANCE} ({RELEASE}); visit {count}\n"
        self.reply(200, "text/plain; charset=utf-8", text.encode())

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        self.reply(200, "application/octet-stream", body)

    def reply(self, status, content_type, body):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        sys.stdout.write(f"{self.address_string()} {fmt % args}\n")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # The default backlog of 5 drops connections when the router opens many at once.
    request_queue_size = 128


def main():
    server = Server(("127.0.0.1", int(os.environ["PORT"])), Handler)
    # SIGTERM: stop accepting, finish the request in hand, exit 0.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"web listening on 127.0.0.1:{os.environ['PORT']} for {INSTANCE}", flush=True)
    server.serve_forever(poll_interval=0.05)  # so a SIGTERM stops it promptly
    server.server_close()


if __name__ == "__main__":
    main()
