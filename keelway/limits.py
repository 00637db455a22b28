"""What one process tree may use: memory, CPU, processes, open files (issue #20).

One record, `Limits`, for every place a limit is said: a service's table in
keelway.toml (`memory = "512M"`, `cpu = "0.5"`, `pids = 256`, `nofile = 4096`), the
box-wide defaults an operator gives `keelway up` (`--default-memory 1G`, ...), and what
`status` and `doctor` show. A service's own value wins over the box's default for that
one resource; a resource neither names is the built-in default (`BUILT_IN`), chosen so a
default install keeps a box usable: no tenant can take every process id, every file
descriptor or all the memory.

How a limit is enforced is runtime's business (keelway/runtime/limits.py): a cgroup
controller where the box has one, an rlimit where it does not, and `doctor` says which.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace

_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)?", re.IGNORECASE)
_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

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
    if isinstance(value, bool):
        raise LimitError(f"{where}: {value!r} is not an amount of memory")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE_RE.fullmatch(value.strip())
        if match is None:
            raise LimitError(f'{where}: {value!r} is not an amount of memory; write one like '
                             '"512M" or "2G"')
        size = math.floor(float(match.group(1)) * _UNIT[match.group(2).upper()])
    if size < MIN_MEMORY:
        raise LimitError(f"{where}: {value!r} is below the {format_size(MIN_MEMORY)} a "
                         "process needs to start")
    return size


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
