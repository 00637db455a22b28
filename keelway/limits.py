"""What one process tree may use: memory, CPU, processes, open files (issue #20).

One record, `Limits`, for every place a limit is said: a service's table in
keelway.toml (`memory = "512M"`, `cpu = "0.5"`, `pids = 256`, `nofile = 4096`), the
box-wide defaults an operator gives `keelway up` (`--default-memory 1G`, ...), and what
`status` and `doctor` show. A service's own value wins over the box's default for that
one resource; a resource neither names is the built-in default (`BUILT_IN`), chosen so a
default install keeps a box usable: no tenant can take every process id, every file
descriptor or all the memory.

A build has limits of its own (`BuildLimits`): memory, time and disk, from the app's
`[build]` table under the box's (`keelway up --build-memory ...`), which are a ceiling:
an app may ask for less than the operator allows, never more.

How a limit is enforced is runtime's business (keelway/runtime/limits.py): a cgroup
controller where the box has one, an rlimit where it does not, and `doctor` says which.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace

_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)?", re.IGNORECASE)
_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_DURATION_RE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|y))+")
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|y)")
# A day of 24 hours and a year of 365 days, as HSTS's `max-age` counts them.
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "y": 365 * 86400.0}

# Below these a process cannot start at all (a Python interpreter needs some 10 MB and a
# dozen descriptors): a value under them is a mistake, refused with why.
MIN_MEMORY = 16 << 20
MIN_PIDS = 8
MIN_NOFILE = 64
MAX_NOFILE = 1 << 20  # the kernel's default nr_open


# Out of memory, whom the kernel kills first: every process of a tenant's (its app's, its
# builds') at TENANT_OOM_SCORE, keelway's own (the control plane, the router, the
# replicator) at KEELWAY_OOM_SCORE (keelway/runtime/limits.py sets both).
TENANT_OOM_SCORE = 500
KEELWAY_OOM_SCORE = -900


class LimitError(ValueError):
    """A limit a user wrote that keelway cannot take; the message says how to fix it."""


@dataclass(frozen=True)
class Limits:
    """A process tree's bounds; None: not bounded by this record (the next one decides).

    `memory`: bytes, counted for the whole tree (page cache included, as the kernel
    counts it); past it the kernel kills a process of the tree. `cpu`: cores' worth of
    CPU time (0.5: half of one core), a quota, not a share. `pids`: processes and
    threads of the tree at once. `nofile`: open descriptors per process."""

    memory: int | None = None
    cpu: float | None = None
    pids: int | None = None
    nofile: int | None = None

    def over(self, defaults: Limits) -> Limits:
        """These limits, each unset one taken from `defaults`."""
        return replace(self, **{f.name: getattr(defaults, f.name)
                                for f in fields(self) if getattr(self, f.name) is None})

    def describe(self) -> dict[str, str | None]:
        """Each limit as a person reads it (`512M`, `0.5 cpu`, ...): status and doctor."""
        return {"memory": format_size(self.memory) if self.memory is not None else None,
                "cpu": f"{self.cpu:g}" if self.cpu is not None else None,
                "pids": str(self.pids) if self.pids is not None else None,
                "nofile": str(self.nofile) if self.nofile is not None else None}


# What a service runs under when neither it nor the box says more: enough for an app
# server with a few workers, and a bound on the resources a runaway tenant would
# otherwise take from every other (process ids are box-wide: 32,768 on many boxes).
BUILT_IN = Limits(memory=1 << 30, cpu=None, pids=512, nofile=4096)


def box_limits(memory: str | None = None, cpu: str | None = None, pids: str | None = None,
               nofile: str | None = None) -> Limits:
    """The box's defaults as `keelway up --default-memory ...` gives them (text), over
    the built-in ones: what a tenant runs under where its service says nothing."""
    def count(value: str | None, flag: str, least: int, most: int | None = None) -> int | None:
        if value is None:
            return None
        if not value.strip().isdigit():
            raise LimitError(f"{flag}: {value!r} is not a whole number")
        return parse_count(int(value), flag, least, most)

    return Limits(
        memory=parse_memory(memory, "--default-memory") if memory is not None else None,
        cpu=parse_cpu(cpu, "--default-cpu") if cpu is not None else None,
        pids=count(pids, "--default-pids", MIN_PIDS),
        nofile=count(nofile, "--default-nofile", MIN_NOFILE, MAX_NOFILE),
    ).over(BUILT_IN)


def parse_memory(value: str | int, where: str) -> int:
    """`"512M"`, `"1G"`, `"1.5G"`, `"256Mi"`, or a number of bytes -> bytes."""
    size = _parse_size(value, where, "memory", '"512M" or "2G"')
    if size < MIN_MEMORY:
        raise LimitError(f"{where}: {value!r} is below the {format_size(MIN_MEMORY)} a "
                         "process needs to start")
    return size


def _parse_size(value: str | int, where: str, noun: str, example: str) -> int:
    """A size with an optional unit (K, M, G, T; powers of 1024), or bytes -> bytes."""
    if isinstance(value, bool):
        raise LimitError(f"{where}: {value!r} is not an amount of {noun}")
    if isinstance(value, int):
        return value
    match = _SIZE_RE.fullmatch(value.strip())
    if match is None:
        raise LimitError(f"{where}: {value!r} is not an amount of {noun}; write one like "
                         f"{example}")
    return math.floor(float(match.group(1)) * _UNIT[match.group(2).upper()])


def parse_cpu(value: str | float, where: str) -> float:
    """`"0.5"`, `0.5`, `2`: cores' worth of CPU time."""
    if isinstance(value, bool):
        raise LimitError(f"{where}: {value!r} is not a number of CPUs")
    try:
        cores = float(value)
    except ValueError:
        raise LimitError(f'{where}: {value!r} is not a number of CPUs; write one like "0.5" '
                         "(half a core) or 2") from None
    if not math.isfinite(cores) or cores < 0.01:
        raise LimitError(f"{where}: {value!r} must be at least 0.01 of a CPU")
    return cores


def parse_count(value: int, where: str, least: int, most: int | None = None) -> int:
    """A count of processes or descriptors, within its sane range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise LimitError(f"{where}: {value!r} is not a whole number")
    if value < least or (most is not None and value > most):
        bound = f"from {least}" + (f" to {most}" if most is not None else " up")
        raise LimitError(f"{where}: {value} is out of range ({bound})")
    return value


def format_size(size: int) -> str:
    """Bytes as the largest whole unit that says them exactly (`512M`, `1G`), or bytes."""
    for unit in ("T", "G", "M", "K"):
        if size % _UNIT[unit] == 0:
            return f"{size // _UNIT[unit]}{unit}"
    return str(size)


def parse_duration_s(value: str | float, where: str) -> float:
    """`"500ms"`, `"10s"`, `"15m"`, `"1h"`, `"1m30s"`, `"7d"`, `"1y"`, or a number of
    seconds -> seconds:
    the one grammar of a duration, for keelway.toml and for `keelway up`'s flags."""
    if isinstance(value, bool):
        raise LimitError(f"{where}: {value!r} is not a duration")
    if isinstance(value, str):
        text = value.strip()
        if not _DURATION_RE.fullmatch(text):
            raise LimitError(
                f"{where}: {value!r} is not a duration; write a number of seconds or a "
                'string like "500ms", "10s", "15m", "1h"'
            )
        seconds = sum(
            float(number) * _UNIT_S[unit] for number, unit in _DURATION_PART_RE.findall(text)
        )
    else:
        seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise LimitError(f"{where}: {value!r} must be a finite, non-negative duration")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds as keelway.toml would say them: `30m`, `1h`, `1m30s`, `2s`, `0.5s`."""
    if seconds != int(seconds) or seconds < 60:
        return f"{seconds:g}s"
    whole = int(seconds)
    parts = [(whole // 3600, "h"), (whole % 3600 // 60, "m"), (whole % 60, "s")]
    return "".join(f"{n}{unit}" for n, unit in parts if n)


# Below these a build cannot do anything useful: a mistake, refused with why. (Memory:
# MIN_MEMORY, as for any process tree.)
MIN_BUILD_TIMEOUT_S = 1.0
MIN_BUILD_DISK = 16 << 20
BUILD_TIMEOUT_S = 1800.0
BUILD_DISK = 4 << 30
# A build's memory where the operator says none: 2G, what a framework's build (a
# webpack bundle, a wheel compiled from source) needs; on a small box at most half of
# what the apps may use together, so the serving apps keep the other half while a
# build runs (the build's cgroup is under the apps' parent: keelway/runtime/tree.py).
BUILD_MEMORY = 2 << 30
# Processes and threads of one build step at once: a fork bomb in a build stops here
# (npm and cargo run a few dozen; a bound, not a budget).
BUILD_PIDS = 1024


@dataclass(frozen=True)
class BuildLimits:
    """What one build of an app may use; None: not said here (the box's decides).

    `memory`: bytes for each build step's whole process tree, as Limits.memory. `timeout_s`:
    seconds from the first build step's start to the last one's end. `disk`: bytes the
    build's staged tree (and its tools' scratch space) may grow to, as `du` counts them."""

    memory: int | None = None
    timeout_s: float | None = None
    disk: int | None = None

    def over(self, defaults: BuildLimits) -> BuildLimits:
        """These limits, each unset one taken from `defaults`."""
        return replace(self, **{f.name: getattr(defaults, f.name)
                                for f in fields(self) if getattr(self, f.name) is None})

    def above(self, ceiling: BuildLimits) -> list[str]:
        """Each limit set here that asks for more than `ceiling` allows, said with both
        values (`memory 8G is above this box's 2G`); empty when none does."""
        said, most = self.describe(), ceiling.describe()
        mine = (self.memory, self.timeout_s, self.disk)
        theirs = (ceiling.memory, ceiling.timeout_s, ceiling.disk)
        return [f"{key} {said[key]} is above this box's {most[key]}"
                for key, value, bound in zip(said, mine, theirs, strict=True)
                if value is not None and bound is not None and value > bound]

    def describe(self) -> dict[str, str | None]:
        """Each limit as a person reads it (`2G`, `30m`, `4G`), by its keelway.toml key."""
        return {"memory": format_size(self.memory) if self.memory is not None else None,
                "timeout": (format_duration(self.timeout_s) if self.timeout_s is not None
                            else None),
                "disk": format_size(self.disk) if self.disk is not None else None}


def build_memory_default(apps_budget: int | None) -> int:
    """BUILD_MEMORY, or half the apps' memory budget on a box where that is less."""
    if apps_budget is None:
        return BUILD_MEMORY
    half = apps_budget // 2
    return max(min(BUILD_MEMORY, half - half % 4096), MIN_MEMORY)


def box_build_limits(memory: str | None = None, timeout: str | None = None,
                     disk: str | None = None, *, apps_budget: int | None = None) -> BuildLimits:
    """The box's build limits as `keelway up --build-memory ...` gives them (text), over
    the built-in ones (`apps_budget`: what every app may use together, which bounds the
    built-in memory)."""
    return BuildLimits(
        memory=parse_memory(memory, "--build-memory") if memory is not None else None,
        timeout_s=(parse_build_timeout(timeout, "--build-timeout") if timeout is not None
                   else None),
        disk=parse_build_disk(disk, "--build-disk") if disk is not None else None,
    ).over(BuildLimits(build_memory_default(apps_budget), BUILD_TIMEOUT_S, BUILD_DISK))


def parse_build_timeout(value: str | float, where: str) -> float:
    """A build's time limit: a duration of at least MIN_BUILD_TIMEOUT_S."""
    seconds = parse_duration_s(value, where)
    if seconds < MIN_BUILD_TIMEOUT_S:
        raise LimitError(f"{where}: {value!r} is shorter than the "
                         f"{format_duration(MIN_BUILD_TIMEOUT_S)} any build needs")
    return seconds


def parse_build_disk(value: str | int, where: str) -> int:
    """A build's disk limit: a size (`"4G"`) of at least MIN_BUILD_DISK."""
    size = _parse_size(value, where, "disk", '"512M" or "4G"')
    if size < MIN_BUILD_DISK:
        raise LimitError(f"{where}: {value!r} is below the {format_size(MIN_BUILD_DISK)} "
                         "a build needs")
    return size


def frozen_budget_bytes(value: str | None, apps_budget: int | None) -> int | None:
    """The memory frozen instances may keep together before the longest frozen parks
    (keelway/activator/sweep.py): `value` (a size, or `off` for no bound), else a
    quarter of the apps' budget (None where the box cannot say: no bound)."""
    if value == "off":
        return None
    if value is not None:
        return parse_memory(value, "--frozen-budget")
    return apps_budget // 4 if apps_budget is not None else None
