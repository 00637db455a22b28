"""The doctor's checks that need nothing but the box: the home's permissions, the disk
under it, and whether a router answers where the home says it listens. A leaf with no
keelway imports, so the CLI runs them when the control plane is down and the API runs
the same ones when it is up: one rule each, never a second copy.

Rules kept here:
- A check is a value (`Check`): its name, a severity, what was seen, and what to do.
  FAIL needs a person (the doctor exits 1); WARN is something this box cannot do,
  worth knowing and not a fault of the install; OK says what was checked.
- The home is owner-only: nothing in it is readable or writable by group or other.
  The search bit alone is allowed (0711: tenants' uids pass through to their own
  files, keelway/home.py `tenant_traversed`), since it lists and reads nothing.
- The disk is low when under `LOW_DISK_SHARE` of it or `LOW_DISK_BYTES` is free,
  whichever says so first: a share alone would let a small disk run out, a byte count
  alone would cry wolf on nothing at all of a big one.
- Nothing here writes, signals or waits long: a probe is one connect with a short
  timeout, so a doctor run against a wedged router still ends.
"""

from __future__ import annotations

import enum
import json
import os
import socket
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOW_DISK_SHARE = 0.10
LOW_DISK_BYTES = 1 << 30
# Bits that let group or other read or write; the search bit (x) alone is allowed.
OPEN_BITS = 0o066
# How many paths a finding names before it counts the rest.
NAMED_AT_MOST = 5
PROBE_TIMEOUT_S = 2.0


class Severity(enum.StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    """One line of the doctor's answer: `fix` says what to do, None when nothing is."""

    name: str
    severity: Severity
    detail: str
    fix: str | None = None

    def view(self) -> dict[str, Any]:
        return {"check": self.name, "ok": self.severity is Severity.OK,
                "severity": self.severity.value, "detail": self.detail, "fix": self.fix}


def needs_person(checks: Iterable[dict[str, Any]]) -> bool:
    """Whether any check of a doctor's answer needs a person: what exits 1."""
    return any(c.get("severity", "ok" if c["ok"] else "fail") == Severity.FAIL
               for c in checks)


def named(items: list[str]) -> str:
    """`a, b, c`, or the first NAMED_AT_MOST and how many more."""
    shown = ", ".join(items[:NAMED_AT_MOST])
    more = len(items) - NAMED_AT_MOST
    return shown + (f" and {more} more" if more > 0 else "")


# -- disk --------------------------------------------------------------------------


def disk_finding(where: Path, free_bytes: int, total_bytes: int) -> Check:
    """The disk check from its figures alone (no I/O), so the thresholds are tested
    without filling a disk."""
    free = _size(free_bytes)
    share = free_bytes / total_bytes if total_bytes > 0 else 0.0
    said = f"{free} free of {_size(total_bytes)} ({share:.0%}) under {where}"
    if free_bytes < LOW_DISK_BYTES or share < LOW_DISK_SHARE:
        return Check("disk space", Severity.FAIL, f"low: {said}",
                     "free space there (`keelway gc` removes old builds, snapshots past "
                     "each app's `keep` and old kept copies), or grow the filesystem; "
                     f"keelway wants at least {_size(LOW_DISK_BYTES)} and "
                     f"{LOW_DISK_SHARE:.0%} free")
    return Check("disk space", Severity.OK, said)


def disk_check(root: Path) -> Check:
    try:
        found = os.statvfs(root)
    except OSError as exc:
        return Check("disk space", Severity.FAIL, f"cannot read the disk under {root}: "
                     f"{exc.strerror or exc}", "check that the home exists and is mounted")
    # f_bavail: what an unprivileged writer may still use (the app's uids are such).
    return disk_finding(root, found.f_bavail * found.f_frsize, found.f_blocks * found.f_frsize)


def _size(count: int) -> str:
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f}{unit}"
    return f"{count}B"


# -- permissions -------------------------------------------------------------------


def open_to_others(root: Path, passed_through: Iterable[Path]) -> list[tuple[Path, int]]:
    """The paths of the home that group or other may read or write, with their modes:
    the home itself, its entries, and the entries of the directories tenants pass
    through (`passed_through`). Below any other directory nothing is reachable by
    another uid (it is 0700, or is itself named here), so nothing deeper is listed:
    a home of ten thousand tenants costs one stat per entry of those few directories."""
    found = []
    for path in _entries(root, {Path(p) for p in passed_through}):
        try:
            info = path.lstat()
        except FileNotFoundError:  # gone since it was listed: nothing to say
            continue
        if stat.S_ISLNK(info.st_mode):  # a link's own mode means nothing
            continue
        if info.st_mode & OPEN_BITS:
            found.append((path, stat.S_IMODE(info.st_mode)))
    return found


def _entries(root: Path, passed_through: set[Path]) -> Iterator[Path]:
    """The home, its entries, then the entries of each directory passed through."""
    yield root
    for directory in (root, *sorted(passed_through - {root})):
        try:
            names = sorted(os.listdir(directory))
        except (FileNotFoundError, NotADirectoryError):
            continue
        yield from (directory / name for name in names)


def permission_check(root: Path, passed_through: Iterable[Path]) -> Check:
    try:
        found = open_to_others(root, passed_through)
    except PermissionError as exc:
        return Check("home permissions", Severity.FAIL,
                     f"cannot read {exc.filename}: run the doctor as the user keelway "
                     "runs as", f"sudo -u THAT_USER keelway doctor (home {root})")
    if not found:
        return Check("home permissions", Severity.OK,
                     f"{root} and its state files are owner-only (tenants may only pass "
                     "through)")
    paths = [str(p) for p, _mode in found]
    return Check("home permissions", Severity.FAIL,
                 "readable or writable by other users: " + named(
                     [f"{p} ({mode:04o})" for p, mode in found]),
                 "chmod go-rw " + " ".join(paths[:NAMED_AT_MOST])
                 + ("; then run the doctor again for the rest" if len(paths) > NAMED_AT_MOST
                    else "")
                 + " (the home holds config values, instance keys and databases)")


# -- the router --------------------------------------------------------------------


def router_pid(control_socket: Path, timeout_s: float = PROBE_TIMEOUT_S) -> int | None:
    """The pid a router answers a ping with on `control_socket`; None: no router
    answers there. The control protocol's ping, as keelway/router/control_wire.py
    defines it, spoken with the stdlib (the CLI loads no router code); a test holds
    the two to one wire."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(str(control_socket))
            sock.sendall(json.dumps({"op": "ping"}).encode() + b"\n")
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                reply += chunk
        answer = json.loads(reply)
    except (OSError, ValueError):
        return None
    pid = answer.get("pid") if isinstance(answer, dict) and answer.get("ok") else None
    return pid if isinstance(pid, int) else None


def accepts(addr: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when something accepts a TCP connection at `addr` (HOST:PORT, a wildcard
    host probed on loopback); otherwise why not."""
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    if not port.isdigit():
        return f"{addr!r} is not HOST:PORT"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def router_checks(pid: int | None, control_socket: Path,
                  listeners: dict[str, str]) -> list[Check]:
    """Whether the router answers on its control socket (`pid`, None: it did not) and
    each of its `listeners` (kind -> HOST:PORT) accepts connections."""
    checks = [Check("router", Severity.OK,
                    f"the router (pid {pid}) answers on {control_socket}")
              if pid is not None else
              Check("router", Severity.FAIL, f"no router answers on {control_socket}",
                    "`keelway router restart` starts one (with the control plane up: "
                    "`keelway up -d`); its log is $KEELWAY_HOME/logs/router.log")]
    for kind, addr in listeners.items():
        why = accepts(addr)
        checks.append(
            Check(f"{kind} port", Severity.OK, f"{addr} accepts connections")
            if why is None else
            Check(f"{kind} port", Severity.FAIL, f"nothing accepts connections at {addr}: "
                  f"{why}", "`keelway router restart`; if the port is taken by another "
                  f"program, free it or choose another (`keelway up --{kind} ADDR`)"))
    return checks


def recorded_listeners(settings_file: Path) -> dict[str, str]:
    """Where the last router said it listens, from the settings it recorded
    (keelway/runtime/router.py `record_settings`: JSON with `addr` and `https`); empty
    when none was recorded or it cannot be read. The CLI's view when the control plane
    is down; a test holds it to the writer."""
    try:
        recorded = json.loads(settings_file.read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(recorded, dict):
        return {}
    return {kind: recorded[key] for kind, key in (("http", "addr"), ("https", "https"))
            if isinstance(recorded.get(key), str)}
