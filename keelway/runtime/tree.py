"""A generation's whole process tree: who belongs to it, how it is stopped, how it is
proven gone (SPEC §3 Stop/Gone, §6: "a generation is its whole process tree, detached
descendants included").

An app may fork, double-fork or setsid() a child (a daemonizing app); that child holds
the instance key and maybe the port as much as its leader does. Membership comes from
the best mechanism the box allows, chosen once per control plane (`ProcessTrees.choose`):

- cgroup v2, or cgroup v1 (freezer, plus pids where mounted): every generation gets its
  own cgroup `keelway/<home id>/g<generation>`, which its leader joins before it execs
  the app (`join_paths`, written by the forked child before its exec: see
  runtime.process), so every descendant is a member from its first instruction,
  whatever it does to its session or its environment. Killing freezes the cgroup first
  (v2: `cgroup.kill`), so nothing forks away mid-kill.
- proc-scan, where no cgroup is writable: a member is a process whose environment
  carries the home's marker and the generation's id (KEELWAY_SUPERVISOR,
  KEELWAY_GENERATION, set by runtime.environment), or that shares its leader's session.
  Killing SIGSTOPs every member first, for the same reason. A descendant that both
  leaves the session (setsid) *and* clears its environment (`env -i`) is invisible to
  this scan: only a cgroup catches it.

A generation whose cgroup directory does not exist (started under proc-scan, or by a
keelway before cgroups) is looked for by the scan, whatever the box's mechanism now is,
and cgroups the home already has in other hierarchies (`legacy`) are still read and
removed, so a change of mechanism between two control planes never loses a tree.

Rules kept here:
- A tree is gone only when every process ever seen in it is dead by pid + start time
  (or reaped) and a fresh look finds no member: never assumed from the leader alone.
- keelway signals only processes it has just found to be members.
- A cgroup directory is removed only once its tree is proven gone (the kernel refuses
  otherwise); one left by a crash is found by `scan` and removed by the sweep.
`KEELWAY_PROCESS_TREE=proc-scan|cgroup-v1|cgroup-v2` forces a mechanism (tests use it
to run the fallback on a box that has cgroups).

Build steps get cgroups here too (`BuildCell`, `b<token>` beside the generations'
`g<id>`, under the same home so the apps' memory budget bounds them): the one module
that makes and reads keelway's cgroups.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import logging
import os
import secrets
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from keelway import failpoints
from keelway.clock import Clock
from keelway.limits import BUILD_PIDS, Limits, format_size
from keelway.runtime.process import ProcStat, Reapable, is_alive, read_stat, session_members

log = logging.getLogger("keelway.tree")

failpoints.declare("tree.kill.before", "tree.kill.after")

CGROUP_ROOT = Path("/sys/fs/cgroup")
FORCE_ENV = "KEELWAY_PROCESS_TREE"
SUPERVISOR_MARK = "KEELWAY_SUPERVISOR"
GENERATION_MARK = "KEELWAY_GENERATION"
_KILL_BOUND_S = 5.0
# How long a tree whose members are all dead may wait for init to reap them before its
# cgroup can go: init reaps orphans every few seconds on some boxes (a VM's minimal init).
_REAP_BOUND_S = 15.0
# A build step's cgroup is `b<token>`, beside the generations' `g<id>` (which `scan`
# and the reconciler read): never taken for a generation's.
BUILD_PREFIX = "b"


class Mechanism(enum.Enum):
    CGROUP_V1 = "cgroup v1 (pids/freezer)"
    CGROUP_V1_FREEZER = "cgroup v1 (freezer)"
    CGROUP_V2 = "cgroup v2"
    PROC_SCAN = "proc-scan"


Leader = tuple[int, int]  # pid, start ticks


def home_id(home_root: Path) -> str:
    """The name a home's cgroups live under: homes on one box never share a cgroup."""
    return hashlib.sha256(str(home_root).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ProcessTrees:
    """The process trees of one home's generations, by one mechanism.

    `homes` are the per-home cgroup directories new generations join, one per
    hierarchy, the first being the one membership is read from (v1: freezer; v2: the
    unified one); empty for proc-scan. `legacy` are the home's directories in other
    hierarchies, left by a control plane that used another mechanism: read and
    cleaned, never joined.
    """

    home_root: Path
    mechanism: Mechanism
    homes: tuple[Path, ...] = ()
    legacy: tuple[Path, ...] = ()

    @classmethod
    def choose(cls, home_root: Path, root: Path = CGROUP_ROOT) -> ProcessTrees:
        """The best mechanism this box allows (or the one FORCE_ENV names), tried by
        creating the home's cgroup directories; proc-scan when none is writable."""
        want = os.environ.get(FORCE_ENV, "auto")
        existing = cls.found(home_root, root).homes
        scan = cls(home_root, Mechanism.PROC_SCAN, (), existing)
        if want == "proc-scan":
            return scan
        hid = home_id(home_root)
        pure_v2 = (root / "cgroup.controllers").exists()
        unified = root if pure_v2 else root / "unified"
        tries: list[tuple[Mechanism, tuple[Path, ...]]] = []
        if want in ("auto", "cgroup-v2") and pure_v2:
            tries.append((Mechanism.CGROUP_V2, (unified,)))
        if want in ("auto", "cgroup-v1") and (root / "freezer" / "cgroup.procs").exists():
            if (root / "pids" / "cgroup.procs").exists():
                tries.append((Mechanism.CGROUP_V1, (root / "freezer", root / "pids")))
            tries.append((Mechanism.CGROUP_V1_FREEZER, (root / "freezer",)))
        if want in ("auto", "cgroup-v2") and not pure_v2 and (
                unified / "cgroup.procs").exists():
            tries.append((Mechanism.CGROUP_V2, (unified,)))  # a hybrid box's v2 half
        for mechanism, hierarchies in tries:
            homes = tuple(h / "keelway" / hid for h in hierarchies)
            try:
                for home in homes:
                    home.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                log.info("%s not usable here (%s)", mechanism.value, exc)
                continue
            homes += _limit_homes(mechanism, root, hid)
            chosen = cls(home_root, mechanism, homes,
                         tuple(h for h in existing if h not in homes))
            chosen.set_apps_budget(apps_budget())
            return chosen
        if want != "auto":
            log.warning("%s=%s is not available on this box; using proc-scan", FORCE_ENV,
                        want)
        return scan

    @classmethod
    def found(cls, home_root: Path, root: Path = CGROUP_ROOT) -> ProcessTrees:
        """The home's trees as a box already has them, creating nothing: every
        hierarchy holding a cgroup directory of the home (for checks and teardown)."""
        hid = home_id(home_root)
        hierarchies = (root / "freezer", root / "pids", root / "memory", root / "cpu",
                       root / "unified", root)
        homes = tuple(h / "keelway" / hid for h in hierarchies
                      if (h / "keelway" / hid).is_dir())
        v1 = bool(homes) and homes[0].parent.parent.name in ("freezer", "pids")
        mechanism = (Mechanism.PROC_SCAN if not homes else
                     Mechanism.CGROUP_V1 if v1 else Mechanism.CGROUP_V2)
        return cls(home_root, mechanism, homes)

    @property
    def uses_cgroups(self) -> bool:
        return bool(self.homes)

    def describe(self) -> str:
        """What `doctor` says: "cgroup v1 (pids/freezer)", "cgroup v2" or "proc-scan"."""
        return self.mechanism.value

    # -- a generation's cgroup -----------------------------------------------------------

    def _dirs(self, gen_id: int) -> list[Path]:
        """The generation's cgroups in the hierarchies new generations join."""
        return self._named(f"g{gen_id}")

    def _named(self, name: str) -> list[Path]:
        """The cgroup `name` of the home (a generation's `g<id>`, a build step's
        `b<token>`) in the hierarchies new ones join."""
        return [home / name for home in self.homes]

    def _all_dirs(self, gen_id: int) -> list[Path]:
        """... and in the ones an earlier control plane used: where to look and clean."""
        return [home / f"g{gen_id}" for home in self.homes + self.legacy]

    def create(self, gen_id: int, limits: Limits | None = None) -> None:
        """Make the generation's cgroups (before its spawn), with `limits` written where
        a controller enforces them (`enforces`). Idempotent."""
        self._create(f"g{gen_id}", limits)

    def _create(self, cgroup: str, limits: Limits | None,
                extra: Callable[[str], list[tuple[str, str]]] | None = None) -> None:
        """Make the home's cgroup `cgroup` in every hierarchy it joins, with `limits`
        (and `extra`'s files, by controller) where a controller enforces them."""
        for path in self._named(cgroup):
            path.mkdir(parents=True, exist_ok=True)
        if limits is None:
            return
        for home in self.homes:
            controller = _controller(home)
            files = _limit_files(controller, limits) + (extra(controller) if extra else [])
            for name, value in files:
                path = home / cgroup / name
                if not path.exists():
                    continue  # a controller this cgroup does not have: `enforces` says so
                try:
                    _write(path, value)
                except OSError as exc:
                    log.warning("cannot set %s of %s to %s: %s", name, cgroup, value, exc)

    def set_apps_budget(self, budget: int | None) -> None:
        """Bound every generation of the home together: the home's own cgroup's memory
        limit, which its children's charges count against, so all the apps at once can
        never take what the box needs for keelway, the router and the kernel."""
        if budget is None:
            return
        for home in self.homes:
            name = {"memory": "memory.limit_in_bytes", "unified": "memory.max"}.get(
                _controller(home))
            if name is not None and (home / name).exists():
                try:
                    _write(home / name, str(budget))
                except OSError as exc:
                    log.warning("cannot bound the apps' memory together at %s: %s",
                                format_size(budget), exc)

    def apps_budget(self) -> int | None:
        """The memory all the home's apps may use together, as its cgroup says."""
        for home in self.homes:
            name = {"memory": "memory.limit_in_bytes", "unified": "memory.max"}.get(
                _controller(home))
            if name is not None:
                said = _read(home / name).strip()
                if said.isdigit():
                    return int(said)
        return None

    def enforces(self) -> dict[str, str]:
        """Each limit a cgroup enforces here, with how (for `doctor` and `status`); a
        limit missing from it is left to an rlimit or to nothing (runtime.limits)."""
        found: dict[str, str] = {}
        for home in self.homes:
            controller = _controller(home)
            if controller == "unified":
                enabled = _read(home / "cgroup.subtree_control").split()
                for name in ("memory", "cpu", "pids"):
                    if name in enabled:
                        found[name] = f"cgroup v2 {name}"
            elif controller in ("memory", "cpu", "pids"):
                found[controller] = f"cgroup v1 {controller}"
        return found

    def exit_cause(self, gen_id: int) -> str | None:
        """Why the kernel ended the generation's tree, if it did: its memory limit (an
        OOM kill in its cgroup) or its process limit (a fork refused). Read before the
        cgroup is removed."""
        return self._cause(f"g{gen_id}")

    def _cause(self, cgroup: str) -> str | None:
        """`exit_cause` of the home's cgroup `cgroup`."""
        for home in self.homes:
            path = home / cgroup
            controller = _controller(home)
            if controller in ("memory", "unified"):
                events = _read(path / ("memory.oom_control" if controller == "memory"
                                       else "memory.events"))
                if _counter(events, "oom_kill") > 0:
                    limit = _read(path / ("memory.limit_in_bytes" if controller == "memory"
                                          else "memory.max")).strip()
                    at = f" at its {format_size(int(limit))} limit" if limit.isdigit() else ""
                    return f"killed: out of memory{at}"
        for home in self.homes:
            path = home / cgroup
            if _controller(home) in ("pids", "unified") and _counter(
                    _read(path / "pids.events"), "max") > 0:
                most = _read(path / "pids.max").strip()
                return f"hit its limit of {most} processes" if most.isdigit() else (
                    "hit its process limit")
        return None

    def join_paths(self, gen_id: int) -> tuple[str, ...]:
        """The `cgroup.procs` files a generation's leader writes itself into before it
        execs the app (keelway.runtime.process spawns it so); none without cgroups."""
        if not self.uses_cgroups:
            return ()
        return tuple(str(path / "cgroup.procs") for path in self._dirs(gen_id))

    def remove(self, gen_id: int, *, quiet: bool = False) -> bool:
        """Remove the generation's cgroups once its tree is gone; False while any member
        lives (the kernel refuses). A directory already gone counts as removed."""
        removed = True
        for path in self._all_dirs(gen_id):
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                if not quiet:
                    log.warning("cannot remove cgroup %s: %s", path, exc)
                removed = False
        return removed

    async def remove_reaped(self, gen_id: int, clock: Clock,
                            bound_s: float = _REAP_BOUND_S) -> bool:
        """`remove`, waiting while the only tasks left in the cgroup are zombies.

        A member that died after its parent (a process the app forked) is reparented
        to init, and stays in its cgroup, dead, until init reaps it: the kernel refuses
        the removal meanwhile. Such a tree is gone (nothing of it runs), so the wait is
        for init, bounded; a member that still runs ends the wait at once."""
        deadline = clock.monotonic() + bound_s
        while not self.remove(gen_id, quiet=True):
            if self.members(gen_id, None) or clock.monotonic() >= deadline:
                return self.remove(gen_id)  # says why in the log
            await clock.sleep(0.05)
        return True

    def forget_home(self) -> None:
        """Remove the home's own cgroup directories if no generation's is left in them
        (after `down`, so a box does not collect one empty directory per home)."""
        for home in self.homes + self.legacy:
            with contextlib.suppress(OSError):
                home.rmdir()

    def build_cell(self, memory: int) -> BuildCell:
        """A new cgroup for one build step, `memory` bytes and BUILD_PIDS processes at
        most, weighted for the CPU as a nice-10 process is (see `BuildCell`)."""
        cell = BuildCell(self, f"{BUILD_PREFIX}{secrets.token_hex(6)}")
        self._create(cell.name, Limits(memory=memory, pids=BUILD_PIDS), _build_weight)
        return cell

    def sweep_build_cells(self) -> list[str]:
        """Kill and remove every build step's cgroup of the home: at boot, before any
        build can run, a cgroup left by a control plane that died mid-build (its step,
        whose output pipe died with it, may still run); returns their names."""
        names: set[str] = set()
        for home in self.homes + self.legacy:
            with contextlib.suppress(FileNotFoundError):
                names.update(e.name for e in os.scandir(home)
                             if e.is_dir() and e.name.startswith(BUILD_PREFIX))
        for name in sorted(names):
            BuildCell(self, name).close()
        return sorted(names)

    # -- membership ----------------------------------------------------------------------

    def _cgroup_members(self, gen_id: int) -> list[ProcStat] | None:
        """Members by cgroup, or None when the generation has no cgroup directory."""
        for path in self._all_dirs(gen_id):
            try:
                raw = (path / "cgroup.procs").read_text()
            except FileNotFoundError:
                continue
            return _live(int(pid) for pid in raw.split())
        return None

    def members(self, gen_id: int, leader: Leader | None) -> list[ProcStat]:
        """The live processes of a generation's tree, its leader included."""
        found = self._cgroup_members(gen_id)
        if found is None:
            found = marked_processes(self.home_root).get(gen_id, [])
            if leader is not None:
                # An env-clearing child that stayed in its leader's session.
                found += session_members(leader[0], leader[1])
        by_pid = {m.pid: m for m in found}
        if leader is not None and leader[0] not in by_pid and is_alive(*leader):
            stat = read_stat(leader[0])
            if stat is not None:
                by_pid[stat.pid] = stat
        return list(by_pid.values())

    def usage(self, gen_id: int, leader: Leader | None) -> Usage:
        """What the generation's tree uses now (`status`): memory as its limit counts it
        (the cgroup's, page cache included), else the resident memory of its processes;
        CPU time from v2's cgroup, else what its processes and their reaped children
        used. Without a cgroup, the leader's alone (finding the rest means a scan of
        /proc per generation)."""
        memory: int | None = None
        cpu_s: float | None = None
        for home in self.homes:
            path = home / f"g{gen_id}"
            match _controller(home):
                case "memory":
                    memory = _number(_read(path / "memory.usage_in_bytes"))
                case "unified":
                    memory = _number(_read(path / "memory.current"))
                    stat = _read(path / "cpu.stat")
                    if stat:
                        cpu_s = _counter(stat, "usage_usec") / 1e6
        members = self._cgroup_members(gen_id)
        if members is None:
            members = [m for m in (read_stat(leader[0]),) if m is not None] if (
                leader is not None and is_alive(*leader)) else []
        if memory is None or cpu_s is None:
            rss, ticks = 0, 0
            for member in members:
                took = _proc_usage(member.pid)
                rss, ticks = rss + took[0], ticks + took[1]
            memory = rss if memory is None and members else memory
            cpu_s = ticks / _TICKS_PER_S if cpu_s is None and members else cpu_s
        return Usage(memory, cpu_s)

    def with_members(self, leaders: Mapping[int, Leader | None]) -> set[int]:
        """The generations of `leaders` (id: its leader, if recorded) whose tree has a
        live member, as `members` would find them, with /proc read once for all those
        without a cgroup directory rather than once each: during a rollout, a survey
        met hundreds of generations planned and not yet spawned, and read every
        process's environment for each, holding the loop for seconds.

        Where generations get cgroups, one with neither a cgroup nor a recorded leader
        was never started by this mechanism (its cgroup is made before its fork): it is
        not looked for in /proc. A tree of it that an earlier keelway started under
        proc-scan, before a crash kept its leader from the record, is still found by
        `stop`'s own look, and by `scan` once its record is gone: `members` reads /proc
        for it whatever the mechanism."""
        found: set[int] = set()
        scanned: list[tuple[int, Leader | None]] = []
        for gen_id, leader in leaders.items():
            members = self._cgroup_members(gen_id)
            if members is None:
                if leader is not None or not self.uses_cgroups:
                    scanned.append((gen_id, leader))
            elif members or (leader is not None and is_alive(*leader)):
                found.add(gen_id)
        if not scanned:
            return found
        marked = marked_processes(self.home_root)
        sessions: dict[int, list[ProcStat]] | None = None
        for gen_id, leader in scanned:
            if marked.get(gen_id):
                found.add(gen_id)
            elif leader is not None:
                if sessions is None:
                    sessions = _by_session()
                if is_alive(*leader) or any(m.start_ticks >= leader[1]
                                            for m in sessions.get(leader[0], ())):
                    found.add(gen_id)
        return found

    def scan(self) -> dict[int, list[ProcStat]]:
        """Every generation of the home that has a tree on this box (a cgroup directory,
        even an empty one, or a process carrying the marker), with its live members."""
        found: dict[int, list[ProcStat]] = {}
        for home in self.homes + self.legacy:
            with contextlib.suppress(FileNotFoundError):
                for entry in os.scandir(home):
                    name = entry.name
                    if entry.is_dir() and name[:1] == "g" and name[1:].isdigit():
                        gen_id = int(name[1:])
                        if gen_id not in found:
                            found[gen_id] = self._cgroup_members(gen_id) or []
        for gen_id, procs in marked_processes(self.home_root).items():
            known = {m.pid for m in found.setdefault(gen_id, [])}
            found[gen_id] += [p for p in procs if p.pid not in known]
        return found

    def still_there(self, gen_id: int, seen: Iterable[ProcStat]) -> bool:
        """Whether a tree `scan` found a moment ago is still there: a cgroup directory
        of it, or a process of it seen then (by pid and start time) alive now."""
        return any(d.is_dir() for d in self._all_dirs(gen_id)) or any(
            is_alive(m.pid, m.start_ticks) for m in seen)

    # -- killing -------------------------------------------------------------------------

    async def kill(self, gen_id: int, leader: Leader | None) -> list[ProcStat]:
        """SIGKILL every member with the tree held still, so that none forks a child
        that the kill misses; returns the members it signalled."""
        dirs = [d for d in self._all_dirs(gen_id) if d.is_dir()]
        primary = dirs[0] if dirs else None
        if primary is not None and (primary / "cgroup.kill").exists():
            victims = self.members(gen_id, leader)
            _write(primary / "cgroup.kill", "1")  # v2: the kernel kills forks in flight too
            return victims
        if primary is not None and (primary / "freezer.state").exists():
            async with _frozen_v1(primary):
                victims = self.members(gen_id, leader)
                _signal(victims, signal.SIGKILL)
            return victims
        if primary is not None and (primary / "cgroup.freeze").exists():
            async with _frozen_v2(primary):
                victims = self.members(gen_id, leader)
                _signal(victims, signal.SIGKILL)
            return victims
        # proc-scan (or a tree without a cgroup): stop everyone until a scan finds no
        # member still running, then kill them all. SIGKILL works on stopped processes.
        victims = []
        for _ in range(20):
            victims = self.members(gen_id, leader)
            running = [m for m in victims if m.state not in ("T", "t")]
            if not running:
                break
            _signal(running, signal.SIGSTOP)
        _signal(victims, signal.SIGKILL)
        return victims


    # -- freezing (keelway/deploy/freezing.py) ---------------------------------------

    async def freeze(self, gen_id: int, leader: Leader | None) -> bool:
        """Stop every member in place, memory kept: the cgroup freezer where there is
        one (a fork in flight is caught too), else SIGSTOP of every member until a scan
        finds none running. True once the tree is seen frozen."""
        primary = self._primary(gen_id)
        if primary is not None and (primary / "freezer.state").exists():
            state = primary / "freezer.state"
            _write(state, "FROZEN")
            await _wait_for(lambda: _read(state).strip() == "FROZEN", tries=400)
            return _read(state).strip() == "FROZEN"
        if primary is not None and (primary / "cgroup.freeze").exists():
            _write(primary / "cgroup.freeze", "1")
            await _wait_for(lambda: "frozen 1" in _read(primary / "cgroup.events"), tries=400)
            return "frozen 1" in _read(primary / "cgroup.events")
        for _ in range(20):
            running = [m for m in self.members(gen_id, leader) if m.state not in ("T", "t")]
            if not running:
                return True
            _signal(running, signal.SIGSTOP)
        return False

    def thaw(self, gen_id: int, leader: Leader | None) -> None:
        """Let a frozen tree run again (a tree not frozen is left as it is)."""
        primary = self._primary(gen_id)
        if primary is not None and (primary / "freezer.state").exists():
            _write(primary / "freezer.state", "THAWED")
        elif primary is not None and (primary / "cgroup.freeze").exists():
            _write(primary / "cgroup.freeze", "0")
        else:
            _signal(self.members(gen_id, leader), signal.SIGCONT)

    def frozen(self, gen_id: int, leader: Leader | None) -> bool:
        """Whether the tree is frozen now (by its cgroup, or every member stopped)."""
        primary = self._primary(gen_id)
        if primary is not None and (primary / "freezer.state").exists():
            return _read(primary / "freezer.state").strip() in ("FROZEN", "FREEZING")
        if primary is not None and (primary / "cgroup.freeze").exists():
            return _read(primary / "cgroup.freeze").strip() == "1"
        members = self.members(gen_id, leader)
        return bool(members) and all(m.state in ("T", "t") for m in members)

    def _primary(self, gen_id: int) -> Path | None:
        dirs = [d for d in self._all_dirs(gen_id) if d.is_dir()]
        return dirs[0] if dirs else None


@dataclass(frozen=True)
class Usage:
    """What one generation's tree uses (None: this box cannot say)."""

    memory_bytes: int | None
    cpu_s: float | None


_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _proc_usage(pid: int) -> tuple[int, int]:
    """(resident bytes, CPU ticks of it and its reaped children) of one process; zeros
    for one gone meanwhile."""
    try:
        resident = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError, ValueError):
        return 0, 0
    # After the comm: state is field 3, so utime/stime/cutime/cstime (14-17) are 11-14.
    return resident, sum(int(f) for f in fields[11:15])


def _number(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


class BuildCell:
    """The cgroup of one build step (keelway/builds/build_step.py's StepCell): under the
    home's, beside the generations', so the apps' memory budget bounds every build too,
    and its own memory and process limits bound each step.

    The step's process joins it before it runs anything of the build (`enter`: the
    step waits at a gate until then), so every process of the step is a member, a
    descendant that calls setsid() included; `close` kills what is left and removes it.
    It weighs for the CPU as a nice-10 process does (cpu.shares 110 on v1's cpu
    hierarchy, cpu.weight.nice 10 on v2): the kernel shares CPU between cgroups by
    weight first, so a nice value inside a cgroup of its own would lower nothing
    against the apps' cgroups. A crash leaves it to `sweep_build_cells`.

    Its methods block (a build step runs in a thread of its own, never on the loop)."""

    def __init__(self, trees: ProcessTrees, name: str) -> None:
        self._trees = trees
        self.name = name

    def enter(self, pid: int) -> None:
        """Move `pid` (the step, waiting at its gate) into the cgroup in every hierarchy;
        OSError when it cannot be (the step must then not run)."""
        for path in self._trees._named(self.name):
            _write(path / "cgroup.procs", str(pid))

    def cause(self) -> str | None:
        """Why the kernel ended (part of) the step, if it did: "killed: out of memory at
        its 2G limit", "hit its limit of 1024 processes". Read before `close`."""
        return self._trees._cause(self.name)

    def _dirs(self) -> list[Path]:
        return [home / self.name for home in self._trees.homes + self._trees.legacy
                if (home / self.name).is_dir()]

    def kill(self) -> None:
        """SIGKILL every member now (a descendant that left the step's process group,
        holding its output pipe, say). Members only: each pid was just read from the
        cgroup, which nothing but the step's own processes can join."""
        members: set[int] = set()
        for path in self._dirs():
            with contextlib.suppress(OSError):
                members.update(int(p) for p in (path / "cgroup.procs").read_text().split())
        _signal(_live(members), signal.SIGKILL)

    def close(self) -> bool:
        """Kill every member left and remove the cgroup; False if it could not be
        removed within the bound (logged: an empty leftover the next boot's sweep
        removes)."""
        dirs = self._dirs()
        deadline = time.monotonic() + _REAP_BOUND_S
        while True:
            self.kill()
            gone = True
            for path in dirs:
                try:
                    path.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    gone = False
            if gone:
                return True
            if time.monotonic() >= deadline:
                log.warning("cannot remove build cgroup %s: members left", self.name)
                return False
            time.sleep(0.02)


def _build_weight(controller: str) -> list[tuple[str, str]]:
    """The files that make a build's cgroup weigh as a nice-10 process (`BuildCell`)."""
    return {"cpu": [("cpu.shares", "110")],
            "unified": [("cpu.weight.nice", "10")]}.get(controller, [])


async def stop(trees: ProcessTrees, gen_id: int, leader: Leader | None, *, grace_s: float,
               clock: Clock, proc: Reapable | None = None,
               poll_s: float = 0.02) -> bool:
    """SIGTERM the whole tree, SIGKILL it after `grace_s` (at once when `grace_s` <= 0);
    True once every process ever seen in it is proven dead and no member is left.

    `proc` is the leader's asyncio process when it is our child: it must be reaped too.
    False means something survived SIGKILL for 5 s (uninterruptible sleep): the caller
    keeps its record and reports the leftover, never assumes it dead.
    """
    seen: set[Leader] = set()

    def look() -> list[ProcStat]:
        members = trees.members(gen_id, leader)
        seen.update((m.pid, m.start_ticks) for m in members)
        return members

    def proven() -> bool:
        reaped = proc is None or proc.returncode is not None
        return reaped and not look() and not any(is_alive(*p) for p in seen)

    async def wait(bound_s: float) -> bool:
        deadline = clock.monotonic() + bound_s
        while not proven():
            if clock.monotonic() >= deadline:
                return False
            await clock.sleep(poll_s)
        return True

    members = look()
    if not members and proven():
        return True
    if grace_s > 0:
        _signal(members, signal.SIGTERM)
        if await wait(grace_s):
            return True
    failpoints.hit("tree.kill.before")
    deadline = clock.monotonic() + _KILL_BOUND_S
    while True:
        seen.update((m.pid, m.start_ticks) for m in await trees.kill(gen_id, leader))
        if await wait(min(0.5, _KILL_BOUND_S)):
            failpoints.hit("tree.kill.after")
            return True
        if clock.monotonic() >= deadline:
            return False


def marked_processes(home_root: Path) -> dict[int, list[ProcStat]]:
    """Live processes whose environment says keelway at `home_root` started them, by
    generation id: the proc-scan's view of every tree of the home, session leaders and
    descendants alike."""
    want = f"{SUPERVISOR_MARK}={home_root}".encode()
    prefix = f"{GENERATION_MARK}=".encode()
    found: dict[int, list[ProcStat]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if want not in environ:
            continue
        gen = next((item[len(prefix):] for item in environ if item.startswith(prefix)), b"")
        stat = read_stat(pid)
        if gen.isdigit() and stat is not None and stat.state != "Z":
            found.setdefault(int(gen), []).append(stat)
    return found


def _limit_homes(mechanism: Mechanism, root: Path, hid: str) -> tuple[Path, ...]:
    """The home's directories in the hierarchies that enforce limits, beyond the ones
    the mechanism tracks membership by: v1's memory and cpu hierarchies where they are
    mounted and writable; v2's one hierarchy gets its controllers enabled for the
    home's children instead (what the box lets it enable). None where nothing can."""
    if mechanism is Mechanism.CGROUP_V2:
        unified = root if (root / "cgroup.controllers").exists() else root / "unified"
        for parent in (unified, unified / "keelway", unified / "keelway" / hid):
            for name in ("memory", "cpu", "pids"):
                # One at a time: a controller the box withholds must not keep the others.
                with contextlib.suppress(OSError):
                    _write(parent / "cgroup.subtree_control", f"+{name}")
        return ()
    if mechanism is Mechanism.PROC_SCAN:
        return ()
    homes: list[Path] = []
    for name in ("memory", "cpu"):
        if not (root / name / "cgroup.procs").exists():
            continue
        home = root / name / "keelway" / hid
        try:
            home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.info("cgroup v1 %s not usable here (%s)", name, exc)
            continue
        homes.append(home)
    return tuple(homes)


def apps_budget(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """What every app of a home may use together: the box's memory less what keelway,
    the router and the kernel keep (a tenth of it, and at least 512M)."""
    for line in _read(meminfo).splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) * 1024
            budget = max(total - max(total // 10, 512 << 20), 256 << 20)
            return budget - budget % 4096  # as the kernel keeps it: whole pages
    return None


def _controller(home: Path) -> str:
    """The controller a home directory's hierarchy is (v1: its mount's name), or
    `unified` for v2's one hierarchy."""
    name = home.parent.parent.name
    return name if name in ("freezer", "pids", "memory", "cpu") else "unified"


def _limit_files(controller: str, limits: Limits) -> list[tuple[str, str]]:
    """The files of `controller` that set `limits`, and what to write in them."""
    period = 100_000
    files: list[tuple[str, str]] = []
    if limits.memory is not None and controller in ("memory", "unified"):
        if controller == "memory":
            files.append(("memory.limit_in_bytes", str(limits.memory)))
            # With swap, the bound on memory and swap together (after the one above).
            files.append(("memory.memsw.limit_in_bytes", str(limits.memory)))
        else:
            files += [("memory.max", str(limits.memory)), ("memory.swap.max", "0")]
    if limits.cpu is not None and controller in ("cpu", "unified"):
        quota = max(1000, round(limits.cpu * period))
        files += ([("cpu.cfs_period_us", str(period)), ("cpu.cfs_quota_us", str(quota))]
                  if controller == "cpu" else [("cpu.max", f"{quota} {period}")])
    if limits.pids is not None and controller in ("pids", "unified"):
        files.append(("pids.max", str(limits.pids)))
    return files


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _counter(text: str, name: str) -> int:
    """The value of `name N` in a cgroup's flat keyed file (memory.events, ...)."""
    for line in text.splitlines():
        key, _sep, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return 0


def _by_session() -> dict[int, list[ProcStat]]:
    """Every live process of the box by its session id, from one read of /proc."""
    found: dict[int, list[ProcStat]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = read_stat(int(entry.name))
            if stat is not None and stat.state != "Z":
                found.setdefault(stat.session, []).append(stat)
    return found


def _live(pids: Iterable[int]) -> list[ProcStat]:
    stats = (read_stat(pid) for pid in pids)
    return [s for s in stats if s is not None and s.state != "Z"]


def _signal(members: list[ProcStat], sig: signal.Signals) -> None:
    for member in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member.pid, sig)


def _write(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


async def _wait_for(predicate: Callable[[], bool], tries: int = 100) -> None:
    """Poll briefly: a freeze takes microseconds unless a member sleeps in the kernel;
    then the kill goes ahead anyway and the caller's proof decides."""
    for _ in range(tries):
        if predicate():
            return
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def _frozen_v1(path: Path) -> AsyncIterator[None]:
    state = path / "freezer.state"
    _write(state, "FROZEN")
    await _wait_for(lambda: state.read_text().strip() == "FROZEN")
    try:
        yield
    finally:
        # A SIGKILL lands when a frozen task thaws: thaw, always.
        _write(state, "THAWED")


@contextlib.asynccontextmanager
async def _frozen_v2(path: Path) -> AsyncIterator[None]:
    _write(path / "cgroup.freeze", "1")
    await _wait_for(lambda: "frozen 1" in (path / "cgroup.events").read_text())
    try:
        yield
    finally:
        _write(path / "cgroup.freeze", "0")
