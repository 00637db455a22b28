"""keelway: a self-hosted application platform that survives a crash of its control plane.

Layering (imports only point down this list; checked by tests/test_layering.py):

    cli            talks to the API over the unix socket with the stdlib only
    api            the control plane: aiohttp JSON API, wiring of everything below
    activator      the idle sweep that parks instances (scale to zero)
    deploy         operations on instances (journaled), built on runtime + store
    data           instance databases' files: a seed's verified copy, the database an
                   import lays down with its marker, the env names an import writes
    reconcile      plan(records, observed) -> actions, and the executor of a plan
    runtime        spawn / reap / stop / kill of generations and of the router (one spawn
                   path, runtime.process), the supervision of both, ports, logs
    router         the data plane; its own process, fed route tables over a socket
    builds         staging, manifests, build commands, gc
    store          the Store protocol (one transaction per intent) and its SQLite store
    durable, failpoints, clock, home, names, journal, run_wire, identity, app_path,
    home_checks, metrics, admin_access
                   leaf modules with no keelway imports (names: the rule of every name a
                   user gives; journal: the kinds of operations and steps, causes and
                   inhibitions that deploy, reconcile and the store all speak; run_wire:
                   what `keelway run` and the daemon say over the run socket; identity:
                   the uid and group each tenant runs as; app_path: the PATH of every
                   process of an app; home_checks: the doctor's checks of the box alone,
                   which the CLI runs while the control plane is down; metrics: the
                   Prometheus series, built from plain figures; admin_access: who may
                   read the admin listener)

The router never imports the store, the deployer or the API: traffic must not depend
on anything the control plane owns.
"""

__version__ = "0.1.0"
