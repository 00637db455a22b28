"""One build step: a child process run in the build directory, its output logged.

Owns: the environment a build step sees, and the lifetime of the processes a step
starts. Used by stage.py for venv creation, `pip install` and the [build] command.

Invariants:
- A step runs in its own session and process group. When its main process exits (or
  its time runs out, or the caller unwinds), the whole group is killed and the main
  process reaped before `run_step` returns, so no process a build started outlives it
  (a child that calls setsid() itself leaves the group: its step's cgroup, where the
  box has one, is emptied and removed before `run_step` returns; without one it escapes).
- The group is killed only while its leader is unreaped (a zombie still holds the
  process group id), so a recycled pid can never be signalled.
- Every output byte goes to the build log; each line also goes to `progress`, prefixed
  with "| ", and the last TAIL_LINES lines go into a BuildCommandError.
- The environment is an allowlist, not the control plane's: a build must not see the
  control plane's secrets, nor its PATH (keelway.app_path: the build's bin directories,
  then the system's; keelway's own virtualenv would take pip's installs).
- A step runs under its build's limits (`StepLimits`): the time left of the build's
  time limit and the disk its trees may grow to, both watched by the step's guard, and
  its memory by a cgroup of its own (`StepCell`, made by keelway/runtime/tree.py where
  the box has cgroups; this layer imports no runtime). The step waits at a gate (its
  stdin) until it is in that cgroup, so nothing of the build runs outside it. Past a
  limit the step fails with a BuildLimitError that names the limit.
- A step runs at a lower CPU and I/O priority than serving processes: nice 10 (set on
  it while it waits at the gate, inherited by everything it starts) and, where the box
  has `ionice`, the idle I/O class.
"""

from __future__ import annotations

import contextlib
import enum
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, assert_never

from keelway.app_path import app_path
from keelway.builds.errors import BuildCommandError, BuildLimitError, StagingError
from keelway.builds.tree import disk_usage
from keelway.identity import Identity
from keelway.limits import TENANT_OOM_SCORE, format_duration, format_size

# Where a build says what it is doing, one line at a time (staging, installs, commands).
Progress = Callable[[str], None]

TAIL_LINES = 20
BUILD_NICE = 10
# How often the guard measures the build's disk: every DISK_EVERY_S at most, and never
# more than 1/DISK_COST_RATIO of one core's time (a walk of a big node_modules takes
# tens of milliseconds, so a big tree is walked less often). Each step ends with one more
# walk, so no step that ends past the limit passes.
DISK_EVERY_S = 1.0
DISK_COST_RATIO = 50
IONICE = shutil.which("ionice")
# The step's first instructions, as the builder: wait at the gate (its stdin) until the
# parent has put it in its cgroup and lowered its priority (EOF instead: the parent
# could not, and nothing runs); take a tenant's OOM score rather than the control
# plane's low one, which it would inherit (raising one's own takes no privilege); idle
# I/O class where `$1` names ionice; then exec the step, stdin from /dev/null.
_STUB = ('read -r go || exit 125; exec </dev/null; '
         f'echo {TENANT_OOM_SCORE} >/proc/self/oom_score_adj; '
         '[ "$1" = - ] || "$1" -c 3 -p $$ 2>/dev/null; shift; exec "$@"')


class StepCell(Protocol):
    """The cgroup one build step runs in, with its memory limit: runtime.tree's
    BuildCell, handed down by whoever wires the builder (builds imports no runtime)."""

    def enter(self, pid: int) -> None:
        """Move the waiting step into the cgroup; OSError if it cannot be."""

    def kill(self) -> None:
        """SIGKILL every process of the step, those that left its process group too."""

    def cause(self) -> str | None:
        """Why the kernel killed (part of) the step, if it did ("killed: out of memory
        at its 2G limit")."""

    def close(self) -> bool:
        """Kill what is left of the step in the cgroup and remove it."""


# Makes the cgroup of one step, with a memory limit of that many bytes.
Confine = Callable[[int], StepCell]


@dataclass(frozen=True)
class StepLimits:
    """What every step of one build runs under (keelway/limits.py BuildLimits, resolved):
    `deadline` (time.monotonic()) by which the whole build must end, its `timeout_s` as
    the error says it; `disk` bytes that `watched` (the staged tree, the tools' scratch)
    may hold together; `memory` bytes per step, enforced only with `confine`."""

    deadline: float
    timeout_s: float
    memory: int | None = None
    disk: int | None = None
    watched: tuple[Path, ...] = ()
    confine: Confine | None = None


class Limit(enum.Enum):
    """Which limit ended a step, when one did; each value its key in `[build]`."""

    TIME = "timeout"
    DISK = "disk"
    MEMORY = "memory"


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
    limits: StepLimits,
    builder: Identity | None = None,
) -> None:
    """Run `argv` in `cwd` under `limits`; return when it and its process group (and its
    cgroup, with `limits.confine`) are gone. With a `builder`, as that uid with its group
    alone (keelway/identity.py), never as root.

    Raises BuildLimitError when the step passed one of `limits` (the build's time, its
    disk, its memory), BuildCommandError (with the output's last lines) if it exits
    non-zero or dies of a signal, StagingError if it could not be confined. An exception
    from `progress` kills the step and propagates.
    """
    if time.monotonic() >= limits.deadline:
        raise _over(Limit.TIME, limits, what, [])
    log.write(f"$ {shlex.join(argv)}\n".encode())
    log.flush()
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    cell = (limits.confine(limits.memory)
            if limits.confine is not None and limits.memory is not None else None)
    try:
        guard = _start(argv, cwd, env, builder, limits, cell)
        try:
            output = guard.proc.stdout
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
        code = guard.proc.returncode
        # The kernel's word only for a step that failed: a tool that lost a child to
        # the OOM killer and still succeeded (a retry, a fallback) built what it had to.
        cause = cell.cause() if cell is not None and code != 0 else None
        killed_by = guard.over or _memory(cause) or _disk_after(limits)
        pids_cause = cause if cause is not None and killed_by is None else None
    finally:
        if cell is not None:
            cell.close()
    if killed_by is not None:
        raise _over(killed_by, limits, what, list(tail))
    # A fork the step's cgroup refused fails the step its own way (an exit code, an
    # error of its own): the cgroup's record says why.
    why = f" ({pids_cause})" if pids_cause is not None else ""
    if code < 0:
        raise BuildCommandError(f"{what} was killed by signal {-code}{why}", list(tail))
    if code != 0:
        raise BuildCommandError(f"{what} failed with exit code {code}{why}", list(tail))


def _start(argv: list[str], cwd: Path, env: dict[str, str], builder: Identity | None,
           limits: StepLimits, cell: StepCell | None) -> _GroupGuard:
    """Start the step at its gate, confine it, lower its priority, open the gate."""
    gate, opener = os.pipe()  # both close-on-exec: the child gets `gate` as its stdin
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", _STUB, "build-step", IONICE or "-", *argv],
            cwd=cwd,
            env=env,
            stdin=gate,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            user=None if builder is None else builder.uid,
            group=None if builder is None else builder.gid,
            extra_groups=None if builder is None else [],
        )
    except BaseException:
        os.close(opener)
        raise
    finally:
        os.close(gate)
    guard = _GroupGuard(proc, limits, cell)
    try:
        try:
            if cell is not None:
                cell.enter(proc.pid)
            os.setpriority(os.PRIO_PROCESS, proc.pid, BUILD_NICE)
        except OSError as exc:
            raise StagingError(f"cannot confine a build step to its limits: {exc}") from exc
        os.write(opener, b"go\n")
    except BaseException:
        os.close(opener)  # the step reads EOF at its gate and exits, having run nothing
        guard.finish(kill=True)
        raise
    os.close(opener)
    return guard


def _memory(cause: str | None) -> Limit | None:
    return Limit.MEMORY if cause is not None and "out of memory" in cause else None


def _disk_after(limits: StepLimits) -> Limit | None:
    """The step's last look at the disk, once it has ended: between two of the guard's
    walks a step may have grown past the limit and exited."""
    if limits.disk is not None and disk_usage(limits.watched) > limits.disk:
        return Limit.DISK
    return None


def _over(limit: Limit, limits: StepLimits, what: str, tail: list[str]) -> BuildLimitError:
    match limit:
        case Limit.TIME:
            message = (f"build took longer than its {format_duration(limits.timeout_s)} "
                       f"limit ({what} was killed)")
        case Limit.DISK:
            message = (f"build grew past its {format_size(limits.disk or 0)} disk limit "
                       f"({what} was killed)")
        case Limit.MEMORY:
            message = (f"build killed: out of memory at its "
                       f"{format_size(limits.memory or 0)} limit (in {what})")
        case _:
            assert_never(limit)
    return BuildLimitError(message, tail, limit.value)


class _GroupGuard:
    """Kills a step's process group (and what is left in its cgroup) once its leader
    exits or it passes its build's time or disk limit (`over` says which); reaps the
    leader.

    A watcher thread waits for the leader's exit without reaping it (WNOWAIT), then
    kills the group: leftovers holding the output pipe die, so the reader sees EOF. A
    policing thread wakes at the deadline and at each disk walk.
    """

    def __init__(self, proc: subprocess.Popen[bytes], limits: StepLimits,
                 cell: StepCell | None) -> None:
        self.proc = proc
        self._limits = limits
        self._cell = cell
        self._lock = threading.Lock()
        self._reaped = False
        self._done = threading.Event()
        self.over: Limit | None = None
        self._police_thread = threading.Thread(target=self._police, daemon=True)
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._police_thread.start()
        self._watcher.start()

    def _kill_group(self) -> None:
        with self._lock:
            if not self._reaped:
                with contextlib.suppress(ProcessLookupError):  # the whole group is gone
                    os.killpg(self.proc.pid, signal.SIGKILL)
        if self._cell is not None:
            # What left the group (setsid) and may hold the output pipe: without this
            # the reader would wait for it, past every limit.
            self._cell.kill()

    def _passed(self, limit: Limit) -> None:
        self.over = limit
        self._kill_group()

    def _police(self) -> None:
        limits = self._limits
        next_walk = time.monotonic() + DISK_EVERY_S
        while True:
            now = time.monotonic()
            wake = limits.deadline if limits.disk is None else min(limits.deadline,
                                                                     next_walk)
            if self._done.wait(max(0.0, wake - now)):
                return
            now = time.monotonic()
            if now >= limits.deadline:
                self._passed(Limit.TIME)
                return
            if limits.disk is not None and now >= next_walk:
                used = disk_usage(limits.watched)
                cost_s = time.monotonic() - now
                if used > limits.disk:
                    self._passed(Limit.DISK)
                    return
                next_walk = time.monotonic() + max(DISK_EVERY_S, cost_s * DISK_COST_RATIO)

    def _watch(self) -> None:
        try:
            os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            return  # already reaped by finish()
        self._kill_group()

    def finish(self, *, kill: bool) -> None:
        """Wait for the leader to exit (killing the group first if `kill`), reap it.

        After return the group has been killed and the leader reaped; the policing and
        watching threads are stopped. Without `kill` the step keeps its limits while
        we wait.
        """
        if kill:
            self._kill_group()
        self._watcher.join()  # returns once the leader exited and the group was killed
        self._done.set()
        self._police_thread.join()
        with self._lock:
            self.proc.wait()
            self._reaped = True
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._watcher.join()
