"""When each line of a service log was written, as near as the control plane saw it.

A service writes its log itself, straight into the file (keelway/runtime/logs.py), so
its lines carry no time of ours. To merge an app's logs in time order, the control
plane samples each log once a second (`Sampler`): when a file has grown, it appends
`SIZE MTIME` to a sidecar, `<log>.times`. The file's mtime is the time of its last
write, so every byte below SIZE was written at or before MTIME, and every byte above the
previous sample's SIZE after that sample's MTIME. A line is given the MTIME of the first
sample that covers its end (`Timeline.time_at`): never earlier than it was written, and
at most about one sampling interval (`SAMPLE_EVERY_S`) later. Lines past the last sample
(the last second's) get the file's mtime now, the same bound.

Invariants: a sidecar only grows while its log grows; a log found shorter than its last
sample (rotated, or truncated by someone) has its sidecar started again, and rotation
removes it with the truncate (logs.rotate_if_large), so a sample never speaks for bytes
of another file's life. Lines of a rotated copy have no times. While the control plane
is down nothing is sampled: lines written then share the time of the first sample after
it comes back (an upper bound still, no longer within a second). The access log carries
its own times and is never sampled.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from keelway.durable import PRIVATE_FILE_MODE
from keelway.router.access_log import ACCESS_LOG_NAME

SAMPLE_EVERY_S: Final = 1.0
_SUFFIX: Final = ".times"


def times_path(log: Path) -> Path:
    return log.with_name(log.name + _SUFFIX)


@dataclass
class Sampler:
    """The sizes last sampled, so an unchanged file costs one stat a round."""

    sizes: dict[Path, int] = field(default_factory=dict)

    def sample(self, apps_dir: Path) -> None:
        """One round over every service log under `apps_dir` (`INSTANCE/*.log`)."""
        seen: dict[Path, int] = {}
        for path in apps_dir.glob("*/*.log") if apps_dir.exists() else []:
            if path.name == ACCESS_LOG_NAME:
                continue  # its lines carry their own times
            try:
                info = path.stat()
            except FileNotFoundError:
                continue
            last = self.sizes.get(path)
            if last is None:
                last = Timeline.load(path).last_size()
            seen[path] = info.st_size
            if info.st_size == last:
                continue
            sidecar = times_path(path)
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
            if last is not None and info.st_size < last:
                flags |= os.O_TRUNC  # a new life of the file: the old samples are not its
            if info.st_size == 0:
                if flags & os.O_TRUNC:
                    sidecar.unlink(missing_ok=True)
                continue
            fd = os.open(sidecar, flags, PRIVATE_FILE_MODE)
            try:
                os.write(fd, f"{info.st_size} {info.st_mtime:.3f}\n".encode())
            finally:
                os.close(fd)
        self.sizes = seen  # files gone are forgotten


@dataclass(frozen=True)
class Timeline:
    """A log's samples: sizes ascending, each with the mtime it was seen with."""

    sizes: list[int]
    times: list[float]

    @classmethod
    def load(cls, log: Path) -> Timeline:
        sizes: list[int] = []
        times: list[float] = []
        try:
            text = times_path(log).read_text()
        except FileNotFoundError:
            return cls(sizes, times)
        for line in text.splitlines():
            size_s, _, at_s = line.partition(" ")
            try:
                size, at = int(size_s), float(at_s)
            except ValueError:
                continue  # a line cut by a full disk
            if sizes and size <= sizes[-1]:
                continue
            sizes.append(size)
            times.append(at)
        return cls(sizes, times)

    def last_size(self) -> int | None:
        return self.sizes[-1] if self.sizes else None

    def time_at(self, end: int, newest: float) -> float:
        """The time of the line ending at byte `end`; `newest` (the file's mtime) for
        lines past the last sample."""
        at = bisect.bisect_left(self.sizes, end)
        return self.times[at] if at < len(self.times) else newest
