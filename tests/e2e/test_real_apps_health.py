"""Real apps through the real CLI and daemon, deployed on their first try with `deploy
--host` and no `[build] command` (SPEC §3): readiness means the health path answers
(gunicorn says READY=1 before its app is loaded), a web that never gets ready is refused
with what its probe saw, and an app's PATH is its build's and the system's, never
keelway's. The gunicorn apps install from the package index (tests/e2e/apps/)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from keelway.app_path import SYSTEM_PATH
from keelway.builds.cache import CACHE_ENV
from tests.e2e.harness import Keelway

pytestmark = pytest.mark.slow

APPS = Path(__file__).resolve().parent / "apps"


@pytest.fixture(autouse=True)
def _cache_env(deps_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(deps_cache))  # one install of gunicorn for the suite


def _fixture(name: str, tmp_path: Path) -> Path:
    app = tmp_path / name
    shutil.copytree(APPS / name, app, ignore=shutil.ignore_patterns("__pycache__"))
    return app


def _last_op(kw: Keelway, app: str) -> dict[str, Any]:
    ops: list[dict[str, Any]] = kw.ok("ops", app, "--json").json()["operations"]
    return ops[0]


def test_a_flask_app_under_gunicorn_is_ready_once_its_health_path_answers_not_at_ready_1(
    kw: Keelway, tmp_path: Path
) -> None:
    kw.up()
    # Its Procfile line starts with `GREETING="hello from flask" gunicorn …`, as a shell
    # runs it; its worker loads the app 1.5 s after gunicorn said READY=1.
    kw.ok("deploy", "flask", str(_fixture("flask_gunicorn", tmp_path)), "--host",
          "flask.test", timeout_s=120)
    status, body, _headers = kw.get("flask.test")
    assert (status, body) == (200, b"hello from flask at flask.test (v1)\n")
    ready = [s for s in _last_op(kw, "flask")["steps"] if s["name"] == "ready web"]
    assert [(s["state"], s["detail"]) for s in ready] == [
        ("succeeded", "GET /healthz answered 200")]
    # gunicorn's arbiter leads the generation (the shell exec'd it): status shows its pid.
    inst = kw.ok("status", "--json").json()["apps"][0]["instances"][0]
    (web,) = [p for p in inst["processes"] if p["service"] == "web" and p["active"]]
    cmdline = Path(f"/proc/{web['pid']}/cmdline").read_bytes().split(b"\0")
    assert any(part.endswith(b"gunicorn") for part in cmdline), cmdline


def test_a_gunicorn_app_whose_every_path_answers_500_is_refused_with_the_500_in_the_error(
    kw: Keelway, tmp_path: Path
) -> None:
    kw.up()
    result = kw.run("deploy", "broken", str(_fixture("gunicorn_500", tmp_path)), "--host",
                    "broken.test", timeout_s=120)
    said = ('web was not ready within 5s: GET / (Host: broken.test) answered 500: '
            '"RuntimeError: DATABASE_URL points at a database that is not there"')
    assert result.code == 1, result.out + result.err
    assert said in result.err
    op = _last_op(kw, "broken")
    assert op["state"] == "failed" and said in op["error"]
    events = kw.ok("events", "broken", "--json").json()["events"]
    assert any(said in e["message"] for e in events), events
    status, body, _ = kw.get("broken.test")  # never routed to its web
    assert status == 503 and b"not deployed yet" in body, body
    dump = kw.store_dump()
    assert dump["releases"] == [] and dump["active"] == [] and dump["port_claims"] == []


# Answers with what its environment says about PATH, and writes it at build time too.
PATHS_WEB = '''
import json, os, shutil
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({
            "PATH": os.environ["PATH"], "HOME": os.environ["HOME"],
            "python": shutil.which("python"), "keelway": shutil.which("keelway"),
            "build": open("build-path.txt").read().strip(),
        }).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
'''


def test_an_app_its_build_and_a_run_get_a_path_without_keelways_virtualenv(
    kw: Keelway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The daemon starts with keelway's own virtualenv first on its PATH, and a directory
    # only its own shell has: neither may reach an app.
    keelway_bin = Path(sys.executable).parent
    daemons_own = tmp_path / "daemons-own-bin"
    daemons_own.mkdir()
    monkeypatch.setenv("PATH", f"{keelway_bin}:{daemons_own}:{SYSTEM_PATH}")
    app = tmp_path / "paths"
    app.mkdir()
    (app / "web.py").write_text(PATHS_WEB)
    (app / "Procfile").write_text("web: python3 web.py\n")
    (app / "keelway.toml").write_text(
        '[build]\ncommand = "echo $PATH > build-path.txt"\n\n'
        '[services.web]\nsettle = "0.3s"\n')
    kw.up()
    kw.ok("deploy", "paths", str(app), "--host", "paths.test")
    status, body, _headers = kw.get("paths.test")
    assert status == 200, body
    seen = json.loads(body)
    builds = kw.home / "builds" / "paths"
    (build,) = builds.iterdir()
    assert seen["PATH"] == f"{build}/.venv/bin:{build}/node_modules/.bin:{SYSTEM_PATH}"
    assert seen["python"] is None or not seen["python"].startswith(str(keelway_bin))
    assert seen["keelway"] is None
    # The build step ran in its staging directory, with that directory's bins first.
    staged = seen["build"].split(":")
    assert staged[2:] == SYSTEM_PATH.split(":") and staged[0].endswith("/.venv/bin")
    assert seen["HOME"] == str(kw.home / "data" / "paths.test")
    ran = kw.run("run", "paths", "--", "printenv", "PATH")
    assert (ran.code, ran.out.strip()) == (0, seen["PATH"]), ran.err
