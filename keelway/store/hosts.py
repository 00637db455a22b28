"""The one rule of hosts, and the mirror of alias routes; functions over the caller's
connection, so that every write that gives a host a meaning (in any part of the store)
checks the rule inside its own transaction.

The rule (`claim_of`): a host names exactly one thing, either one instance (its primary
host) or one alias of one instance. `add_instances`, `add_aliases` and the instances'
`ensure_instance` (which a deploy uses) check it, so two writers can never give one host
two meanings.

An alias's route row mirrors its instance's primary row (state, port, generation):
`mirror_aliases` is called by every write of an instance's route inside that write's
transaction, so the router never serves an alias differently from its instance.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from keelway.store.errors import Conflict


class HostTaken(Conflict):
    """A host already names an instance or an alias: it cannot name another thing."""

    def __init__(self, host: str, claim: Claim) -> None:
        super().__init__(f"{host} is already {claim.describe()}")
        self.host = host
        self.claim = claim


@dataclass(frozen=True)
class Claim:
    """What a host names now: an instance of `app` (alias False) or an alias of
    `instance`."""

    instance: str
    app: str
    alias: bool

    def describe(self) -> str:
        if self.alias:
            return f"an alias of {self.instance} (app {self.app})"
        return f"an instance of app {self.app}"


def claim_of(c: sqlite3.Connection, host: str) -> Claim | None:
    """The rule: what `host` names, read inside the caller's transaction."""
    row = c.execute("SELECT app FROM instances WHERE host=?", (host,)).fetchone()
    if row is not None:
        return Claim(host, str(row[0]), alias=False)
    row = c.execute("SELECT a.instance, i.app FROM aliases a JOIN instances i"
                    " ON i.host = a.instance WHERE a.host=?", (host,)).fetchone()
    if row is not None:
        return Claim(str(row[0]), str(row[1]), alias=True)
    return None


def refuse_claimed(c: sqlite3.Connection, host: str, app: str) -> None:
    """For `ensure_instance`: `host` may be new or already an instance of `app`."""
    claim = claim_of(c, host)
    if claim is not None and (claim.alias or claim.app != app):
        raise HostTaken(host, claim)


def mirror_aliases(c: sqlite3.Connection, instance: str) -> None:
    """Make every alias route of `instance` say what its primary route says, inside the
    caller's transaction (the write of the primary row); with no primary row, the
    aliases have none either."""
    primary = c.execute("SELECT state, port, generation_id FROM routes WHERE host=?",
                        (instance,)).fetchone()
    if primary is None:
        c.execute("DELETE FROM routes WHERE host IN (SELECT host FROM aliases"
                  " WHERE instance=?)", (instance,))
        return
    c.execute(
        "INSERT INTO routes(host, instance, state, port, generation_id)"
        " SELECT a.host, a.instance, ?, ?, ? FROM aliases a WHERE a.instance=?"
        " ON CONFLICT(host) DO UPDATE SET state=excluded.state, port=excluded.port,"
        " generation_id=excluded.generation_id, version=routes.version+1"
        " WHERE routes.state IS NOT excluded.state OR routes.port IS NOT excluded.port"
        " OR routes.generation_id IS NOT excluded.generation_id",
        (primary[0], primary[1], primary[2], instance))
