"""keelway's router: the HTTP data plane, a process of its own.

Modules, each importing only those listed below it:

    server       the process: arguments, listener, signals, drain; wires the rest
    waker        asks the control plane to wake parked hosts, one request at a time each
    handshakes   the HTTPS accept path: reads each ClientHello, then hands the connection
                 over to TLS with the context chosen for it
    on_demand    asks the control plane for a served name's certificate, once per name
    api_socket   the one raw HTTP/1.1 POST to the control plane's API socket
    tls          which context a handshake gets, from the store of certificates
    tickets      the router's one session ticket key, shared by its processes
    client_hello SNI and ALPN of a ClientHello                          (pure)
    control      control server: validate -> persist -> swap -> reply
    client       control client (asyncio and blocking) for the control plane and CLI
    control_wire the control protocol's messages
    table_file   the last accepted table on disk
    proxy        shared per-process state: live routing, upstream pools, connections
    concurrency  the per-instance bound on requests in flight, in one process
    downstream   client connections: parse, route, order answers   (hot path)
    exchange     one request/response: links the two halves         (hot path)
    upstream     upstream connections and keep-alive pools          (hot path)
    responses    the router's own answers, pre-rendered
    access_log   per instance, a line per answer, written in batches off the hot path
    headers      head rewriting: hop-by-hop, X-Forwarded-*, framing (pure)
    route_table  the table, its wire format and host matching       (pure)
    counts       responses per instance, as reported and summed     (pure)
    leases       the bounds on requests in flight, lent to workers  (pure)

The router imports nothing from the control plane (store, deploy, api): traffic keeps
flowing when the control plane is gone. Its one call the other way, a wake, is a raw
HTTP/1.1 request on the control plane's API socket (waker).

The hot path (headers, exchange, upstream, downstream) is compiled to C by mypyc when
the package is installed (setup.py), and the compiled modules are used when all of them
are at least as new as their sources; otherwise, or with KEELWAY_PURE_PYTHON=1, all
four load from source. Never a mix: compiled modules reach into each other's objects
directly, so one compiled module beside a source one would misread it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

HOT_PATH = ("headers", "exchange", "upstream", "downstream")
_HERE = Path(__file__).resolve().parent
_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
# A wheel install writes sources and libraries in no set order; an edit made after a
# build is older than this only if it came within seconds of it.
_STALE_AFTER_S = 2.0


def _compiled_is_current(here: Path) -> bool:
    """Whether every hot module has a compiled library no older than its source."""
    if not (here / f"native__mypyc{_SUFFIX}").exists():
        return False
    for name in HOT_PATH:
        library = here / f"{name}{_SUFFIX}"
        if not library.exists():
            return False
        if (here / f"{name}.py").stat().st_mtime > library.stat().st_mtime + _STALE_AFTER_S:
            return False
    return True


class _FromSource:
    """A meta-path finder that loads the hot modules from their .py files."""

    @staticmethod
    def find_spec(
        name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, module = name.rpartition(".")
        if package != __name__ or module not in HOT_PATH:
            return None
        return importlib.util.spec_from_file_location(name, _HERE / f"{module}.py")


NATIVE = os.environ.get("KEELWAY_PURE_PYTHON") != "1" and _compiled_is_current(_HERE)
if not NATIVE:
    sys.meta_path.insert(0, _FromSource())
