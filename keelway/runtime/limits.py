"""How each limit of keelway/limits.py is enforced on this box: the one rule.

- memory, cpu: by the generation's cgroup (v1's memory and cpu hierarchies, or v2's
  memory and cpu controllers: runtime.tree `enforces`), or not at all: an rlimit on
  address space breaks runtimes that reserve more than they use, and there is no rlimit
  on CPU time per second. `doctor` says so.
- pids: by the cgroup's pids controller; where there is none, by RLIMIT_NPROC, which
  counts the processes of a uid, so only when each instance runs as a uid of its own
  (runtime.identities): shared by every tenant (or by keelway itself), it would let one
  tenant starve the others of their budget, or stop keelway forking.
- nofile: RLIMIT_NOFILE in every tenant process (a per-process limit anyway).
- the OOM score: every tenant process at TENANT_OOM_SCORE, the control plane and the
  router (which inherit the control plane's) at KEELWAY_OOM_SCORE, so the kernel, out of
  memory, kills an app and never keelway.
- a build's memory: by each build step's cgroup (runtime.tree's BuildCell) where there
  is a memory controller, else not at all (no RLIMIT_AS, for the reason above: Go and
  Node reserve far more address space than they use); its time and its disk by the
  build step's guard (keelway/builds/build_step.py), on every box.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from keelway.limits import KEELWAY_OOM_SCORE, TENANT_OOM_SCORE, BuildLimits, Limits
from keelway.runtime.process import Bounds

__all__ = ["KEELWAY_OOM_SCORE", "TENANT_OOM_SCORE", "build_in_force", "in_force",
           "protect_keelway", "tenant_bounds"]


def tenant_bounds(limits: Limits, enforced: Mapping[str, str], own_uids: bool) -> Bounds:
    """What a tenant's process takes on before it execs, beside its cgroup."""
    return Bounds(nofile=limits.nofile,
                  nproc=limits.pids if "pids" not in enforced and own_uids else None,
                  oom_score_adj=TENANT_OOM_SCORE)


def in_force(limits: Limits, enforced: Mapping[str, str],
             own_uids: bool) -> dict[str, dict[str, str | None]]:
    """Each limit, its value and how this box enforces it (None: it cannot), for
    `status` and `doctor`."""
    said = limits.describe()
    how: dict[str, str | None] = {
        "memory": enforced.get("memory"),
        "cpu": enforced.get("cpu"),
        "pids": enforced.get("pids") or ("rlimit NPROC (per instance uid)" if own_uids
                                         else None),
        "nofile": "rlimit NOFILE",
    }
    return {name: {"value": said[name], "enforced_by": how[name]} for name in said}


def build_in_force(limits: BuildLimits,
                   enforced: Mapping[str, str]) -> dict[str, dict[str, str | None]]:
    """Each build limit, its value and how this box enforces it (None: it cannot)."""
    said = limits.describe()
    how: dict[str, str | None] = {
        "memory": (f"{enforced['memory']}, a cgroup per build step" if "memory" in enforced
                   else None),
        "timeout": "keelway, which kills the build step",
        "disk": "keelway, which measures the build's tree while it runs",
    }
    return {name: {"value": said[name], "enforced_by": how[name]} for name in said}


def protect_keelway() -> bool:
    """Lower this process's OOM score (the control plane's, which the router it starts
    inherits) so the kernel picks an app first; False where it may not (not root)."""
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.write(fd, str(KEELWAY_OOM_SCORE).encode())
    except OSError:
        return False  # lowering it takes CAP_SYS_RESOURCE
    finally:
        os.close(fd)
    return True
