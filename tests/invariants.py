"""SPEC §5, checked against a real home: the store, /proc, and the router's own table."""

from __future__ import annotations

import os
import time
from pathlib import Path

from keelway.builds.manifest import Mode, load_manifest
from keelway.home import Home
from keelway.reconcile.plan import leftovers
from keelway.router.client import get_table_sync, ping_sync
from keelway.runtime import process
from keelway.runtime.identities import Identities
from keelway.runtime.tree import ProcessTrees
from keelway.store import SqliteStore
from keelway.store.lifecycle import GenState, InstanceState, RouteState


def violations(home: Path) -> list[str]:
    """Every broken invariant, as sentences; [] when all hold."""
    found: list[str] = []
    # Scanned before the records are read: a generation's row is written before its
    # cgroup or process exists, so one spawned meanwhile is never taken for a stray.
    trees = ProcessTrees.found(home).scan()
    store = SqliteStore(home / "keelway.db")
    try:
        live = store.generations.live_generations()
        by_id = {g.id: g for g in live}
        presences = store.local.presences(by_id)
        alive = {g.id for g in live if (leader := presences[g.id].leader)
                 and process.is_alive(*leader)}

        # 5. No process keelway started is alive unless a record names it: every
        # process of the home's trees (its cgroups, and /proc scanned for the home's
        # marker: descendants and setsid()ed daemons too) belongs to a live generation.
        for gen_id, members in trees.items():
            if gen_id in by_id:
                continue
            if members:
                pids = ", ".join(str(m.pid) for m in members)
                found.append(f"process {pids} of generation {gen_id} is alive but no live "
                             "record names it")
            else:
                found.append(f"the cgroup of generation {gen_id} is left behind, its "
                             "generation gone")
        # A record that is not gone must not name a dead process for long (boot converges).
        for gen in live:
            if gen.id not in alive:
                found.append(f"generation {gen.id} is recorded {gen.state.value} but its "
                             "process is dead")

        for inst in store.instances.list_instances():
            active = {a.service: a.generation_id for a in store.generations.list_active(inst.host)}
            # 1. A hold-mode service never has two generations alive at once.
            for service in {g.service for g in live if g.instance == inst.host}:
                gens = [g for g in live if g.instance == inst.host and g.service == service
                        and g.id in alive]
                build = store.generations.get_generation(gens[0].id) if gens else None
                if build is None:
                    continue
                builds = {b.digest: b for b in store.builds.list_builds(inst.app)}
                path = builds.get(build.build_digest)
                spec = (load_manifest(Path(path.path)).services.get(service)
                        if path is not None else None)
                if spec is not None and spec.mode is Mode.HOLD and len(gens) > 1:
                    found.append(f"{inst.host} {service}: {len(gens)} hold-mode generations "
                                 "alive at once")
            # 2. Traffic goes only to the generation ACTIVE names (or is held/gated).
            route = store.routes.get_route(inst.host)
            if (route is not None and route.state is RouteState.SERVING
                    and route.generation_id != active.get("web")):
                found.append(f"{inst.host}: the route names generation "
                             f"{route.generation_id}, ACTIVE names {active.get('web')}")
            # An instance that is not RUNNING (stopped, down) runs nothing and takes no
            # traffic: ACTIVE names what a start respawns, nothing more.
            if inst.state is not InstanceState.RUNNING:
                running = [g.id for g in live if g.instance == inst.host and g.id in alive]
                if running:
                    found.append(f"{inst.host} is {inst.state} but generations {running} "
                                 "are alive")
                if route is not None and route.state is RouteState.SERVING:
                    found.append(f"{inst.host} is {inst.state} but its route serves")
            # 4. The latest operation is terminal, or the instance is failed closed with
            # its leftover visible.
            latest = store.ops.latest_operation(inst.host)
            if latest is not None and not latest.terminal:
                stuck = leftovers(latest, set(active.values()), False)
                if not (stuck and latest.warnings):
                    found.append(f"{inst.host}: op {latest.id} ({latest.kind}) is not "
                                 "terminal and nothing is failed closed")
        # A uid per instance (keelway/identity.py), where keelway runs as root: what
        # keelway made for an instance that runs is the instance's own. (One that does not
        # run gets its files handed over before anything of it runs again.)
        identities = Identities(store, Home(home))
        for inst in store.instances.list_instances():
            if any(g.instance == inst.host and g.id in alive for g in live):
                found += [f"{inst.host}: {why}"
                          for why in identities.files_not_owned(inst.app, inst.host)]
        # 4, for one-off runs, which are never the latest: a run's terminal is gone with
        # the control plane that attended it, so none is unfinished once one booted.
        for run in store.ops.unfinished_runs():
            found.append(f"{run.instance}: run op {run.id} is not terminal after a boot")
        # 2, as the router sees it: every served upstream is an ACTIVE web's port.
        try:
            table = get_table_sync(home / "router" / "control.sock", timeout_s=5)
        except Exception as exc:
            found.append(f"the router did not answer: {exc}")
        else:
            for host, entry in table.routes.items():
                if entry.state.value != "serving":
                    continue
                # An alias serves its instance: its row names the instance it mirrors.
                row = store.routes.get_route(host)
                web = store.generations.get_active(row.instance if row is not None else host, "web")
                web_gen = store.generations.get_generation(web.generation_id) if web else None
                if web_gen is None or web_gen.state is GenState.GONE or (
                        entry.upstream != f"127.0.0.1:{store.local.presence(web_gen.id).port}"):
                    found.append(f"the router sends {host} to {entry.upstream}, which is not "
                                 "its ACTIVE web generation")
    finally:
        store.close()
    found += router_violations(home)
    found += descriptor_violations(home, trees)
    return found


def keelway_processes(home: Path) -> set[int]:
    """The control plane (the lock file's pid, its environment naming this home) and every
    process of the home's routers' sessions (main processes and their workers)."""
    found: set[int] = set()
    try:
        daemon = int((home / "keelway.lock").read_text().strip())
        if f"KEELWAY_HOME={home}".encode() in Path(
                f"/proc/{daemon}/environ").read_bytes().split(b"\0"):
            found.add(daemon)
    except (OSError, ValueError):
        pass
    for router in router_processes(home):
        stat = process.read_stat(router)
        if stat is not None:
            found |= {m.pid for m in process.session_members(stat.session, 0)}
    return found


def descriptors(pid: int) -> dict[int, str]:
    """What each open descriptor of `pid` points at (`socket:[INODE]`, a path, ...)."""
    found: dict[int, str] = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for name in names:
        try:
            found[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue  # closed meanwhile
    return found


def keelway_descriptors(home: Path) -> set[str]:
    """What only keelway itself may hold: every socket its control plane and routers hold
    (the router's listening socket, the API, run and control sockets, connections), the
    store with its side files, and the home's lock."""
    own = {str(home / name) for name in (
        "keelway.db", "keelway.db-wal", "keelway.db-shm", "keelway.lock")}
    for pid in keelway_processes(home):
        own |= {t for t in descriptors(pid).values() if t.startswith("socket:")}
    return own


def descriptor_violations(home: Path, trees: dict[int, list[process.ProcStat]] | None = None,
                          ) -> list[str]:
    """No live process of an instance holds a descriptor of keelway's own."""
    own = keelway_descriptors(home)
    if trees is None:
        trees = ProcessTrees.found(home).scan()
    found: list[str] = []
    for gen_id, members in trees.items():
        for member in members:
            leaked = sorted(f"{fd} -> {target}" for fd, target in
                            descriptors(member.pid).items() if target in own)
            if leaked:
                found.append(f"process {member.pid} of generation {gen_id} holds keelway's "
                             f"own descriptors: {', '.join(leaked)}")
    return found


def router_processes(home: Path) -> set[int]:
    """Main router processes (not workers) whose control socket is this home's."""
    control = str(home / "router" / "control.sock").encode()
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"keelway.router" in argv and control in argv:
            stat = process.read_stat(int(entry.name))
            if stat is not None and stat.state != "Z":
                found.add(int(entry.name))
    return found


def router_violations(home: Path, drain_s: float = 15.0) -> list[str]:
    """One router serves the home and its records name it. A router it replaced may
    still be draining: it has `drain_s` to finish and exit."""
    pidfile = home / "router" / "router.pid"
    try:
        pid, ticks = (int(x) for x in pidfile.read_text().split())
    except (OSError, ValueError):
        return ["no router pidfile"]
    if not process.is_alive(pid, ticks):
        return [f"the pidfile names router {pid}, which is not alive"]
    try:
        answering = ping_sync(home / "router" / "control.sock", timeout_s=5)
    except Exception as exc:
        return [f"the router did not answer a ping: {exc}"]
    if answering != pid:
        return [f"router {answering} answers, but the pidfile names {pid}"]
    deadline = time.monotonic() + drain_s
    while (others := router_processes(home) - {pid}) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [f"router {other} is still alive beside {pid}" for other in sorted(others)]
