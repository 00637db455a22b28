"""The access log: one line per request an instance's routes answered, per instance.

Owns the records a router process keeps of its answers, their line format, and their
way to disk. Invariants:

- the request path pays for a record with its ten fields appended to the flat list
  `pending` (from what the exchange already holds, and two reads of the monotonic
  clock): no object per record, so the garbage collector has nothing more to walk for
  a busy log (a tuple per record, kept until the batch, made the young generation's
  collections longer); writing happens off it, in batches, every `flush_every_s` or as soon as
  `max_pending` records wait, so memory is bounded and a burst costs no more system
  calls than a trickle;
- a batch is written as the records themselves, one msgpack frame per instance
  (`encode_frame`: one C call for the whole batch), never formatted in the router: text
  is made when the log is read (`read_lines`, which `keelway logs APP --service router`
  uses). Formatting every line in the router cost a tenth of its throughput on one core
  (bench/router.py --access-log); a frame costs some 0.05 us a record;
- each process (the main one and every worker) appends to the same file per instance,
  `<logs_dir>/<instance>/router.access.log`, opened O_APPEND for each batch and closed
  after it, each frame one write: Linux keeps an O_APPEND write to a regular file whole,
  so frames of two processes never interleave inside one. One shared file (and not one
  per process, merged when read) keeps one rotation rule and one file to read; the
  price is that records of two workers are in time order only per batch, within
  `flush_every_s` of each other, and readers sort by the time each record carries. A
  reader skips a frame cut short (a rotation's copy taken mid-write) or damaged, and
  resynchronizes on the next frame's mark;
- the file lives under the instance, not a generation, so deploys and router restarts
  append to the same file; the control plane rotates it with the service logs
  (keelway/runtime/logs.py `rotate_if_large`: copytruncate, so an O_APPEND writer
  needs no reopening);
- the query string is never written (the path is cut at `?`), nor any header: what a
  URL carries after `?` is where tokens end up. Bytes outside printable ASCII in the
  path are written %XX, so a line is always one line of text;
- a batch the disk has no room for is dropped, counted, and said in the router log at
  most once per `_REPORT_S`: traffic never waits for its log.

A record reads, once read (fields separated by one space; `-` for a field with nothing
to say):

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

log: Final = logging.getLogger("keelway.router")

ACCESS_LOG_NAME: Final = "router.access.log"
FLUSH_EVERY_S: Final = 0.5
MAX_PENDING: Final = 4096
# A frame: this mark, its payload's length (4 bytes, big-endian), then the payload, a
# msgpack array [wall clock - monotonic clock at the write, [record, ...]].
FRAME_MARK: Final = b"\x00KWA"
_HEAD_BYTES: Final = len(FRAME_MARK) + 4
_MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
_REPORT_S: Final = 10.0
_PRIVATE_FILE_MODE: Final = 0o600
_OPEN_FLAGS: Final = (os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
_UNSAFE: Final = re.compile(rb"[^\x21-\x7e]")

# One record, as exchange.py appends its fields to `pending`: (instance, generation,
# began (monotonic), ended (monotonic), method, url, status, bytes sent, held seconds
# (-1.0: never held), client address).
Record = tuple[str, int | None, float, float, bytes, bytes, int, int, float, bytes]
FIELDS: Final = 10


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


def format_line(record: Sequence[Any], wall_offset_s: float, stamps: _Stamps) -> str:
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

    `pending` is the hot path's: exchange.py extends it by a Record's FIELDS and, past
    `max_pending` records (`max_pending * FIELDS` items),
    calls `flush_soon`. `start` arms the timer; `close` cancels it and writes what is
    left (a drained router loses no line it answered)."""

    def __init__(self, logs_dir: Path, flush_every_s: float = FLUSH_EVERY_S,
                 max_pending: int = MAX_PENDING) -> None:
        self.logs_dir: Final = logs_dir
        self.flush_every_s: Final = flush_every_s
        self.max_pending: Final = max_pending
        self.pending: list[object] = []  # FIELDS items a record, flat
        self.max_items: Final = max_pending * FIELDS
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
        by_instance: dict[str, list[object]] = {}
        for at in range(0, len(records) - FIELDS + 1, FIELDS):
            instance = str(records[at])
            batch = by_instance.get(instance)
            if batch is None:
                batch = by_instance[instance] = []
            batch += records[at:at + FIELDS]
        for instance, batch in by_instance.items():
            try:
                self._append(self.logs_dir / instance / ACCESS_LOG_NAME,
                             encode_frame(offset_s, batch))
            except OSError as exc:
                self.dropped += len(batch) // FIELDS
                self._report(instance, exc)

    @staticmethod
    def _append(path: Path, frame: bytes) -> None:
        try:
            fd = os.open(path, _OPEN_FLAGS, _PRIVATE_FILE_MODE)
        except FileNotFoundError:
            # An instance the control plane has started nothing for yet.
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, _OPEN_FLAGS, _PRIVATE_FILE_MODE)
        try:
            _write_all(fd, frame)
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


_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder()


def encode_frame(wall_offset_s: float, records: Sequence[Any]) -> bytes:
    """One batch of records, their fields flat, as a frame of the file (see
    FRAME_MARK)."""
    payload = _ENCODER.encode((wall_offset_s, records))
    return FRAME_MARK + len(payload).to_bytes(4, "big") + payload


def read_lines(path: Path, offset: int = 0) -> tuple[list[tuple[float, str]], int]:
    """Every record of the file from `offset` as (unix time, line without its newline),
    in file order, and the offset after the last whole frame (where reading on
    begins). A missing file is empty."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return [], offset
    found: list[tuple[float, str]] = []
    stamps = _Stamps()
    at = 0
    end = 0
    while True:
        start = data.find(FRAME_MARK, at)
        if start < 0 or start + _HEAD_BYTES > len(data):
            break
        size = int.from_bytes(data[start + len(FRAME_MARK):start + _HEAD_BYTES], "big")
        stop = start + _HEAD_BYTES + size
        if size > _MAX_FRAME_BYTES:
            at = start + 1  # not a frame's length: look for the next mark
            continue
        if stop > len(data):
            break  # cut short: a write still under way, or a copy taken mid-write
        try:
            wall_offset_s, flat = _DECODER.decode(data[start + _HEAD_BYTES:stop])
            for at_field in range(0, len(flat) - FIELDS + 1, FIELDS):
                record = flat[at_field:at_field + FIELDS]
                found.append((float(record[2]) + float(wall_offset_s),
                              format_line(record, float(wall_offset_s), stamps)[:-1]))
        except (msgspec.DecodeError, ValueError, TypeError, IndexError):
            pass  # a damaged frame: skipped whole
        at = end = stop
    return found, offset + end
