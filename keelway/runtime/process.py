"""The process verbs: spawn, reap, stop, kill, and proof of death, for one session.

`spawn` is the one way keelway starts a process that outlives the control plane: a
generation (runtime.supervisor) and the router (runtime.router) both start here. (Two
starts sit outside it on purpose: `keelway up` starting the daemon, in the CLI, which
imports no layer; and the router's own workers, in the router, which imports no layer
either. Build steps are children we wait on, not detached.)

Every process keelway starts leads its own session (start_new_session), so its session
id is its pid and every process it forks stays findable by that id, unless it calls
setsid() itself: a generation's whole tree, detached descendants included, is
runtime.tree's business (the router, one session, is stopped here). A process is
*gone* only when proven by reaping or by /proc: pid and start time together, because a
pid alone may have been reused.

Signals go only to processes whose session id is the generation's pid and whose start
time is not before the leader's, so keelway never signals a process it did not start.

A process keelway starts holds exactly stdin, stdout, stderr and the descriptors it is
given (`pass_fds`), nothing else of the control plane's: not the router's listening
socket, the store, the API or control sockets, nor another child's stdio. uvloop's
spawning ignores `close_fds` and passes on whatever is inheritable at the fork (the
descriptors it dups for a child's stdio are, for the moment of that spawn; one received
over a unix socket without MSG_CMSG_CLOEXEC is, for good). So the child itself marks every
other descriptor close-on-exec between the fork and the exec (`exec_only`), whatever the
parent's flags say; every spawn of a child we do not wait on in the foreground goes
through `exec_only`.

How the child is made. Forking a control plane that holds a thousand instances costs
the event loop some 13 ms a spawn (page tables copied, then every page the loop writes
afterwards faults once), and a cohort of 200 spawns held every request for seconds. So a
spawn is, where the box allows it, a vfork-style start (CPython's subprocess, which
vforks when it runs no Python in the child), some 0.2 ms whatever the control plane's
size, made in a thread of its own so the loop does not wait even for that. The child's
setup (join the cgroups, take the identity) then cannot run as Python between fork and
exec; it runs as a short /bin/sh stub (`_STUB`) that joins the cgroups while still root
and execs `setpriv` to take the uid and group, which execs the command: two execs, some
2 ms, in the child, off the loop. `close_fds` holds for this start (the child closes
every descriptor but stdio and `pass_fds` with close_range before it execs). The exit is
read from a pidfd on the loop (`Child`). Where there is no pidfd (Linux older than 5.3)
or no setpriv, a spawn forks through the loop as before, with the
setup in Python (`_child_setup`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import os
import resource
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from keelway.clock import Clock
from keelway.identity import Identity, become
from keelway.runtime import logs

# close_range(2) with CLOSE_RANGE_CLOEXEC (Linux 5.11): every descriptor from 3 up marked
# close-on-exec in one system call. The child of a control plane that holds a thousand
# instances' descriptors otherwise walks /proc/self/fd in Python, one call per
# descriptor, while the loop that forked it waits for the exec: measured 12.5 ms a spawn
# at 2,000 descriptors, 5.9 ms with this. Its arguments are made here, in the parent:
# the forked child only calls. The number is the same on every architecture.
_SYS_CLOSE_RANGE = ctypes.c_long(436)
_CLOSE_RANGE_CLOEXEC = ctypes.c_uint(4)
_FROM_3 = ctypes.c_uint(3)
_TO_LAST = ctypes.c_uint(0xFFFFFFFF)
_syscall: Callable[..., int] | None
try:
    _syscall = ctypes.CDLL(None, use_errno=True).syscall
except (OSError, AttributeError):  # no C library to call into: the walk below
    _syscall = None


def _mark_all_cloexec() -> bool:
    """Every descriptor above stderr marked close-on-exec by close_range(2); False where
    the kernel has no such call (older than 5.11), so the caller walks them instead."""
    return _syscall is not None and _syscall(_SYS_CLOSE_RANGE, _FROM_3, _TO_LAST,
                                             _CLOSE_RANGE_CLOEXEC) == 0


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    pgrp: int
    session: int
    start_ticks: int


def read_stat(pid: int) -> ProcStat | None:
    """Parse /proc/PID/stat; None when the pid does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name sits in parentheses and may itself contain spaces or ')'.
    close = raw.rfind(b")")
    fields = raw[close + 2 :].split()
    return ProcStat(
        pid=pid,
        state=fields[0].decode(),
        pgrp=int(fields[2]),
        session=int(fields[3]),
        start_ticks=int(fields[19]),
    )


def is_alive(pid: int, start_ticks: int) -> bool:
    """True when the process that had this pid and start time is still running.

    A zombie counts as dead: it will never run again, and only its parent can reap it.
    """
    stat = read_stat(pid)
    return stat is not None and stat.start_ticks == start_ticks and stat.state != "Z"


def session_members(session: int, not_before_ticks: int) -> list[ProcStat]:
    """Live processes of a session that started no earlier than its leader did."""
    members: list[ProcStat] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = read_stat(int(entry.name))
        if (
            stat is not None
            and stat.session == session
            and stat.start_ticks >= not_before_ticks
            and stat.state != "Z"
        ):
            members.append(stat)
    return members


def signal_session(session: int, start_ticks: int, sig: signal.Signals) -> int:
    """Send `sig` to every live process of the generation's session; returns how many."""
    sent = 0
    for member in session_members(session, start_ticks):
        try:
            os.kill(member.pid, sig)
            sent += 1
        except ProcessLookupError:
            pass
    return sent


@dataclass(frozen=True)
class Bounds:
    """What a tenant's child takes on before it execs, beside its cgroups: the kernel's
    per-process limits (`nofile`; `nproc`, per uid, where no pids controller bounds the
    tree: runtime.limits decides) and its OOM score, so that under memory pressure the
    kernel picks an app before the router or the control plane."""

    nofile: int | None = None
    nproc: int | None = None
    oom_score_adj: int | None = None


NO_BOUNDS = Bounds()


def exec_only(pass_fds: tuple[int, ...] = ()) -> Callable[[], None]:
    """The child's setup between fork and exec for a command of keelway's own (no cgroup
    to join, no identity to take): only `pass_fds` survive the exec (`_child_setup`)."""
    return _child_setup(pass_fds, (), None, 2)


def _child_setup(pass_fds: tuple[int, ...], join: tuple[str, ...],
                 identity: Identity | None, report_fd: int,
                 bounds: Bounds = NO_BOUNDS) -> Callable[[], None]:
    """What the child does between fork and exec, in this order:
    1. join the generation's cgroups (`join`: their `cgroup.procs` files), still as root,
       so every process it will fork is a member from its first instruction;
    2. take `bounds` (its rlimits and OOM score), still as root, so it cannot raise them;
    3. become `identity` (keelway.identity.become), when given;
    4. mark every descriptor above stderr close-on-exec except `pass_fds`. Marked rather
       than closed: the spawning library dup2()s the child's stdio into 0-2 after this
       runs, from descriptors above 2.
    A step that fails writes why to `report_fd` (the log the child would have written)
    and exits 125 before the app runs: an untracked tree could outlive its stop, and a
    tenant must never run as root because its uid could not be taken.

    It runs in a forked copy of a threaded process, so it calls only into C (no import,
    no lock, no logging)."""
    keep = frozenset(pass_fds)

    def refuse(why: bytes) -> None:
        os.write(report_fd, b"keelway: " + why + b"\n")
        os._exit(125)

    def setup() -> None:
        for procs in join:
            try:
                fd = os.open(procs, os.O_WRONLY)
                try:
                    os.write(fd, b"0")  # 0: the writer itself
                finally:
                    os.close(fd)
            except OSError:
                refuse(b"cannot join the cgroup " + procs.encode())
        try:
            if bounds.oom_score_adj is not None:
                fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
                try:
                    os.write(fd, b"%d" % bounds.oom_score_adj)
                finally:
                    os.close(fd)
            if bounds.nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (bounds.nofile, bounds.nofile))
            if bounds.nproc is not None:
                resource.setrlimit(resource.RLIMIT_NPROC, (bounds.nproc, bounds.nproc))
        except (OSError, ValueError):
            refuse(b"cannot take its limits")
        if identity is not None:
            try:
                become(identity)
            except OSError:
                refuse(b"cannot become uid %d" % identity.uid)
        if _mark_all_cloexec():
            for fd in keep:
                os.set_inheritable(fd, True)
            return
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd > 2:
                try:  # noqa: SIM105 - no Python-level context manager in the forked child
                    os.set_inheritable(fd, fd in keep)
                except OSError:
                    pass  # the directory listdir read, closed by now
    return setup


class Reapable(Protocol):
    """A child of ours whose exit the loop reads: asyncio's Process, or `Child`."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


@dataclass
class Spawned:
    pid: int
    start_ticks: int
    proc: Reapable


# The child's setup as a shell stub, for a vfork-style start, in `_child_setup`'s order:
# `$1 $2 $3` are its OOM score, open-files and process rlimits (`-`: none), then the
# `cgroup.procs` files it joins up to `--` (writing 0 moves the writer, which then
# execs: the command's pid), all still as root; then it execs the rest, `setpriv` first
# when the command runs as an instance's identity. A step that fails says so where the
# child's output goes and exits 125 before the command runs; setpriv fails rather than
# exec as root when it cannot take the uid.
_STUB = ('fail() { echo "keelway: $1" >&2; exit 125; }; '
         '[ "$1" = - ] || echo "$1" >/proc/self/oom_score_adj || fail "cannot take its limits"; '
         '[ "$2" = - ] || ulimit -n "$2" || fail "cannot take its limits"; '
         # bash says processes -u, dash -p (bash's -p is the pipe size, read-only)
         '[ "$3" = - ] || { ulimit -u "$3" 2>/dev/null || ulimit -p "$3"; } '
         '|| fail "cannot take its limits"; shift 3; '
         'while [ "$1" != -- ]; do echo 0 >"$1" || fail "cannot join the cgroup $1"; shift; '
         'done; shift; exec "$@"')
_SH = "/bin/sh"
_setpriv: str | None = shutil.which("setpriv")
# False where the kernel has no pidfd_open(2) to watch a vfork-started child by: every
# spawn then forks through the loop.
_vfork_start = hasattr(os, "pidfd_open") and os.path.exists(_SH)


class Child:
    """A child started by `_start` (not through the loop): its exit read from a pidfd,
    which becomes readable when the child exits; then it is reaped here, by pid (ours,
    and not yet reaped, so the pid cannot have been reused)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.pid = popen.pid
        self._popen = popen  # held until reaped, so subprocess never reaps it itself
        self.returncode: int | None = None
        loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = loop.create_future()
        self._pidfd = os.pidfd_open(self.pid)  # close-on-exec, as pidfd_open makes it
        loop.add_reader(self._pidfd, self._reap)

    def _reap(self) -> None:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else: its status is lost
            pid, status = self.pid, 255 << 8
        if pid == 0:
            return  # not exited yet
        asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        self.returncode = os.waitstatus_to_exitcode(status)
        self._popen.returncode = self.returncode
        self._exited.set_result(self.returncode)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


# The threads starts run in: their own, so that a cohort's starts never queue ahead of
# a read that runs apart from the loop (the store's `read_apart` uses the default ones).
_starters: concurrent.futures.ThreadPoolExecutor | None = None


async def _start(argv: list[str], *, cwd: Path | None, env: Mapping[str, str] | None,
                 stdin: int, stdout: int, stderr: int, pass_fds: tuple[int, ...],
                 join: tuple[str, ...], identity: Identity | None, bounds: Bounds) -> Child:
    """The vfork-style start (the module's docstring): the stub joins `join`, then
    execs `argv`, through setpriv when it runs as `identity`. The start runs in a
    thread: the vforking thread waits for the child's exec, which on a box busy with
    hundreds of booting apps waits for a CPU, and the loop must not wait with it."""
    global _starters
    command = argv
    if identity is not None:
        assert _setpriv is not None
        command = [_setpriv, f"--reuid={identity.uid}", f"--regid={identity.gid}",
                   f"--groups={identity.gid}", "--", *argv]
    if _starters is None:
        _starters = concurrent.futures.ThreadPoolExecutor(2, "keelway-start")
    said = [str(v) if v is not None else "-"
            for v in (bounds.oom_score_adj, bounds.nofile, bounds.nproc)]
    full = [_SH, "-c", _STUB, "keelway", *said, *join, "--", *command]

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(full, cwd=cwd, env=dict(env) if env is not None else None,
                                stdin=stdin, stdout=stdout, stderr=stderr,
                                start_new_session=True, close_fds=True, pass_fds=pass_fds)

    started = asyncio.get_running_loop().run_in_executor(_starters, start)
    cancelled = False
    while True:
        # A cancel waits for the start to end: the caller closes the descriptors the
        # thread is handing to the child, and the child, once there, must be watched
        # (reaped when it exits; its tree, unrecorded, is a stray the reconciler removes).
        try:
            popen = await asyncio.shield(started)
            break
        except asyncio.CancelledError:
            cancelled = True
    child = Child(popen)
    if cancelled:
        raise asyncio.CancelledError
    return child


async def spawn(
    argv: list[str], *, log_path: Path, cwd: Path | None = None,
    env: Mapping[str, str] | None = None, pass_fds: tuple[int, ...] = (),
    stdio: tuple[int, int, int] | None = None, join: tuple[str, ...] = (),
    identity: Identity | None = None, bounds: Bounds = NO_BOUNDS,
) -> Spawned:
    """Start `argv` as the leader of a new session, output appended to `log_path`: the
    one way keelway starts a process that outlives it (generations, the router). `env`
    None inherits ours; `pass_fds` stay open in the child (the router's listening
    socket), every other descriptor of ours is closed in it. `stdio` (stdin, stdout,
    stderr) replaces /dev/null and the log: a one-off run's lent terminal; the caller
    keeps and closes its copies. `join` are the cgroups' `cgroup.procs` files the child
    joins before it execs; `bounds` its rlimits and OOM score; `identity` the uid and
    group it runs as (`_child_setup`).

    Output goes straight to a file, not through a pipe to us, so the process keeps
    running and logging while the control plane is down. The loop reaps the child when
    it exits (`Spawned.proc.wait()`): nothing ever waits on it in the foreground, and
    the start does not hold the loop (the module's docstring).
    """
    log_fd = logs.open_for_append(log_path) if stdio is None else None
    stdin, stdout, stderr = stdio if stdio is not None else (
        asyncio.subprocess.DEVNULL, log_fd, log_fd)
    assert stdout is not None and stderr is not None
    proc: Reapable
    try:
        if _vfork_start and (identity is None or _setpriv is not None):
            proc = await _start(argv, cwd=cwd, env=env, stdin=stdin, stdout=stdout,
                                stderr=stderr, pass_fds=pass_fds, join=join,
                                identity=identity, bounds=bounds)
        else:
            proc = await _fork(argv, cwd=cwd, env=env, stdin=stdin, stdout=stdout,
                               stderr=stderr, pass_fds=pass_fds, join=join,
                               identity=identity, bounds=bounds)
    finally:
        if log_fd is not None:
            os.close(log_fd)
    stat = read_stat(proc.pid)
    # A process that exited before we looked is a zombie we still own: its start time is
    # readable until we reap it, so stat is None only if the kernel lost it, a bug.
    ticks = stat.start_ticks if stat is not None else 0
    return Spawned(proc.pid, ticks, proc)


async def _fork(argv: list[str], *, cwd: Path | None, env: Mapping[str, str] | None,
                stdin: int, stdout: int, stderr: int, pass_fds: tuple[int, ...],
                join: tuple[str, ...], identity: Identity | None,
                bounds: Bounds) -> asyncio.subprocess.Process:
    """The start through the loop's fork, with the setup in Python (`_child_setup`):
    where the box has no pidfd or no setpriv."""
    return await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=dict(env) if env is not None else None, stdin=stdin,
        stdout=stdout, stderr=stderr, start_new_session=True, pass_fds=pass_fds,
        preexec_fn=_child_setup(pass_fds, join, identity, stderr, bounds))


async def wait_gone(
    pid: int, start_ticks: int, clock: Clock, timeout_s: float,
    proc: Reapable | None = None, poll_s: float = 0.02,
) -> bool:
    """Wait until the whole session is gone; True when proven, False on timeout."""
    deadline = clock.monotonic() + timeout_s
    while True:
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(proc.wait()), timeout=poll_s)
        leader_gone = (proc.returncode is not None) if proc is not None else not is_alive(
            pid, start_ticks
        )
        if leader_gone and not session_members(pid, start_ticks):
            return True
        if clock.monotonic() >= deadline:
            return False
        if proc is None or proc.returncode is not None:
            await clock.sleep(poll_s)


async def stop(
    pid: int, start_ticks: int, *, grace_s: float, clock: Clock,
    proc: Reapable | None = None,
) -> bool:
    """SIGTERM the session, SIGKILL what is left after `grace_s`; True once proven gone.

    False means something survived SIGKILL for 5 s (uninterruptible sleep): the caller
    must keep its record and report the leftover, never assume it dead.
    """
    if signal_session(pid, start_ticks, signal.SIGTERM) == 0 and proc is None:
        return True
    if await wait_gone(pid, start_ticks, clock, grace_s, proc):
        return True
    signal_session(pid, start_ticks, signal.SIGKILL)
    return await wait_gone(pid, start_ticks, clock, 5.0, proc)
