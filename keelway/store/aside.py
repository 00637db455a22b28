"""Reads in a process of their own: a big read that a busy control plane must not slow.

A read apart from the event loop (`SqliteStore.read_apart`) runs in a thread, and a
thread shares the interpreter's lock with the loop: while a thousand-instance rollout
kept the loop busy, a `status` that takes 0.1 s on a quiet control plane took over a
second, most of it waiting for its turn at the lock (SQLite gives the lock back at each
row it steps). Here the read runs in a child interpreter of its own, over its own
read-only connection, inside one read transaction, and only its result (pickled)
crosses back.

The child is keelway's own (Python running `main` here, on the store's path), started on first use
and kept: it reads a request from its stdin, answers on its stdout, and exits when its
stdin closes, so it never outlives the control plane that started it. It holds only
stdio (subprocess closes every other descriptor). Only a store of ASIDE_FROM instances
or more reads aside at all. A request is a module-level function
and its arguments, `read(store, *args)`; the reply is what it returned, or the exception
it raised. One request at a time. A child that died is started again once; a read that
still cannot be made aside is the caller's to make in a thread.

Both sides are keelway: the pipe is private to them, so pickle is safe here.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

_LENGTH = struct.Struct(">I")
# How long a read aside may take before its process is replaced and the read made in a
# thread instead: far past any read's own time (`status` of 10,000 instances: seconds).
READ_BOUND_S = 60.0

# How many instances a store holds before its big reads are made aside: below it, a read
# is quick even on a busy control plane, and costs less in a thread than a process of
# some 40 MB (SqliteStore.read_aside).
ASIDE_FROM = 200


class AsideUnavailable(Exception):
    """The reading process could not be started or died mid-read."""


class Aside:
    """The control plane's side: one reading process for the store at `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def call(self, read: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """`read(store, *args)` in the reading process; blocks (run it in a thread)."""
        with self._lock:
            for attempt in (1, 2):
                proc = self._running()
                try:
                    _send(proc.stdin, (read, args))
                    ok, value = _receive(proc.stdout, READ_BOUND_S)
                except (OSError, EOFError, pickle.UnpicklingError, TypeError,
                        AttributeError) as exc:  # a reply that cannot be read: a new child
                    self._stop()
                    if attempt == 2:
                        raise AsideUnavailable(f"the reading process failed: {exc}") from exc
                    continue
                if ok:
                    return value
                raise value

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _running(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is not None:
            self._stop()  # died: its pipes closed, its status reaped
        if self._proc is None:
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-c", _MAIN, str(self.path)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
            except OSError as exc:
                raise AsideUnavailable(f"cannot start the reading process: {exc}") from exc
        return self._proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
        try:
            proc.wait(timeout=5)  # its stdin closed: it exits
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _send(pipe: IO[bytes] | None, message: object) -> None:
    assert pipe is not None
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(_LENGTH.pack(len(data)) + data)
    pipe.flush()


def _receive(pipe: IO[bytes] | None, bound_s: float | None = None) -> Any:
    """One message; EOFError when the other end closed, or (with `bound_s`) did not
    answer in time: a reading process that hangs is replaced, never waited on."""
    assert pipe is not None
    deadline = None if bound_s is None else time.monotonic() + bound_s

    def exactly(n: int) -> bytes:
        got = b""
        while len(got) < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([pipe], [], [], left)[0]:
                    raise EOFError(f"no answer within {bound_s:g}s")
            chunk = os.read(pipe.fileno(), n - len(got))
            if not chunk:
                raise EOFError("the other end closed")
            got += chunk
        return got

    (size,) = _LENGTH.unpack(exactly(_LENGTH.size))
    return pickle.loads(exactly(size))


def serve(path: Path, requests: IO[bytes], replies: IO[bytes]) -> None:
    """The reading process: each request read over one snapshot, until stdin closes."""
    from keelway.store.sqlite import SqliteStore  # the child's one heavy import

    store = SqliteStore(path, read_only=True)
    try:
        while True:
            try:
                read, args = _receive(requests)
            except EOFError:
                return
            try:
                with store.db.snapshot():
                    reply: tuple[bool, object] = (True, read(store, *args))
            except Exception as exc:
                reply = (False, exc)
            try:
                _send(replies, reply)
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                _send(replies, (False, AsideUnavailable(f"cannot send the reply: {exc}")))
    finally:
        store.close()


def main(path: str) -> None:
    """The reading process's entry (`_MAIN`)."""
    # stdout carries replies alone: anything else printed would corrupt them.
    replies = os.fdopen(os.dup(1), "wb")
    sys.stdout = sys.stderr
    serve(Path(path), sys.stdin.buffer, replies)


# Not `-m keelway.store.aside`: the store package imports this module, and runpy warns
# of a module run as __main__ that its package has imported already.
_MAIN = "import sys; from keelway.store.aside import main; main(sys.argv[1])"
