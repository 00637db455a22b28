"""Durable file writes: temp -> fsync -> rename -> fsync directory; private modes; a full disk.

A file written here is either the old content or the new content after a crash at any
instruction, never a torn mix. Temp files carry the prefix `.tmp-` so that a sweep at
open (`sweep_temp`) can remove what a crash left behind.

A temp file is named for its writer (`temp_path`: pid and start time), and a sweep removes
only those whose writer is dead (`temp_orphaned`). Two processes share some directories (the
control plane writes the router's pid file into `router/`, where the router saves its
table), so a sweep at one's start must never take the file the other is between creating
and renaming: that window failed `up` on a busy box. A temp file of a live writer is left
for a later sweep; one whose name carries no writer (made by `tempfile`) belongs to
sweeps that run under the home lock before anything is started.

Modes: every file keelway writes is created with its final mode, owner-only (0600)
unless a caller says otherwise, so a secret is never readable by others even for an
instant; chmod after creation would leave a window.

Commits to the store. A commit of the store survives a crash of keelway (the process,
at any instruction) as soon as it returns, whatever the store's `synchronous` setting:
its WAL frames are in the kernel's page cache. Surviving power loss or a kernel crash
takes an fsync, which under load cost the control plane's loop about a millisecond a
commit: a third of a thousand-instance rollout's time went to some 25 fsyncs an
attempt. So a commit waits for the fsync of the next durable one where losing it to
power loss loses nothing a reboot does not lose anyway (`sync_deferred`): inside an
operation whose effects end with the box (a process started, stopped, parked; a route
published), its writes, bar the steps whose effects outlive a reboot. Such an
operation is made durable before its caller is told it ended (`Store.sync`: the WAL
fsynced in a worker thread, one fsync for every operation ending at once). Durable
commits, always: every step whose effect outlives a reboot (a release command, a
one-off run, anything of the data plane: journal.StepKind.ends_with_the_box), and every
write outside such an operation. The fsync of the WAL covers every commit before it, so
nothing is ever kept without what came before it. After power loss the store is consistent, and an
operation cut short is converged from what its journal says, as after any crash.

A full disk is recognised in one place, `disk_full`, for every boundary that reports it
(the API, the daemon's start): ENOSPC/EDQUOT from the OS and SQLITE_FULL from SQLite,
wherever they sit in an exception's chain.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

from keelway.failpoints import pause

TEMP_PREFIX = ".tmp-"
PRIVATE_FILE_MODE = 0o600
# The suffixes of the files SQLite keeps beside a database `D` (`D-wal`, ...). Named here
# only: callers ask `sqlite_side_paths` (keelway/store/base.py still reads the tuple).
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")

_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


# Whether the store's commits in this task may wait for the next durable one (the
# module's docstring); a task begun inside the scope inherits it.
_sync_deferred: ContextVar[bool] = ContextVar("keelway_sync_deferred", default=False)


@contextlib.contextmanager
def sync_deferred(deferred: bool = True) -> Iterator[None]:
    """Within: the store's commits of this task wait for the next durable commit
    (`deferred`), or are durable themselves (`deferred=False`, inside a deferred scope)."""
    token = _sync_deferred.set(deferred)
    try:
        yield
    finally:
        _sync_deferred.reset(token)


def sync_is_deferred() -> bool:
    return _sync_deferred.get()


def sqlite_side_paths(db: Path) -> tuple[Path, ...]:
    """The files SQLite keeps beside database `db`: its `-wal`, `-shm` and `-journal`.
    They are one file with it: whatever copies, moves, removes or owns `db` treats each
    of them alike, or a committed transaction in the `-wal` is lost or left readable."""
    return tuple(db.with_name(db.name + suffix) for suffix in SQLITE_SIDE_FILES)


def disk_full(exc: BaseException) -> bool:
    """Whether `exc`, or anything in its cause/context chain, says the disk is full."""
    # Imported here, not at the top: the CLI imports this module for its hint alone and
    # must start without loading sqlite3.
    import sqlite3

    for current in _chain(exc):
        if isinstance(current, OSError) and current.errno in _DISK_FULL_ERRNOS:
            return True
        # errors the sqlite3 module raises itself (a closed connection) carry no code
        if isinstance(current, sqlite3.Error) and (
                getattr(current, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL):
            return True
    return False


def disk_full_message(exc: BaseException) -> str:
    """What a user reads when `disk_full(exc)`: that, and the file that could not grow."""
    for current in _chain(exc):
        # a copy names its source first and its destination, the file that grew, second
        filename = getattr(current, "filename2", None) or getattr(current, "filename", None)
        if filename:
            return f"the disk is full: no space left to write {filename}"
    return "the disk is full"


DISK_FULL_HINT = (
    "free space on the filesystem that holds $KEELWAY_HOME (`df` shows it), then retry; "
    "nothing was changed half-way, and keelway carries on by itself once there is room"
)


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and its causes/contexts, outermost first (a cycle is cut)."""
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in found):
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def create_private(path: Path, mode: int = PRIVATE_FILE_MODE) -> None:
    """Create `path` empty with `mode` unless it exists (its content is kept).

    For files another program fills in, such as SQLite's database, which then gives its
    `-wal` and `-shm` the same mode.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, mode)
    os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# The writer's mark in a temp name: `.tmp-NAME~PID-TICKS-N`. N makes two writes of one
# process (two threads) distinct; TICKS (the start time in /proc) tells a live writer from
# a later process that got the same pid.
_WRITER_MARK = "~"
_serial = itertools.count()
_me: tuple[int, int] | None = None


def _start_ticks(pid: int) -> int | None:
    """The start time of live process `pid` from /proc, None when it is gone or a zombie.

    A copy of runtime.process.read_stat's two fields: this leaf may import nothing of
    keelway's, and the router, which sweeps too, imports no runtime."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()
    return None if fields[0] == b"Z" else int(fields[19])


def _writer() -> tuple[int, int]:
    global _me
    pid = os.getpid()
    if _me is None or _me[0] != pid:  # first use, or a forked child
        _me = (pid, _start_ticks(pid) or 0)
    return _me


def temp_path(path: Path) -> Path:
    """A temp name beside `path`, unique to this write and marked with its writer, so that
    a sweep by another process while the write is in flight leaves it (`temp_orphaned`)."""
    pid, ticks = _writer()
    return Path(path).with_name(
        f"{TEMP_PREFIX}{Path(path).name}{_WRITER_MARK}{pid}-{ticks}-{next(_serial)}")


def temp_orphaned(name: str) -> bool:
    """Whether the temp file `name` was left by a writer that is gone (a crash's leftover).

    A name with no writer's mark is orphaned only by the rule of the sweep that owns its
    directory (see the module header); here it counts as orphaned when it predates
    writer marks (`.tmp-NAME.PID`, PID dead) and as live otherwise."""
    if not name.startswith(TEMP_PREFIX):
        return False
    _, mark, owner = name.rpartition(_WRITER_MARK)
    if mark:
        pid_s, _, rest = owner.partition("-")
        ticks_s = rest.partition("-")[0]
        if pid_s.isdigit() and ticks_s.isdigit():
            return _start_ticks(int(pid_s)) != int(ticks_s)
    pid_s = name.rpartition(".")[2]
    return pid_s.isdigit() and _start_ticks(int(pid_s)) is None


def write_atomic(path: Path, data: bytes, mode: int = PRIVATE_FILE_MODE,
                 sync: bool = True) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file.

    The temp file is created with `mode` from the start, so a secret is never readable
    by others even for an instant. `sync=False`: whole or absent across a crash of any
    process, but not across a power loss (no fsync), for a file whose writer rewrites
    it after a reboot anyway (the router's table, which the control plane republishes).
    """
    path = Path(path)
    tmp = temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)  # umask may have narrowed it at creation
    # The window a concurrent sweep must not cut (`temp_orphaned`), held open by tests.
    pause(f"write.rename.{path.name}")
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)


def sweep_temp(directory: Path) -> list[Path]:
    """Remove the temp files in `directory` whose writer is gone; returns what was removed.

    Safe while other processes write there: a write in flight is never taken."""
    removed: list[Path] = []
    try:
        entries = list(Path(directory).iterdir())
    except FileNotFoundError:
        return removed
    for entry in entries:
        if temp_orphaned(entry.name) and (entry.is_file() or entry.is_symlink()):
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def symlink_atomic(link: Path, target: Path) -> None:
    """Point `link` at `target`, replacing any previous link in one rename."""
    link = Path(link)
    tmp = temp_path(link)
    os.symlink(target, tmp)
    os.replace(tmp, link)
    fsync_dir(link.parent)
