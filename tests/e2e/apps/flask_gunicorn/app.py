"""A Flask app under gunicorn. gunicorn's arbiter sends READY=1 to $NOTIFY_SOCKET as soon
as it listens; its worker loads this module only after that, and this module takes a
while to load (as a real app's imports and settings do)."""

import os
import time

from flask import Flask

time.sleep(1.5)

app = Flask(__name__)


@app.get("/")
def index() -> str:
    env = os.environ
    return f"{env['GREETING']} at {env['KEELWAY_INSTANCE']} ({env['KEELWAY_RELEASE']})\n"


@app.get("/healthz")
def healthz() -> str:
    return "ok\n"
