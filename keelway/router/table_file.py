"""The router's route table on disk: the last table it accepted, so that a restarted
router serves what it served before, with no control plane running.

Invariant: the file holds a complete, valid table or does not exist. A file written by an
older keelway may hold an entry today's rules refuse: that entry is left out at load (and
logged), never the whole table, so a router restart keeps every other app served. It is written with
`durable.write_atomic` (temp -> rename) before the table is swapped in, and temp
leftovers of a crash are swept at load. It is not fsynced: a crash of any process keeps
the new file whole, and after a power loss (which may leave the old one, or one that
does not load: the router then starts with no routes) every app is started again by the
control plane's boot, which publishes its table before anything serves. The fsyncs were
two of a wake's few milliseconds.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Final

import msgspec

from keelway.durable import sweep_temp, write_atomic
from keelway.router.route_table import RouteTable, accept, decode_offer, encode_table

log: Final = logging.getLogger("keelway.router")


class TableFileError(Exception):
    """The table file exists but cannot be read or trusted (operator's to repair)."""


def load_table(path: Path) -> RouteTable | None:
    """The table saved at `path`, or None when there is none yet.

    Raises TableFileError when the file is unreadable or invalid; the file is left as is.
    """
    sweep_temp(path.parent)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TableFileError(f"read route table {path}: {exc.strerror}") from exc
    try:
        offer = decode_offer(data)
    except msgspec.DecodeError as exc:
        raise TableFileError(f"decode route table {path}: {exc}") from exc
    table, refused = accept(offer)
    for host, why in refused.items():
        log.warning("route table %s: left out the route for %r: %s", path, host, why)
    return table


def save_table(path: Path, table: RouteTable) -> None:
    """Replace the saved table; after return a crash of any process keeps `table` (see
    the module header for a power loss).

    A crash before return leaves the previous table (or none). Raises OSError.
    """
    write_atomic(path, encode_table(table), mode=0o600, sync=False)
