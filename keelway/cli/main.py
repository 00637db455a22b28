"""The `keelway` command. Every command has --json; errors say what to do next.

Only click and the stdlib are imported at start; the daemon (aiohttp, uvloop) runs as
its own process, started by `up`, and rich loads only when a table is drawn. The
commands live in `lifecycle`, `operations`, `reading`, `apps`, `instances`, `domains`
and the rest; importing them registers them on the group.
"""

from __future__ import annotations

from keelway.cli import (
    apps,
    certs,
    data,
    doctor,
    domains,
    examples,
    instances,
    jobs,
    lifecycle,
    operations,
    parking,
    reading,
    replicas,
    rollouts,
    run,
    seed,
    service,
)
from keelway.cli.base import cli

__all__ = ["apps", "certs", "cli", "data", "doctor", "domains", "instances", "jobs",
           "lifecycle", "main", "operations", "parking", "reading", "replicas", "rollouts",
           "run", "seed", "service"]

# Once every command is registered: each one's example, and --json at every level.
examples.finish(cli)


def main() -> None:
    cli(prog_name="keelway")


if __name__ == "__main__":
    main()
