"""An app's logs as one stream: every instance's service logs and router access log,
merged in time order.

Owns which files an app's logs are and the time each line is given. An access-log line
carries its own time (keelway/router/access_log.py); a service line gets the time the
control plane sampled for it (keelway/runtime/log_times.py: at most about a second
after it was written), and a line read while following gets its file's mtime when read.
So the merge is exact between access-log lines, and between a service line and anything
else it is right to within about a second. Lines with equal times keep their file's
order, and one file's lines never change order among themselves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from keelway.home import Home
from keelway.router.access_log import ACCESS_LOG_NAME, read_lines
from keelway.runtime.log_times import Timeline
from keelway.runtime.logs import read_from
from keelway.store import Store

ROUTER_SERVICE: Final = "router"
_CHUNK_BYTES: Final = 64 * 1024
# How far back one file is read for a tail at most: a rotated log is below it.
_MAX_BACK_BYTES: Final = 16 * 1024 * 1024


@dataclass(frozen=True)
class Source:
    """One file of an app's logs: whose, which service, and where it is."""

    instance: str
    service: str
    generation: int | None
    path: Path

    @property
    def carries_times(self) -> bool:
        return self.generation is None  # the access log: one per instance, no generation


@dataclass(frozen=True)
class Line:
    at: float
    source: Source
    text: str

    def view(self) -> dict[str, object]:
        return {"instance": self.source.instance, "service": self.source.service,
                "generation": self.source.generation, "at": round(self.at, 3),
                "line": self.text}


def access_sources(store: Store, home: Home, app: str, instance: str | None,
                   service: str | None) -> list[Source]:
    """The router access log of each instance of `app` that has one."""
    if service not in (None, ROUTER_SERVICE):
        return []
    found = []
    for inst in store.instances.list_instances(app):
        if instance is not None and inst.host != instance:
            continue
        path = home.log_dir(inst.host) / ACCESS_LOG_NAME
        if path.exists():
            found.append(Source(inst.host, ROUTER_SERVICE, None, path))
    return found


def tail(source: Source, lines: int, since: float | None) -> tuple[list[Line], int]:
    """The newest `lines` complete lines of `source` at or after `since`, oldest first,
    and the offset after its last complete line (where following it begins). Read back
    from the end a chunk at a time, never more than `_MAX_BACK_BYTES`; the access log,
    records rather than lines, is read whole (its rotation bounds it)."""
    if source.carries_times:
        records, end = read_lines(source.path)
        records.sort(key=lambda record: record[0])  # two workers' batches interleave
        timed = [Line(at, source, text) for at, text in records
                 if since is None or at >= since]
        return (timed[-lines:] if lines > 0 else []), end
    try:
        fd = os.open(source.path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return [], 0
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        end = info.st_size
        timeline = Timeline.load(source.path)
        floor = since
        kept: list[Line] = []
        complete_end: int | None = None  # after the last complete line, once found
        buf = b""  # the bytes from `pos` on not yet taken as lines
        pos = end
        done = False
        while pos > 0 and not done and end - pos < _MAX_BACK_BYTES:
            start = max(0, pos - _CHUNK_BYTES)
            handle.seek(start)
            buf = handle.read(pos - start) + buf
            pos = start
            if complete_end is None:
                cut = buf.rfind(b"\n")
                if cut < 0:
                    continue  # still inside the last line, which is not complete yet
                complete_end = start + cut + 1
                buf = buf[: cut + 1]
                if lines <= 0:
                    break
            # `buf` ends with a newline; its first line may be cut by this read's start.
            first = buf.find(b"\n") + 1 if start > 0 else 0
            body, buf = buf[first:], buf[:first]
            ends = []
            at_end = start + first
            pieces = body.split(b"\n")[:-1]
            for raw in pieces:
                at_end += len(raw) + 1
                ends.append(at_end)
            for raw, line_end in zip(reversed(pieces), reversed(ends), strict=True):
                text = raw.decode("utf-8", "replace")
                at = timeline.time_at(line_end, info.st_mtime)
                if floor is not None and at < floor:
                    done = True
                    break
                if since is None or at >= since:
                    kept.append(Line(at, source, text))
                    if len(kept) >= lines:
                        done = True
                        break
    kept.reverse()
    return kept, end if complete_end is None else complete_end


def merged(sources: list[Source], lines: int, since: float | None,
           ) -> tuple[list[Line], dict[Path, int]]:
    """The newest `lines` lines of all `sources` at or after `since`, in time order, and
    where following each file begins."""
    found: list[Line] = []
    offsets: dict[Path, int] = {}
    for source in sources:
        text, offsets[source.path] = tail(source, lines, since)
        found += text
    found.sort(key=lambda line: line.at)  # stable: a file's own order is kept
    return (found[-lines:] if lines > 0 else []), offsets


def read_new(source: Source, offset: int) -> tuple[list[Line], int]:
    """What was appended to `source` since `offset`, timed (a service line by the file's
    mtime, an access record by its own time), and where to read on from."""
    if source.carries_times:
        records, end = read_lines(source.path, offset)
        return [Line(at, source, text) for at, text in records], end
    text, end = read_from(source.path, offset)
    try:
        newest = source.path.stat().st_mtime
    except FileNotFoundError:
        newest = 0.0
    return [Line(newest, source, line) for line in text], end
