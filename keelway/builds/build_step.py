"""One build step: a child process run in the build directory, its output logged.

Owns: the environment a build step sees, and the lifetime of the processes a step
starts. Used by stage.py for venv creation, `pip install` and the [build] command.

Invariants:
- A step runs in its own session and process group. When its main process exits (or
  its time runs out, or the caller unwinds), the whole group is killed and the main
  process reaped before `run_step` returns, so no process a build started outlives it
  (a child that calls setsid() itself escapes; catching that needs cgroups, see §8).
- The group is killed only while its leader is unreaped (a zombie still holds the
  process group id), so a recycled pid can never be signalled.
- Every output byte goes to the build log; each line also goes to `progress`, prefixed
  with "| ", and the last TAIL_LINES lines go into a BuildCommandError.
- The environment is an allowlist, not the control plane's: a build must not see the
  control plane's secrets, nor its PATH (keelway.app_path: the build's bin directories,
  then the system's; keelway's own virtualenv would take pip's installs).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from keelway.app_path import app_path
from keelway.builds.errors import BuildCommandError
from keelway.identity import Identity
from keelway.limits import TENANT_OOM_SCORE

# Where a build says what it is doing, one line at a time (staging, installs, commands).
Progress = Callable[[str], None]

BUILD_TIMEOUT_S = 1800.0
TAIL_LINES = 20
_PASSED_ENV = frozenset(
    {
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "TZ",
        "TMPDIR",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
    }
)
_PASSED_PREFIXES = ("LC_", "PIP_")


def build_env(build_dir: Path, venv: Path | None, *, app: str, digest: str) -> dict[str, str]:
    """The environment of every build step of one build (see the module header)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key in _PASSED_ENV or key.startswith(_PASSED_PREFIXES)
    }
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = app_path(build_dir)
    env["KEELWAY_APP"] = app
    env["KEELWAY_BUILD_DIGEST"] = digest
    return env


def run_step(
    argv: list[str],
    *,
    what: str,
    cwd: Path,
    env: dict[str, str],
    log: BinaryIO,
    progress: Callable[[str], None],
    timeout_s: float,
    builder: Identity | None = None,
) -> None:
    """Run `argv` in `cwd`; return when it and its process group are gone. With a
    `builder`, as that uid with its group alone (keelway/identity.py), never as root.

    Raises BuildCommandError (with the output's last lines) if it exits non-zero, dies
    of a signal, or runs past `timeout_s`. An exception from `progress` kills the step
    and propagates.
    """
    log.write(f"$ {shlex.join(argv)}\n".encode())
    log.flush()
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    # A build is a tenant's code: it must not keep the control plane's low OOM score,
    # which it would inherit (keelway/limits.py). Raising one's own score takes no
    # privilege, so the shell does it as the builder, then execs the step.
    proc = subprocess.Popen(
        ["/bin/sh", "-c", f'echo {TENANT_OOM_SCORE} >/proc/self/oom_score_adj; exec "$@"',
         "build-step", *argv],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        user=None if builder is None else builder.uid,
        group=None if builder is None else builder.gid,
        extra_groups=None if builder is None else [],
    )
    guard = _GroupGuard(proc, timeout_s)
    try:
        output = proc.stdout
        if output is None:  # Popen(stdout=PIPE) always sets it; a broken contract
            raise RuntimeError("subprocess.Popen gave no stdout pipe")
        for raw in iter(output.readline, b""):
            log.write(raw)
            line = raw.decode(errors="replace").rstrip("\r\n")
            tail.append(line)
            progress(f"| {line}")
    except BaseException:
        guard.finish(kill=True)
        raise
    finally:
        log.flush()
    guard.finish(kill=False)
    if guard.timed_out:
        raise BuildCommandError(
            f"{what} did not finish within {timeout_s:g} s and was killed", list(tail)
        )
    if proc.returncode < 0:
        raise BuildCommandError(f"{what} was killed by signal {-proc.returncode}", list(tail))
    if proc.returncode != 0:
        raise BuildCommandError(f"{what} failed with exit code {proc.returncode}", list(tail))


class _GroupGuard:
    """Kills a step's process group on timeout or once its leader exits; reaps the leader.

    A watcher thread waits for the leader's exit without reaping it (WNOWAIT), then
    kills the group: leftovers holding the output pipe die, so the reader sees EOF.
    """

    def __init__(self, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        self._proc = proc
        self._lock = threading.Lock()
        self._reaped = False
        self.timed_out = False
        self._timer = threading.Timer(timeout_s, self._expire)
        self._timer.daemon = True
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._timer.start()
        self._watcher.start()

    def _kill_group(self) -> None:
        with self._lock:
            if self._reaped:
                return
            with contextlib.suppress(ProcessLookupError):  # the whole group is gone
                os.killpg(self._proc.pid, signal.SIGKILL)

    def _expire(self) -> None:
        self.timed_out = True
        self._kill_group()

    def _watch(self) -> None:
        try:
            os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            return  # already reaped by finish()
        self._kill_group()

    def finish(self, *, kill: bool) -> None:
        """Wait for the leader to exit (killing the group first if `kill`), reap it.

        After return the group has been killed and the leader reaped; the timer and the
        watcher are stopped. Without `kill` the step keeps its time limit while we wait.
        """
        if kill:
            self._kill_group()
        self._watcher.join()  # returns once the leader exited and the group was killed
        self._timer.cancel()
        with self._lock:
            self._proc.wait()
            self._reaped = True
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._watcher.join()
