"""The access log: one line per request an instance's routes answered, per instance.

Owns the records a router process keeps of its answers, their line format, and their
way to disk. Invariants:

- the request path pays for a record with a tuple appended to `pending` (built in
  exchange.py from what the exchange already holds, and two reads of the monotonic
  clock); formatting and writing happen off it, in batches, every `flush_every_s` or
  as soon as `max_pending` records wait, so memory is bounded and a burst costs no
  more system calls than a trickle;
- each process (the main one and every worker) appends to the same file per instance,
  `<logs_dir>/<instance>/router.access.log`, opened O_APPEND for each batch and closed
  after it: every write is whole lines, at most `_WRITE_BYTES` (PIPE_BUF), so lines of
  two processes interleave only between lines, never inside one. One shared file (and
  not one per process, merged when read) keeps one rotation rule and one file to read;
  the price is that lines of two workers are in time order only per batch, within
  `flush_every_s` of each other, and readers sort by the time each line carries;
- the file lives under the instance, not a generation, so deploys and router restarts
  append to the same file; the control plane rotates it with the service logs
  (keelway/runtime/logs.py `rotate_if_large`: copytruncate, so an O_APPEND writer
  needs no reopening);
- the query string is never written (the path is cut at `?`), nor any header: what a
  URL carries after `?` is where tokens end up. Bytes outside printable ASCII in the
  path are written %XX, so a line is always one line of text;
- a batch the disk has no room for is dropped, counted, and said in the router log at
  most once per `_REPORT_S`: traffic never waits for its log.

A line reads (fields separated by one space; `-` for a field with nothing to say):

    2025-05-01T12:00:00.123Z 203.0.113.9 GET /path 200 1534 2.4ms gen=7 held=-

time the request's head completed (UTC), client address (the TCP peer), method, path,
status (499: the client left before its answer), bytes sent to the client (head and
body, chunk framing aside), duration until the answer's last byte was handed to the
kernel, the generation behind the upstream, and how long it was held (a parked instance
waking, a hold-mode swap, or a wait for a slot of the instance's bound).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import time
from pathlib import Path
from typing import Final

log: Final = logging.getLogger("keelway.router")

ACCESS_LOG_NAME: Final = "router.access.log"
FLUSH_EVERY_S: Final = 0.5
MAX_PENDING: Final = 4096
# What a single write may carry for lines of two processes never to interleave inside
# one: POSIX promises it only for pipes, Linux keeps any O_APPEND write to a regular
# file whole; this is the conservative bound of the two.
_WRITE_BYTES: Final = 4096
_REPORT_S: Final = 10.0
_PRIVATE_FILE_MODE: Final = 0o600
_OPEN_FLAGS: Final = (os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
_UNSAFE: Final = re.compile(rb"[^\x21-\x7e]")

# One record, as exchange.py appends it: (instance, generation, began (monotonic),
# ended (monotonic), method, url, status, bytes sent, held seconds (-1.0: never held),
# client address).
Record = tuple[str, int | None, float, float, bytes, bytes, int, int, float, bytes]


def _escape(match: re.Match[bytes]) -> bytes:
    return b"%%%02X" % match[0][0]


def path_of(url: bytes) -> str:
    """The path of a request target as the log writes it: no query, one line."""
    cut = url.find(b"?")
    path = url if cut < 0 else url[:cut]
    if _UNSAFE.search(path) is not None:
        path = _UNSAFE.sub(_escape, path)
    return path.decode("ascii") if path else "-"


class _Stamps:
    """UTC times as the log writes them; the seconds part made once per second."""

    __slots__ = ("_second", "_text")

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def of(self, wall: float) -> str:
        second = int(wall)
        if second != self._second:
            self._second = second
            self._text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._text}.{int((wall - second) * 1000):03d}Z"


def format_line(record: Record, wall_offset_s: float, stamps: _Stamps) -> str:
    """One record as its line (with its newline); `wall_offset_s` turns the monotonic
    clock into the wall clock."""
    _, generation, began, ended, method, url, status, sent, held_s, client = record
    gen = "-" if generation is None else str(generation)
    held = "-" if held_s < 0 else f"{held_s * 1000:.1f}ms"
    return (f"{stamps.of(began + wall_offset_s)} {client.decode('ascii', 'replace')} "
            f"{method.decode('ascii', 'replace')} {path_of(url)} {status} {sent} "
            f"{(ended - began) * 1000:.1f}ms gen={gen} held={held}\n")


def line_time(line: str) -> float | None:
    """The time an access-log line carries (unix seconds), None if it carries none."""
    stamp = line[:24]
    if len(stamp) != 24 or stamp[-1] != "Z" or stamp[19] != ".":
        return None
    try:
        whole = time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")
        return _timegm(whole) + int(stamp[20:23]) / 1000
    except ValueError:
        return None


def _timegm(parts: time.struct_time) -> float:
    # calendar.timegm without importing calendar's locale machinery into the router.
    days = _days_from_civil(parts.tm_year, parts.tm_mon, parts.tm_mday)
    return float(days * 86400 + parts.tm_hour * 3600 + parts.tm_min * 60 + parts.tm_sec)


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


class AccessLog:
    """The records of one router process, written in batches under `logs_dir`.

    `pending` is the hot path's: exchange.py appends a Record and, past `max_pending`,
    calls `flush_soon`. `start` arms the timer; `close` cancels it and writes what is
    left (a drained router loses no line it answered)."""

    def __init__(self, logs_dir: Path, flush_every_s: float = FLUSH_EVERY_S,
                 max_pending: int = MAX_PENDING) -> None:
        self.logs_dir: Final = logs_dir
        self.flush_every_s: Final = flush_every_s
        self.max_pending: Final = max_pending
        self.pending: list[Record] = []
        self.dropped = 0
        self._stamps = _Stamps()
        self._timer: asyncio.TimerHandle | None = None
        self._soon: asyncio.Handle | None = None
        self._reported_at = float("-inf")
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._timer = self._loop.call_later(self.flush_every_s, self._tick)

    def _tick(self) -> None:
        self.flush()
        if self._loop is not None:
            self._timer = self._loop.call_later(self.flush_every_s, self._tick)

    def flush_soon(self) -> None:
        """The size bound was reached: write the batch at the loop's next turn (once)."""
        if self._soon is None and self._loop is not None:
            self._soon = self._loop.call_soon(self.flush)

    def close(self) -> None:
        for handle in (self._timer, self._soon):
            if handle is not None:
                handle.cancel()
        self._timer = self._soon = None
        self._loop = None
        self.flush()

    def flush(self) -> None:
        """Write every pending record to its instance's file; never raises for the disk."""
        self._soon = None
        records, self.pending = self.pending, []
        if not records:
            return
        offset_s = time.time() - time.monotonic()
        by_instance: dict[str, list[str]] = {}
        for record in records:
            lines = by_instance.get(record[0])
            if lines is None:
                lines = by_instance[record[0]] = []
            lines.append(format_line(record, offset_s, self._stamps))
        for instance, lines in by_instance.items():
            try:
                self._append(self.logs_dir / instance / ACCESS_LOG_NAME, lines)
            except OSError as exc:
                self.dropped += len(lines)
                self._report(instance, exc)

    @staticmethod
    def _append(path: Path, lines: list[str]) -> None:
        try:
            fd = os.open(path, _OPEN_FLAGS, _PRIVATE_FILE_MODE)
        except FileNotFoundError:
            # An instance the control plane has started nothing for yet.
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, _OPEN_FLAGS, _PRIVATE_FILE_MODE)
        try:
            chunk: list[bytes] = []
            size = 0
            for line in lines:
                data = line.encode()
                if size + len(data) > _WRITE_BYTES and chunk:
                    _write_all(fd, b"".join(chunk))
                    chunk.clear()
                    size = 0
                chunk.append(data)
                size += len(data)
            if chunk:
                _write_all(fd, b"".join(chunk))
        finally:
            os.close(fd)

    def _report(self, instance: str, exc: OSError) -> None:
        now = time.monotonic()
        if now - self._reported_at >= _REPORT_S:
            self._reported_at = now
            why = "the disk is full" if exc.errno == errno.ENOSPC else str(exc)
            log.warning("access log of %s: lines dropped (%d so far): %s",
                        instance, self.dropped, why)


def _write_all(fd: int, data: bytes) -> None:
    # A short write to a regular file happens only as the disk fills: the rest is tried
    # once more, which then raises ENOSPC.
    while data:
        written = os.write(fd, data)
        data = data[written:]
