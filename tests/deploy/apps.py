"""Small apps for deploy tests, written into a temp dir: real processes, fast to boot."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.e2e.harness import EXAMPLE


def hello(root: Path, name: str, *, settle: str = "0.3s", greeting: str = "hello from",
          web_cmd: str | None = None, worker_cmd: str | None = None,
          release_cmd: str | None = None, web_mode: str | None = None,
          worker_mode: str | None = None) -> Path:
    """A copy of examples/hello with its settle window, commands and greeting changed."""
    app = root / name
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("__pycache__"))
    web = app / "web.py"
    web.write_text(web.read_text().replace("hello from", greeting))
    lines = [f"web: {web_cmd or 'python3 web.py'}",
             f"worker: {worker_cmd or 'python3 worker.py'}"]
    if release_cmd:
        lines.append(f"release: {release_cmd}")
    (app / "Procfile").write_text("\n".join(lines) + "\n")
    mode = f'mode = "{web_mode}"\n' if web_mode else ""
    worker = f'mode = "{worker_mode}"\n' if worker_mode else ""
    (app / "keelway.toml").write_text(
        f'[services.web]\nhealth = "/health"\nsettle = "{settle}"\nstop_grace = "2s"\n{mode}'
        f'[services.worker]\nsettle = "{settle}"\nstop_grace = "2s"\n{worker}')
    return app


# A web that answers health checks, then dies 0.5 s later: it fails its settle window.
DIES_AFTER_READY = (
    "python3 -c \"import os, threading, time, runpy; "
    "threading.Thread(target=lambda: (time.sleep(0.5), os._exit(7)), daemon=True).start(); "
    "runpy.run_path('web.py', run_name='__main__')\""
)
# A web that takes 2 s before it listens: a slow boot, to be superseded meanwhile.
SLOW_BOOT = "python3 -c \"import time, runpy; time.sleep(2); runpy.run_path('web.py', " \
            "run_name='__main__')\""


# Runs a script after daemonizing a child the classic way (fork, setsid, fork): the
# grandchild leaves its leader's session and is re-parented away from it, and lives on
# with the generation's environment (its marker, the instance key) until it is killed.
DAEMONIZE_PY = '''\
import os, runpy, sys, time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(3600)
    os._exit(0)
os.wait()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def daemonizing(root: Path, name: str, **kwargs: str) -> Path:
    """hello whose web leaves a setsid()ed grandchild behind, as a daemonizing app does."""
    app = hello(root, name, web_cmd="python3 daemonize.py web.py", **kwargs)
    (app / "daemonize.py").write_text(DAEMONIZE_PY)
    return app
