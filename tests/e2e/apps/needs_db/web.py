"""A web that refuses to start without its database, as several real apps do: it opens
KEELWAY_DB read-write without creating it (SQLite's `mode=rw`)."""

import os
import sqlite3
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

path = os.environ["KEELWAY_DB"]
try:
    conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, isolation_level=None)
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
except sqlite3.OperationalError as exc:
    sys.exit(f"cannot open the database {path}: {exc}")


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{os.environ['KEELWAY_INSTANCE']} has its database ({mode})\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
